"""Replays: a planned infer request sent again on its connection, byte for byte but for its
binary tensor bytes (perf_analyzer's loop, a tritonclient loop, a camera client), answered as
it is read, without parsing it again at any level (`docs/decisions/030-responses-and-plans.md`).

The HTTP layer (`_Connection.data_received`) hands a read over only when it is the whole of
such a request and the connection has nothing else in hand; everything the usual path would
work out again from the same bytes on the same connection came to the same answer then (the
route, the peer and browser checks, the head's bounds, the body's size and encoding, the
request's header and its plan), so what is left is what can change between requests, and the
replay does it as the usual path does: the body charged to the budget and copied into its
aligned buffer, the plan still the one for the model version served, admission (a shadow's
tap, the response cache), the run with its slot, lease and statistics, the answer, any
failure answered as the usual path answers it. A model whose rows are cheap is run at once,
only where it would run on the event loop right away anyway (an idle instance, the model
loaded; else the read is declined, and parsed and handled as any other); any other model's
repeat is run as the usual path runs it, once the turn's other reads are in: alone on the
loop if it is quick, else by the workers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from edged.api.http.budget import BodyBudget, Charge, copy_body
from edged.api.http.messages import Request, Response
from edged.api.plans import Plan
from edged.inference.scheduler import Pending, Scheduler

Failed = Callable[[Request, Exception], Response]


class PlanReplay:
    """What a planned request leaves on itself (`Request.replay`) for its repeats."""

    def __init__(self, request: Request, plan: Plan, name: str, version: int | None,
                 json_length: int | None, length: int, *, scheduler: Scheduler,
                 bodies: BodyBudget, failed: Failed, handling: Callable[[], int]) -> None:
        self.request = request
        self.plan = plan
        self.name, self.version = name, version
        self.json_length = json_length
        self.length = length  # of the body
        self.tail = length - (json_length or length)  # the tensor bytes
        self.scheduler = scheduler
        self.bodies = bodies
        self.failed = failed
        self.handling = handling

    def __call__(self, data: bytes) -> Response | Awaitable[Response] | None:
        """A model whose rows are cheap runs the repeat here and now, where the batcher
        would run it on the loop right away anyway (else it is declined: nothing done); any
        other model's is answered later (`_later`)."""
        plan, scheduler, name, version = self.plan, self.scheduler, self.name, self.version
        batcher = scheduler.batcher(name, version)
        if batcher is None or batcher.model is not plan.checked.model:
            return None
        if not (batcher.quick and batcher.cheap):
            return self._queued(data)
        # Run here and answered within this call: the body's bytes are held of the budget
        # until then, as a Charge would hold them, with no Charge to make.
        budget, length = self.bodies, self.length
        try:
            budget.take(length)
        except Exception as exc:  # answered as the usual path answers it
            return self.failed(self.request, exc)
        try:
            body = copy_body(data, length, self.json_length)
            # Scheduler.run_now's call, on the batcher in hand (found just above).
            future = batcher.run_now(plan.inputs(body), plan.priority, plan.timeout_s,
                                     plan.checked, plan.cached,
                                     scheduler.taps.get(name) if version is None else None)
            if future is None:
                return None
            plan.replays += 1
            return self._answer(future, batcher.serving_version)
        except Exception as exc:  # answered as the usual path answers it
            return self.failed(self.request, exc)
        finally:
            budget.give(length)

    def _queued(self, data: bytes) -> Response | Awaitable[Response]:
        """A model whose rows are not cheap: its body charged and copied now, run later."""
        charge: Charge | None = self.bodies.charge()
        try:
            assert charge is not None
            charge.add(self.length)
            body = copy_body(data, self.length, self.json_length)
            later = self._later(charge, body)
            charge = None  # released by _later
            return later
        except Exception as exc:  # answered as the usual path answers it
            return self.failed(self.request, exc)
        finally:
            if charge is not None:
                charge.release()

    async def _later(self, charge: Charge, body: memoryview) -> Response:
        """As the usual path runs a request for a model whose rows are not cheap: after the
        rest of this turn of the loop has been read, alone (no other request being handled)
        a quick model runs here; else the workers run it, batched with what is queued."""
        plan, scheduler, name, version = self.plan, self.scheduler, self.name, self.version
        future: Pending | None = None
        try:
            await asyncio.sleep(0)  # the turn's other reads are handled (counted) first
            inputs = plan.inputs(body)
            future = None
            batcher = scheduler.batcher(name, version)
            if self.handling() == 1 and batcher is not None and batcher.quick:
                future = scheduler.run_now(name, inputs, version=version,
                                           priority=plan.priority, timeout_s=plan.timeout_s,
                                           checked=plan.checked, cached=plan.cached)
            if future is None:
                admitted = scheduler.admit(name, inputs, version=version,
                                           priority=plan.priority, timeout_s=plan.timeout_s,
                                           checked=plan.checked, cached=plan.cached)
                future = admitted.future
                if not future.done():  # a response cache hit is done
                    scheduler.queue(admitted)
                    await asyncio.wrap_future(future)
            plan.replays += 1
            return self._answer(future, scheduler.cache.default_version(name))
        except Exception as exc:  # answered as the usual path answers it
            return self.failed(self.request, exc)
        finally:
            # Cancelled before its batch ran (a shutdown whose drain timed out): the batch
            # still views the body, so its charge goes back when the batch ends (as kserve's).
            if future is not None and not future.done():
                future.add_done_callback(lambda _: charge.release())
            else:
                charge.release()

    def _answer(self, future: Pending, default_version: int) -> Response:
        outputs = future.result()  # done: raises what the run raised
        served = future.version
        return self.plan.answer(self.name, served if served is not None else default_version,
                                outputs)
