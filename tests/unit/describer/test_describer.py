"""The describer's queue, rate limits, cache, schema check and retry, with a scripted asker in
place of a model (the askers have tests of their own, over real HTTP and the real GGUF)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from support.polling import wait_until

from edged.core.errors import EndpointFailed, Timeout
from edged.describer.config import DescriberConfig, StreamDescribeConfig
from edged.describer.prompt import Subject
from edged.describer.service import Describer

SUMMARY = {"title": "A car leaves", "scene": "A car drives out.", "shortSummary": "A car left.",
           "confidence": 0.5, "potential_threat_level": 0}
ON = StreamDescribeConfig(enabled=True, per_minute=6000, burst=1000)


@dataclass
class Scripted:
    """Answers in turn from `answers` (a str is the answer's text, an exception is raised);
    when `gate` is set, each ask waits for it first."""

    answers: list[Any] = field(default_factory=list)
    model: str = "scripted"
    vision: bool = True
    gate: threading.Event | None = None
    asked: list[Sequence[Any]] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)

    def ask(self, messages: Sequence[Any], deadline: float) -> str:
        self.asked.append(messages)
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        answer = self.answers.pop(0) if self.answers else json.dumps(SUMMARY)
        if isinstance(answer, Exception):
            raise answer
        return str(answer)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Made:
    describer: Describer
    asker: Scripted
    published: list[tuple[str, dict[str, Any]]]
    kept: dict[str, dict[str, Any]]
    clock: Clock


@pytest.fixture
def make() -> Iterator[Any]:
    made: list[Describer] = []

    def build(asker: Scripted | None = None, **config: Any) -> Made:
        asker = asker or Scripted()
        published: list[tuple[str, dict[str, Any]]] = []
        kept: dict[str, dict[str, Any]] = {}
        clock = Clock()
        describer = Describer(asker, DescriberConfig(**config),
                              publish=lambda i, p: published.append((i, json.loads(p))),
                              keep=kept.__setitem__, clock=clock)
        made.append(describer)
        return Made(describer, asker, published, kept, clock)

    yield build
    for describer in made:
        describer.close(1.0)


def subject(n: int, *, stream: str = "door", label: str = "car", jpeg: bytes | None = b"jpeg",
            duration: float = 3.0) -> Subject:
    return Subject(f"1.000-{stream}-{n}", stream,
                   {"id": f"1.000-{stream}-{n}", "label": label, "start_time": 100.0,
                    "end_time": 100.0 + duration, "entered_zones": ["drive"],
                    "box": [1, 2, 3, 4], "top_score": 0.9},
                   jpeg, ((0.0, 2.0, 4.0), (1.0, 5.0, 4.0)))


def settled(made: Made, n: int) -> None:
    wait_until(lambda: len(made.kept) >= n and not made.describer.busy and
               made.describer.statistics()["queued"] == 0, what=f"{n} events settled")


def test_describer_when_an_event_ends_publishes_its_validated_summary(make: Any) -> None:
    made = make()
    assert made.describer.submit(subject(1), ON)
    settled(made, 1)
    [(object_id, payload)] = made.published
    assert object_id == "1.000-door-1"
    assert payload["summary"] == SUMMARY and payload["cached"] is False
    assert payload["model"] == "scripted" and payload["attempts"] == 1
    assert made.kept[object_id]["state"] == "described"
    assert made.describer.statistics()["described"] == 1


def test_describer_when_the_same_snapshot_comes_again_answers_from_the_cache(make: Any
                                                                             ) -> None:
    made = make()
    made.describer.submit(subject(1), ON)
    settled(made, 1)
    made.describer.submit(subject(2), ON)  # another event, the same picture
    settled(made, 2)
    assert len(made.asker.asked) == 1
    assert made.published[1][1]["cached"] is True and made.published[1][1]["attempts"] == 0
    stats = made.describer.statistics()
    assert stats["described"] == 2 and stats["cached"] == 1


def test_describer_when_the_cache_is_off_asks_every_time(make: Any) -> None:
    made = make(cache=0)
    for n in (1, 2):
        made.describer.submit(subject(n), ON)
        settled(made, n)
    assert len(made.asker.asked) == 2


def test_describer_when_the_queue_is_full_drops_the_oldest_and_counts_it(make: Any) -> None:
    gate = threading.Event()
    made = make(Scripted(gate=gate), queue=2, cache=0)
    made.describer.submit(subject(1), ON)
    assert made.asker.started.wait(10)  # 1 is being asked; 2, 3 queue; 4 drops 2
    for n in (2, 3, 4):
        assert made.describer.submit(subject(n), ON)
    assert made.describer.statistics()["dropped"] == 1
    assert made.kept["1.000-door-2"] == {"state": "skipped", "reason": "dropped"}
    gate.set()
    settled(made, 4)
    assert [i for i, _ in made.published] == ["1.000-door-1", "1.000-door-3", "1.000-door-4"]


def test_describer_when_a_stream_is_over_its_rate_skips_and_counts(make: Any) -> None:
    made = make(cache=0)
    rated = StreamDescribeConfig(enabled=True, per_minute=6, burst=2)  # one per 10 s
    took = [made.describer.submit(subject(n), rated) for n in (1, 2, 3)]
    assert took == [True, True, False]
    assert made.describer.submit(subject(9, stream="yard"), rated)  # its own bucket
    made.clock.now += 10.0
    assert made.describer.submit(subject(4), rated)
    assert not made.describer.submit(subject(5), rated)
    assert made.describer.statistics()["rate_limited"] == 2
    assert made.kept["1.000-door-3"] == {"state": "skipped", "reason": "rate_limited"}


def test_describer_when_label_or_duration_not_wanted_leaves_the_event(make: Any) -> None:
    made = make()
    picky = StreamDescribeConfig(enabled=True, labels=["person"], min_duration_s=2.0)
    assert not made.describer.submit(subject(1, label="car"), picky)
    assert not made.describer.submit(subject(2, label="person", duration=1.0), picky)
    assert made.describer.submit(subject(3, label="person"), picky)
    assert not made.describer.submit(subject(4), StreamDescribeConfig())  # not enabled


def test_describer_when_an_answer_does_not_fit_retries_once_then_publishes(make: Any
                                                                           ) -> None:
    made = make(Scripted(answers=['{"title": "no scene"}']))
    made.describer.submit(subject(1), ON)
    settled(made, 1)
    assert len(made.asker.asked) == 2 and made.published[0][1]["attempts"] == 2
    assert made.describer.statistics()["retries"] == 1


def test_describer_when_both_answers_do_not_fit_records_failed(make: Any) -> None:
    made = make(Scripted(answers=["not json", json.dumps({**SUMMARY, "confidence": 7})]))
    made.describer.submit(subject(1), ON)
    settled(made, 1)
    assert not made.published
    kept = made.kept["1.000-door-1"]
    assert kept["state"] == "failed" and kept["reason"] == "failed_schema"
    assert "confidence" in kept["error"]
    assert made.describer.statistics()["failed_schema"] == 1


@pytest.mark.parametrize(("error", "counter", "reason"), [
    (Timeout("slow"), "timeouts", "timeout"),
    (EndpointFailed("down"), "endpoint_errors", "endpoint_error")])
def test_describer_when_the_asker_fails_skips_counts_and_goes_on(
        make: Any, error: Exception, counter: str, reason: str) -> None:
    made = make(Scripted(answers=[error]))
    made.describer.submit(subject(1), ON)
    made.describer.submit(subject(2, jpeg=b"other"), ON)
    settled(made, 2)
    assert made.kept["1.000-door-1"]["reason"] == reason
    assert [i for i, _ in made.published] == ["1.000-door-2"]  # not retried, not stuck
    assert made.describer.statistics()[counter] == 1


def test_describer_when_closed_takes_no_more_events(make: Any) -> None:
    made = make()
    made.describer.close(1.0)
    assert not made.describer.submit(subject(1), ON)
