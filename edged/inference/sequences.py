"""The answers one model's generation worker has under way in a batching session's slots
(continuous batching, decision 040): admitted between steps, each step a token for every one
of them, and each that ends (its answer done, its client gone, its decode failed) leaves its
slot and its model lease before the next step. An answer may be paused for a request of a
higher priority (`pause`): out of its slot, its lease and what it generated kept, it resumes
where it was when it gets a slot again (`resume`), or is forgotten if its client goes."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edged.backends import BatchedLanguageSession, PausingLanguageSession, Prompt, Sampling
from edged.core.errors import EdgedError, InferenceFailed
from edged.inference.asks import Done, GenerationCounters, Started
from edged.inference.entries import Lease

if TYPE_CHECKING:
    from edged.inference.generation import Generation

logger = logging.getLogger(__name__)


@dataclass
class _Running:
    generation: Generation
    lease: Lease
    session: BatchedLanguageSession
    slot: int
    prompt_tokens: int
    level: int = 0  # its queue's priority level (1 the highest) and arrival: who is paused
    order: int = 0
    count: int = 0


@dataclass
class Paused:
    """An answer out of its slot until one frees (the session's `state` to resume it)."""

    running: _Running
    state: object

    @property
    def session(self) -> PausingLanguageSession:
        session = self.running.session
        assert isinstance(session, PausingLanguageSession)
        return session


class Sequences:
    """Used by the worker's thread only; `generations()` may be read from another."""

    def __init__(self, counters: GenerationCounters) -> None:
        self._counters = counters
        self._running: list[_Running] = []

    def __len__(self) -> int:
        return len(self._running)

    def holds(self, lease: Lease) -> bool:
        return any(r.lease is lease for r in self._running)

    def generations(self) -> list[Generation]:
        return [r.generation for r in list(self._running)]

    def admit(self, generation: Generation, lease: Lease, session: BatchedLanguageSession,
              prompt: Prompt, sampling: Sampling, level: int = 0, order: int = 0) -> None:
        """Into a free slot (raises what the session cannot follow, holding nothing)."""
        slot = session.admit(prompt, sampling)
        self._running.append(_Running(generation, lease, session, slot, len(prompt.tokens),
                                      level, order))
        generation._emit(Started(lease.model.version, len(prompt.tokens),
                                 session.context_length))

    def lowest(self) -> _Running | None:
        """The answer a request of a higher priority pauses: of those on sessions that can
        pause one, the lowest priority's, and of those the last to come."""
        return max((r for r in self._running if isinstance(r.session, PausingLanguageSession)),
                   key=lambda r: (r.level, r.order), default=None)

    def pause(self, running: _Running) -> Paused:
        """Out of its slot (the slot free now), its lease kept for when it resumes."""
        session = running.session
        assert isinstance(session, PausingLanguageSession)
        state = session.suspend(running.slot)
        self._running.remove(running)
        self._counters.preempted += 1
        return Paused(running, state)

    def resume(self, paused: Paused) -> None:
        """Into a free slot of its session, to go on where it was."""
        paused.running.slot = paused.session.resume(paused.state)
        self._running.append(paused.running)

    def forget(self, paused: Paused) -> None:
        """A paused answer that will not resume (its client went, the daemon stops): what
        came so far is its answer."""
        running = paused.running
        try:
            paused.session.forget(paused.state)
        finally:
            running.lease.release()
        self._counters.tokens += running.count
        self._counters.cancelled += 1
        running.generation._emit(Done(running.prompt_tokens, running.count, "cancelled"))

    def step(self) -> None:
        """One token for every answer under way: the cancelled leave first (their slots free
        for the next request), then each session decodes once (two while an OTA swap lets
        the old version's answers finish)."""
        for running in [r for r in self._running if r.generation.cancelled.is_set()]:
            self._finish(running, "cancelled")
        for session in list({id(r.session): r.session for r in self._running}.values()):
            slots = {r.slot: r for r in self._running if r.session is session}
            try:
                pieces = session.step()
            except Exception as exc:  # the decode failed: its answers end with the error
                label = next(iter(slots.values())).lease.model.label
                if not isinstance(exc, EdgedError):
                    logger.exception("%s: a batched decode failed", label)
                error = exc if isinstance(exc, EdgedError) else InferenceFailed(
                    f"{label}: generation failed: {exc}")
                for running in slots.values():
                    self._finish(running, "", error)
                continue
            for slot, piece in pieces:
                running = slots[slot]
                if running.generation.cancelled.is_set():
                    self._finish(running, "cancelled")
                    continue
                if isinstance(piece, Exception):  # this answer failed, the others go on
                    self._finish(running, "", piece if isinstance(piece, EdgedError) else
                                 InferenceFailed(f"{running.lease.model.label}: {piece}"))
                    continue
                running.count += 1
                running.generation._emit(piece)
                if piece.finish_reason is not None:
                    self._finish(running, piece.finish_reason)

    def _finish(self, running: _Running, reason: str, error: EdgedError | None = None
                ) -> None:
        if running not in self._running:
            return
        self._running.remove(running)
        try:
            running.session.drop(running.slot)
        except Exception:  # a slot that cannot be freed is the session's bug: logged
            logger.exception("%s: freeing a sequence failed", running.lease.model.label)
        finally:
            running.lease.release()
        counters = self._counters
        counters.tokens += running.count
        if error is not None:
            counters.failed += 1
            running.generation._emit(error)
            return
        if reason == "cancelled":
            counters.cancelled += 1
        else:
            counters.completed += 1
        running.generation._emit(Done(running.prompt_tokens, running.count, reason))
