"""Replays: a planned infer request sent again on its connection, byte for byte but for its
binary tensor bytes (perf_analyzer's loop, a tritonclient loop, a camera client), answered as
it is read, without parsing it again at any level (`docs/decisions/0038-responses-and-plans.md`).

The HTTP layer (`_Connection.data_received`) hands a read over only when it is the whole of
such a request and the connection has nothing else in hand; everything the usual path would
work out again from the same bytes on the same connection came to the same answer then (the
route, the peer and browser checks, the head's bounds, the body's size and encoding, the
request's header and its plan), so what is left is what can change between requests, and the
replay does it as the usual path does: the body charged to the budget and copied into its
aligned buffer, the plan still the one for the model version served, admission (a shadow's
tap, the response cache), the run with its slot, lease and statistics, the answer, any
failure answered as the usual path answers it. A replay runs only what would run right away
on the event loop anyway (a model whose rows are cheap, an idle instance, the model loaded);
anything else is declined and the read parsed and handled as any other."""

from __future__ import annotations

from collections.abc import Callable

from edged.api.http.budget import BodyBudget, copy_body
from edged.api.http.messages import Request, Response
from edged.api.plans import Plan
from edged.inference.scheduler import Scheduler

Failed = Callable[[Request, Exception], Response]


class PlanReplay:
    """What a planned request leaves on itself (`Request.replay`) for its repeats."""

    def __init__(self, request: Request, plan: Plan, name: str, version: int | None,
                 json_length: int | None, length: int, *, scheduler: Scheduler,
                 bodies: BodyBudget, failed: Failed) -> None:
        self.request = request
        self.plan = plan
        self.name, self.version = name, version
        self.json_length = json_length
        self.length = length  # of the body
        self.tail = length - (json_length or length)  # the tensor bytes
        self.scheduler = scheduler
        self.bodies = bodies
        self.failed = failed

    def __call__(self, data: bytes) -> Response | None:
        plan, scheduler, name, version = self.plan, self.scheduler, self.name, self.version
        batcher = scheduler.batcher(name, version)
        if batcher is None or batcher.model is not plan.checked.model \
                or not (batcher.quick and batcher.cheap):
            return None
        charge = self.bodies.charge()
        try:
            charge.add(self.length)
            body = copy_body(data, self.length, self.json_length)
            future = scheduler.run_now(name, plan.inputs(body), version=version,
                                       priority=plan.priority, timeout_s=plan.timeout_s,
                                       checked=plan.checked, cached=plan.cached)
            if future is None:
                return None
            plan.replays += 1
            outputs = future.result()  # done: raises what the run raised
            served = future.version
            return plan.answer(name, served if served is not None else
                               batcher.serving_version, outputs)
        except Exception as exc:  # answered as the usual path answers it
            return self.failed(self.request, exc)
        finally:
            charge.release()
