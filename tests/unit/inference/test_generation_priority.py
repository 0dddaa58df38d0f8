"""Generation beside the cameras and between priorities (decision 040), on the real SmolLM2
GGUF through the warm cache and the generation queue. Streams first: while the scheduler's
signal says vision inference is queued or running, the worker waits before each token, at
most `llm.yield_max_ms`, counted in `yields`; off by its switch; the answers are the same.
Preemption: a request of a higher priority that finds every sequence busy pauses the
lowest-priority answer, the last to come of its level, which resumes where it was and
answers what it answers alone (greedy and seeded); a paused answer whose client goes ends
there, holding nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edged.backends import Piece
from edged.inference.cache import ModelCache
from edged.inference.generation import Ask, Done, Event, Generation, Generations, Started
from edged.inference.yielding import StreamsFirst
from edged.model.config import LanguageConfig
from edged.model.repository import ModelRepository
from tools.real_models import LANGUAGE_MODEL

COUNTING = "1 2 3 4 5 6 7 8 9 10"  # greedy, it counts on: an answer that runs its max_tokens


def repository(tmp_path: Path, real_models: Path, llm: str) -> ModelRepository:
    version = tmp_path / "models" / "smol" / "1"
    version.mkdir(parents=True)
    (version / "model.gguf").symlink_to(real_models / LANGUAGE_MODEL)
    (tmp_path / "models" / "smol" / "model.yaml").write_text(
        f"llm: {{context: 256, threads: 1, nice: 0, {llm}}}\n")
    return ModelRepository(tmp_path / "models")


@pytest.fixture
def make(tmp_path: Path, real_models: Path
         ) -> Iterator[Callable[[str, Callable[[], int] | None], Generations]]:
    made: list[tuple[ModelCache, Generations]] = []

    def make(llm: str, working: Callable[[], int] | None = None) -> Generations:
        cache = ModelCache(repository(tmp_path / str(len(made)), real_models, llm),
                           budget_bytes=512 * 1024 * 1024)
        generations = Generations(cache, working=working)
        made.append((cache, generations))
        return generations

    yield make
    for cache, generations in made:
        generations.close()
        cache.close(timeout_s=5)


class Log:
    """Every request's events in the order the worker handed them out (its own thread)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Event]] = []
        self._changed = threading.Condition()
        self.hooks: dict[tuple[str, type], Callable[[], None]] = {}

    def to(self, name: str) -> Callable[[Event], None]:
        def deliver(event: Event) -> None:
            hook = self.hooks.pop((name, type(event)), None)
            if hook is not None:
                hook()
            with self._changed:
                self.events.append((name, event))
                self._changed.notify_all()
        return deliver

    def wait(self, test: Callable[[], bool], timeout: float = 60.0) -> None:
        with self._changed:
            assert self._changed.wait_for(test, timeout), f"never came: {self.events}"

    def of(self, name: str) -> list[Event]:
        return [e for n, e in self.events if n == name]

    def text(self, name: str) -> str:
        return "".join(e.text for e in self.of(name) if isinstance(e, Piece))

    def ended(self, *names: str) -> bool:
        return all(any(isinstance(e, Done | Exception) for e in self.of(n)) for n in names)

    def pieces(self, name: str) -> int:
        return sum(isinstance(e, Piece) for e in self.of(name))


def answer(generations: Generations, ask: Ask) -> str:
    log = Log()
    generations.submit(ask, log.to("a"))
    log.wait(lambda: log.ended("a"))
    return log.text("a")


def test_streams_first_when_vision_work_never_ends_waits_its_bound_each_time() -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 0.004
        return now[0]

    streams = StreamsFirst(lambda: 3, clock)
    config = LanguageConfig(yield_max_ms=20)
    waited = streams.pause(config, threading.Condition(), lambda: False)
    assert waited is not None and waited >= 0.020
    assert streams.pause(config, threading.Condition(), lambda: True) is not None  # closing
    assert StreamsFirst(lambda: 0, clock).pause(config, threading.Condition(),
                                                lambda: False) is None
    assert StreamsFirst(None).pause(config, threading.Condition(), lambda: False) is None
    assert streams.pause(LanguageConfig(yield_to_streams=False), threading.Condition(),
                         lambda: False) is None


@pytest.mark.parametrize("sequences", [1, 2])
def test_generation_when_vision_work_is_pending_waits_before_each_token_same_answer(
        make: Callable[..., Generations], sequences: int) -> None:
    asks = [Ask("smol", prompt=COUNTING, max_tokens=12, temperature=0),
            Ask("smol", prompt="Once upon a time", max_tokens=12, temperature=0.8, seed=4)]
    quiet = make(f"sequences: {sequences}")
    reference = [answer(quiet, ask) for ask in asks]
    busy = make(f"sequences: {sequences}, yield_max_ms: 5", lambda: 1)
    assert [answer(busy, ask) for ask in asks] == reference
    row = busy.statistics()["smol"]
    assert row["yields"] >= row["tokens"] - len(asks)  # every step but the first waited
    assert row["yield_s"] > 0 and quiet.statistics()["smol"]["yields"] == 0


def test_generation_when_yield_to_streams_is_off_never_waits(
        make: Callable[..., Generations]) -> None:
    generations = make("sequences: 2, yield_to_streams: false", lambda: 1)
    answer(generations, Ask("smol", prompt=COUNTING, max_tokens=6, temperature=0))
    row = generations.statistics()["smol"]
    assert row["tokens"] == 6 and row["yields"] == 0 and row["yield_s"] == 0


def test_generation_when_vision_work_ends_stops_waiting_before_its_bound(
        make: Callable[..., Generations]) -> None:
    calls = [0]

    def working() -> int:  # busy for its first looks, then idle for good
        calls[0] += 1
        return 1 if calls[0] <= 4 else 0

    generations = make("sequences: 2, yield_max_ms: 10000", working)  # 10 s a token: 60 s
    assert answer(generations, Ask("smol", prompt=COUNTING, max_tokens=6, temperature=0))
    assert generations.statistics()["smol"]["yields"] >= 1


def preempted(generations: Generations, log: Log, low: list[Ask], high: Ask
              ) -> dict[str, Generation]:
    """The low asks started and generating, then the high one submitted."""
    handles = {}
    for i, ask in enumerate(low):
        handles[f"low{i}"] = generations.submit(ask, log.to(f"low{i}"))
    log.wait(lambda: all(log.pieces(f"low{i}") >= 2 for i in range(len(low))))
    handles["high"] = generations.submit(high, log.to("high"))
    log.wait(lambda: log.ended("high", *(f"low{i}" for i in range(len(low)))))
    return handles


LOW = [Ask("smol", prompt=COUNTING, max_tokens=40, temperature=0, priority=2),
       Ask("smol", prompt="Once upon a time", max_tokens=40, temperature=0.8, seed=9,
           priority=2)]
HIGH = Ask("smol", prompt="The capital of France is", max_tokens=8, temperature=0,
           priority=1)


def test_generation_when_higher_priority_finds_slots_busy_pauses_the_last_low_one(
        make: Callable[..., Generations]) -> None:
    generations = make("sequences: 2, priority_levels: 2")
    reference = {name: answer(generations, ask) for name, ask in
                 (("low0", LOW[0]), ("low1", LOW[1]), ("high", HIGH))}
    log = Log()
    preempted(generations, log, LOW, HIGH)
    names = [n for n, _ in log.events]
    started, ended = names.index("high"), next(
        i for i, (n, e) in enumerate(log.events) if isinstance(e, Done))
    assert "low1" not in names[started:ended]  # paused while the high one took its slot
    assert "low0" in names[started:ended]  # the first low one went on beside it
    assert isinstance(log.events[ended][1], Done) and log.events[ended][0] == "high"
    assert {name: log.text(name) for name in reference} == reference  # resumed, the same
    assert [isinstance(e, Started) for e in log.of("low1")].count(True) == 1
    row = generations.statistics()["smol"]
    assert row["preempted"] == 1 and row["completed"] == 6 and row["generating"] == 0


def test_generation_when_preempt_is_off_higher_priority_waits_for_a_slot(
        make: Callable[..., Generations]) -> None:
    generations = make("sequences: 2, priority_levels: 2, preempt: false")
    log = Log()
    preempted(generations, log, LOW, HIGH)
    first_done = next(i for i, (_, e) in enumerate(log.events) if isinstance(e, Done))
    assert [n for n, _ in log.events].index("high") > first_done
    assert generations.statistics()["smol"]["preempted"] == 0


def test_generation_when_paused_answers_client_goes_ends_it_with_what_came(
        make: Callable[..., Generations]) -> None:
    generations = make("sequences: 2, priority_levels: 2")
    log = Log()
    handles: dict[str, Generation] = {}
    # When the high one starts, the paused low one is in the queue: its client goes then.
    log.hooks[("high", Started)] = lambda: handles["low1"].cancel()
    for i, ask in enumerate(LOW):
        handles[f"low{i}"] = generations.submit(ask, log.to(f"low{i}"))
    log.wait(lambda: all(log.pieces(f"low{i}") >= 2 for i in range(2)))
    handles["high"] = generations.submit(HIGH, log.to("high"))
    log.wait(lambda: log.ended("high", "low0", "low1"))
    done = log.of("low1")[-1]
    assert isinstance(done, Done) and done.finish_reason == "cancelled"
    assert done.completion_tokens == log.pieces("low1") >= 2
    row = generations.statistics()["smol"]
    assert row["cancelled"] == 1 and row["completed"] == 2 and row["generating"] == 0
    assert row["queued"] == 0
    # Its slot and lease are free: two more answers run at once.
    assert answer(generations, LOW[0])


def test_generation_when_daemon_stops_with_an_answer_paused_ends_it_with_what_came(
        make: Callable[..., Generations]) -> None:
    generations = make("sequences: 2, priority_levels: 2")
    log = Log()
    high_started = threading.Event()
    log.hooks[("high", Started)] = high_started.set
    for i, ask in enumerate(LOW):
        generations.submit(ask, log.to(f"low{i}"))
    log.wait(lambda: all(log.pieces(f"low{i}") >= 2 for i in range(2)))
    generations.submit(HIGH, log.to("high"))
    assert high_started.wait(60)
    generations.close(timeout_s=0.0)  # the paused answer ends at once, the others within a token
    log.wait(lambda: log.ended("high", "low0", "low1"))
    done = log.of("low1")[-1]
    assert isinstance(done, Done) and done.finish_reason == "cancelled"
    assert generations.statistics()["smol"]["generating"] == 0


def test_language_config_when_yield_bounds_are_bad_names_the_key(tmp_path: Path,
                                                                  real_models: Path) -> None:
    from edged.core.errors import InvalidModel

    for bad, why in (("yield_max_ms: 0", "yield_max_ms: must be between 1 and 10000"),
                     ("yield_to_streams: sometimes", "yield_to_streams"),
                     ("preempt: 3", "preempt"), ("yield_every: 2", "yield_every")):
        folder = tmp_path / bad.split(":")[0]
        with pytest.raises(InvalidModel, match=why):
            repository(folder, real_models, bad).resolve("smol")
