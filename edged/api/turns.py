"""Infer requests that arrive together on the event loop, batched at the end of their turn
(`docs/decisions/021-own-http-stack.md`, "Requests of one turn batch on the loop")."""

from __future__ import annotations

import asyncio
import logging

from edged.inference.batcher import Batcher
from edged.inference.scheduler import Admitted, Scheduler

logger = logging.getLogger(__name__)


class Turns:
    """Infer requests for one model that arrive in the same turn of the event loop, run as one
    batch at its end (Scheduler.run_together: on the loop where their rows are cheap, else by
    the workers). A turn's requests are all parsed before any of their handlers runs, and the
    flush is queued behind them, so it sees them all."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._open: dict[Batcher, tuple[list[Admitted], asyncio.Future[None]]] = {}

    async def join(self, admitted: Admitted) -> None:
        """Wait for this turn's batch to be run or queued; the request's future says which."""
        turn = self._open.get(admitted.batcher)
        if turn is None:
            loop = asyncio.get_running_loop()
            turn = self._open[admitted.batcher] = ([], loop.create_future())
            loop.call_soon(self._flush, admitted.batcher)
        turn[0].append(admitted)
        await asyncio.shield(turn[1])

    def _flush(self, batcher: Batcher) -> None:
        admitted, flushed = self._open.pop(batcher)
        try:
            self.scheduler.run_together(admitted)
        except Exception as exc:  # each future must end: a bug here fails this turn only
            logger.exception("running %d requests together failed", len(admitted))
            for one in admitted:
                if not one.future.done():
                    one.future.set_exception(exc)
        finally:
            flushed.set_result(None)
