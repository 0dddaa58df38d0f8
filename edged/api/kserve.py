"""The KServe v2 inference protocol's model handlers (Triton's flavour): model metadata, ready,
configuration and statistics, the model repository's index, load and unload, and inference
itself, with binary tensors and system shared memory. The HTTP transport and the server-wide
routes are `edged.api.server`'s; these handlers only read a `Request` and answer a `Response`.

Handlers do not block the loop: inference goes through `Scheduler.submit` (its future wrapped
with `asyncio.wrap_future`); anything that reads model files or loads a model runs on a thread.
The one exception is a request that is alone (the only one being handled, none other parsed in
the same turn of the loop: `HttpServer.handling`) for a loaded, idle model whose batches take
under `batcher.INLINE_MAX_NS`: it runs on the loop, skipping two thread hops."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from edged.api import describe
from edged.api.config import ApiConfig
from edged.api.http.bodies import json_body
from edged.api.http.budget import JSON_WEIGHT, BodyBudget, Charge, encoded, read_body
from edged.api.http.messages import Handler, Request, Response, json_response
from edged.api.plans import MAX_HEADER_BYTES, Plan, PlanTable, infer_answer
from edged.api.protocol import HEADER_LENGTH, InferRequest, decode_request, encode_response
from edged.api.rawbinary import copies_body, decode_raw
from edged.api.replays import Failed, PlanReplay
from edged.api.shm import Lease, ShmRegistry
from edged.api.shm_routes import Asker
from edged.api.turns import Turns
from edged.core.errors import EdgedError, InvalidInput, ModelNotFound
from edged.core.numbers import ascii_int
from edged.core.states import ModelState
from edged.inference.cache import ModelCache
from edged.inference.instances import instance_count
from edged.inference.loadspec import options_for
from edged.inference.scheduler import Admitted, Outputs, Scheduler
from edged.model.repository import ModelVersion

DECODE_ON_THREAD_BYTES = 256 * 1024
MAX_VERSION_DIGITS = 9


class KServeRoutes:
    """The model routes of the socket API. `handling` tells how many requests the HTTP layer
    is handling now (a lone request for a quick model runs on the loop)."""

    def __init__(self, config: ApiConfig, *, scheduler: Scheduler, cache: ModelCache,
                 shm: ShmRegistry, bodies: BodyBudget, handling: Callable[[], int],
                 failed: Failed) -> None:
        """`failed`: the error answer to a request that failed (a replayed one's too)."""
        self.config = config
        self.scheduler = scheduler
        self.cache = cache
        self.shm = shm
        self.bodies = bodies
        self.handling = handling
        self.failed = failed
        self.turns = Turns(scheduler)
        self.plans = PlanTable()
        # The shortcuts on (api.shortcuts): a replay is left on a planned request only.
        self.planning = "plans" in config.shortcuts
        self.replaying = self.planning and "replays" in config.shortcuts

    def routes(self) -> list[tuple[str, str, Handler]]:
        model = "/v2/models/{model}"
        versioned = "/v2/models/{model}/versions/{version}"
        return [
            # The hot path first: dynamic routes are tried in order.
            ("POST", model + "/infer", self.infer),
            ("POST", versioned + "/infer", self.infer),
            # Before /v2/models/{model}: "stats" is not a model name here.
            ("GET", "/v2/models/stats", self.statistics),
            ("GET", model + "/stats", self.statistics),
            ("GET", versioned + "/stats", self.statistics),
            *(route for base in (model, versioned) for route in (
                ("GET", base, self.model_metadata),
                ("GET", base + "/ready", self.model_ready),
                ("GET", base + "/config", self.model_config),
            )),
            ("POST", "/v2/repository/index", self.repository_index),
            ("POST", "/v2/repository/models/{model}/load", self.load),
            ("POST", "/v2/repository/models/{model}/unload", self.unload),
        ]

    # -- models ------------------------------------------------------------------------------
    async def model_metadata(self, request: Request) -> Response:
        name, version = _model_ref(request)

        def read() -> dict[str, Any]:
            model = self.cache.describe(name, version)
            versions = self.cache.repository.served_versions(name)
            return describe.model_metadata(model, versions)

        return json_response(await asyncio.to_thread(read))

    async def statistics(self, request: Request) -> Response:
        """Triton's statistics extension: every served version of every model, of one model,
        or one version (404 for a model or version that is not served)."""
        name = request.match_info.get("model")
        _, version = _model_ref(request) if name is not None else (None, None)
        keys = await asyncio.to_thread(self._served, name, version)
        return json_response(describe.statistics(keys, self.scheduler.statistics()))

    def _served(self, name: str | None, version: int | None) -> list[tuple[str, int]]:
        """(model, version) served now: of `name` (ModelNotFound when it is not), or of every
        model in the repository whose versions can be read."""
        if name is not None:
            self.cache.describe(name, version)
            versions = [version] if version is not None else \
                self.cache.repository.served_versions(name)
            return [(name, v) for v in versions]
        keys = []
        for model in self.cache.repository.names():
            try:
                keys += [(model, v) for v in self.cache.repository.served_versions(model)]
            except EdgedError:  # a broken model in the listing has no statistics
                continue
        return keys

    async def model_ready(self, request: Request) -> Response:
        name, version = _model_ref(request)
        await asyncio.to_thread(self.cache.describe, name, version)  # 404 for unknown models
        ready = self.cache.ready(name, version)
        return json_response({"name": name, "ready": ready}, status=200 if ready else 503)

    async def model_config(self, request: Request) -> Response:
        name, version = _model_ref(request)
        model = await asyncio.to_thread(self.cache.describe, name, version)
        instances = instance_count(model.config.instances, options_for(model, self.cache.options))
        return json_response(describe.model_config(model, instances))

    async def infer(self, request: Request) -> Response:
        """The request's body is charged to the body budget, and the shared memory regions it
        names are its own, until it has answered: an unregister meanwhile takes effect after
        it (as in Triton). A handler that ends before its request's batch has run (cancelled
        at a shutdown whose drain timed out) leaves both to the batch, which still views
        them, until it ends."""
        name, version = _model_ref(request)
        if not self.scheduler.has_batcher(name, version):  # an unknown model: 404, body unread
            await asyncio.to_thread(self.scheduler.prepare, name, version)
        charge = self.bodies.charge()
        lease: Lease | None = None
        running: list[Future[Any]] = []  # its request, once handed to the scheduler

        def let_go(_: object = None) -> None:
            if lease is not None:
                lease.release()
            charge.release()  # its body is no longer held

        try:
            json_length = _json_length(request)
            body = await read_body(request, self.config.max_request_mb * 1024 * 1024, charge,
                                   json_length)
            # A header seen before for this model version: what checking it came to is
            # reused (`edged.api.plans`); it names no shared memory.
            plan = self.plans.find(name, version, body, json_length,
                                   self.scheduler.model(name, version)) \
                if json_length != 0 and self.planning else None
            if plan is not None:
                response = await self._planned(plan, body, name, version, running)
                self._replayable(request, plan, name, version, json_length, body)
                return response
            # The asking peer is looked up at a first region; inputs copied in are charged.
            asker = Asker(request)
            lease = self.shm.lease(asker, charge.add)
            return await self._infer(request, name, version, body, json_length, charge,
                                     lease, asker, running)
        finally:
            if running and not running[0].done():
                running[0].add_done_callback(let_go)
            else:
                let_go()

    async def _infer(self, request: Request, name: str, version: int | None,
                     body: memoryview, json_length: int | None, charge: Charge, lease: Lease,
                     asker: Asker, running: list[Future[Any]]) -> Response:
        """The full path: the request parsed and checked, then run."""
        parsed, plannable = await self._decode(name, version, body, json_length, charge,
                                               lease, asker)
        in_shm = False
        if parsed.outputs:  # most requests name none: every output comes back
            in_shm = any(out.shm is not None for out in parsed.outputs)
            if in_shm:
                await asker.resolve()  # before holding them here, on the loop
            for out in parsed.outputs:  # held from now: an unregister cannot take them mid-run
                if out.shm is not None:
                    lease.hold(out.shm)
        # The response cache (for models that opt in) never answers a request whose outputs
        # go to shared memory, nor one whose inputs are views of a region: its owner may write
        # other bytes before the model reads them, and an answer kept under the bytes looked
        # up would be another input's (issue 49, item 3). Inputs copied in are keyed as read.
        cached = None if in_shm or lease.viewed else tuple(out.name for out in parsed.outputs)
        admitted = self.scheduler.admit(
            name, parsed.inputs, version=version, priority=parsed.priority,
            timeout_s=parsed.timeout_s, cached=cached)
        running.append(admitted.future)
        plan = None
        if plannable and self.planning and not in_shm and not parsed.shm_inputs \
                and admitted.request.checked is not None:
            plan = self.plans.learn(name, version, body, json_length, parsed,
                                    admitted.request.checked)
        parsed.inputs = {}  # the batch owns them now; nothing here needs them
        outputs, served = await self._outputs(admitted, name)
        response = infer_answer(*encode_response(name, served, parsed.id, outputs,
                                                 parsed.outputs, parsed.binary_default,
                                                 write_shm=lease.write))
        if plan is not None:
            self._replayable(request, plan, name, version, json_length, body)
        return response

    def _replayable(self, request: Request, plan: Plan, name: str, version: int | None,
                    json_length: int | None, body: memoryview) -> None:
        """Leave a replay on a planned request that came as it is (its Content-Length
        bytes, not chunked or compressed): its repeats on the connection may take it. A
        compressed body is never replayed, whatever its length: a replay runs the bytes as
        they came (issue 49, item 4: a gzip body as long as its inflated bytes was)."""
        if self.replaying and request.content_length == len(body) and not encoded(request):
            request.replay = PlanReplay(request, plan, name, version, json_length, len(body),
                                        scheduler=self.scheduler, bodies=self.bodies,
                                        failed=self.failed, handling=self.handling)

    async def _planned(self, plan: Plan, body: memoryview, name: str,
                       version: int | None, running: list[Future[Any]]) -> Response:
        """A request whose header has a plan: no parse, no checks but the batcher's own
        (priority and timeout are the plan's, as checked); it names no shared memory, and
        parsing it is not charged for as it is not done."""
        admitted = self.scheduler.admit(name, plan.inputs(body), version=version,
                                        priority=plan.priority, timeout_s=plan.timeout_s,
                                        checked=plan.checked, cached=plan.cached)
        running.append(admitted.future)
        outputs, served = await self._outputs(admitted, name)
        return plan.answer(name, served, outputs)

    async def _outputs(self, admitted: Admitted, name: str) -> tuple[Outputs, int]:
        """The outputs of an admitted request (run, batched or queued; or from the response
        cache) and the version that made them."""
        future = admitted.future
        if not future.done():  # a response cache hit is done
            await self._run(admitted)
            if not future.done():
                await asyncio.wrap_future(future)
        outputs = future.result()
        served = future.version
        return outputs, served if served is not None else self.cache.default_version(name)

    async def _decode(self, name: str, version: int | None, body: memoryview,
                      json_length: int | None, charge: Charge, lease: Lease,
                      asker: Asker) -> tuple[InferRequest, bool]:
        """The full path: parse and check the request (JSON, or a raw binary body), charging
        what parsing makes before it does; a large body is decoded off the loop. Also
        whether a plan may be learned from it: a JSON header small enough (the caller also
        asks the parse whether it named shared memory: the text hint below only chooses
        where to decode, and is no proof)."""
        head = len(body) if json_length is None else min(max(json_length, 0), len(body))
        charge.add(head * (JSON_WEIGHT - 1))  # what parsing it will make of it, before it does
        reader, charger = lease.read, charge.add
        # The text hint where the decode may run on the loop (a large body is decoded on a
        # thread, which may look the peer up itself): scanning it would copy it here.
        small = len(body) <= DECODE_ON_THREAD_BYTES
        names_shm = small and _names_shared_memory(body, head)
        plannable = json_length != 0 and head <= MAX_HEADER_BYTES and not (
            names_shm if small else _names_shared_memory(body, head))
        if names_shm:
            await asker.resolve()  # off the loop over TCP; the decode below may run on it
        if json_length == 0:  # a raw binary request: the body is the one input's bytes
            model = self.scheduler.model(name, version)
            if len(body) > DECODE_ON_THREAD_BYTES and copies_body(model):  # not on the loop
                return await asyncio.to_thread(decode_raw, model, body, charger), False
            return decode_raw(model, body, charger), False
        if _slow_to_decode(body, names_shm, lease):  # not on the loop
            parsed = await asyncio.to_thread(decode_request, body, json_length,
                                             read_shm=reader, charge=charger)
        else:
            parsed = decode_request(body, json_length, read_shm=reader, charge=charger)
        if parsed.outputs:
            check_outputs(self.scheduler.model(name, version), parsed)
        return parsed, plannable

    async def _run(self, admitted: Admitted) -> None:
        """Run or queue an admitted request. Alone (no other request is being handled or
        arrived in this turn of the loop), a quick model runs right here, with no hop to a
        worker thread and back (tiny_cls at c=1 cost ~20% less server CPU per request, and
        the answer comes sooner). Requests that overlap for a model whose rows are cheap
        batch here at the end of the turn (`Turns`); for any other they go to the workers,
        where they batch and run beside each other while the loop keeps reading and
        answering."""
        batcher = admitted.batcher
        if self.handling() == 1 and batcher.quick:
            self.scheduler.run_or_queue(admitted)
        elif batcher.cheap:
            await self.turns.join(admitted)
        else:
            self.scheduler.queue(admitted)

    # -- repository --------------------------------------------------------------------------
    async def repository_index(self, request: Request) -> Response:
        body = await json_body(request, default={})
        ready_only = body.get("ready", False)
        if not isinstance(ready_only, bool):
            raise InvalidInput("ready must be true or false")
        rows = await asyncio.to_thread(self.cache.status)
        return json_response([describe.index_entry(r) for r in rows
                                  if not ready_only or r.state is ModelState.READY])

    async def load(self, request: Request) -> Response:
        name = request.match_info["model"]
        body = await json_body(request, default={})
        if body.get("parameters"):
            raise InvalidInput("load with an overriding config or files is not supported: "
                               "install versions into the repository (or push them by OTA)")
        await asyncio.to_thread(self.cache.load, name)
        return json_response({})

    async def unload(self, request: Request) -> Response:
        name = request.match_info["model"]
        await json_body(request, default={})

        def unload_all() -> None:
            if name not in self.cache.repository.names():
                raise ModelNotFound(f"no model named {name!r}")
            for row in self.cache.status():
                if row.name == name and row.state is ModelState.READY:
                    self.cache.unload(name, row.version)

        await asyncio.to_thread(unload_all)
        return json_response({})


def _slow_to_decode(body: memoryview, names_shm: bool, lease: Lease) -> bool:
    """Whether decoding may take a while: a large body (a Python object per JSON number, or
    a Python loop per binary BYTES element), or inputs copied in from shared memory (a pread
    of up to the whole region). The text test is a hint only; a key spelled with escapes is
    taken to be that key."""
    if len(body) > DECODE_ON_THREAD_BYTES:
        return True
    return names_shm and lease.copies()


def _names_shared_memory(body: memoryview, head: int) -> bool:
    """Whether the JSON part may name a region (a key spelled with escapes is taken to)."""
    text = bytes(body[:head])
    return b"shared_memory_region" in text or b"\\u" in text


def check_outputs(model: ModelVersion, parsed: InferRequest) -> None:
    """Unknown requested outputs fail before the model runs, not after."""
    known = {spec.name for spec in model.outputs}
    for out in parsed.outputs:
        if out.name not in known:
            raise InvalidInput(f"model {model.name} has no output {out.name!r} "
                               f"(outputs: {', '.join(sorted(known))})")


def _model_ref(request: Request) -> tuple[str, int | None]:
    name = request.match_info["model"]
    raw = request.match_info.get("version")
    if raw is None or raw == "":
        return name, None
    version = ascii_int(raw, MAX_VERSION_DIGITS)
    if version is None or version < 1:
        raise InvalidInput(f"model version must be a positive integer, got {raw[:32]!r}")
    return name, version


def _json_length(request: Request) -> int | None:
    raw = request.headers.get(HEADER_LENGTH)
    if raw is None:
        return None
    length = ascii_int(raw)
    if length is None:
        raise InvalidInput(f"{HEADER_LENGTH} must be a length in ASCII digits, got "
                           f"{raw[:32]!r}")
    return length
