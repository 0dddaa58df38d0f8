"""The budget that downloads of different models share (issue 41 #2): staging disk reserved
from a download's start until its install, waited for (within the deadline) when others hold
it, refused when it can never fit; and one bandwidth rate for every block any download reads.
Threads and a fake clock: nothing here sleeps or times anything."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from edged.ota import transfer
from edged.ota.manifest import Rejected
from edged.ota.transfer import TransferBudget


class Waits(threading.Event):
    """A stop event that records what it is asked to wait, and never waits."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.asked.append(round(timeout or 0.0, 6))
        return False


def budget(tmp_path: Path, disk: int = 100, rate: float | None = None,
           clock: list[float] | None = None) -> TransferBudget:
    now = clock if clock is not None else [0.0]
    return TransferBudget(lambda: tmp_path, disk, rate, Waits(), clock=lambda: now[0])


def test_reserve_when_others_hold_the_disk_waits_until_one_is_released(tmp_path: Path) -> None:
    shared = TransferBudget(lambda: tmp_path, 100, None, threading.Event())
    first = shared.reserve(70, float("inf"), lambda held: None)
    waiting, got = threading.Event(), []
    told: list[int] = []

    def second() -> None:
        got.append(shared.reserve(40, float("inf"), lambda held: (told.append(held),
                                                                   waiting.set())))

    thread = threading.Thread(target=second)
    thread.start()
    assert waiting.wait(10), "the second download did not wait for room"
    assert told == [70] and not got
    first.release()
    first.release()  # idempotent: gives back once
    thread.join(10)
    assert got and got[0].nbytes == 40 and shared.reserved == 40
    got[0].release()
    assert shared.reserved == 0


def test_reserve_when_larger_than_the_budget_or_the_free_disk_refuses_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(Rejected) as refused:
        budget(tmp_path, disk=100).reserve(101, float("inf"), lambda held: None)
    assert refused.value.reason == "no_space" and "ota.staging_mb" in str(refused.value)
    monkeypatch.setattr(transfer.shutil, "disk_usage", lambda path: SimpleNamespace(free=50))
    with pytest.raises(Rejected) as refused:
        budget(tmp_path, disk=100).reserve(60, float("inf"), lambda held: None)
    assert refused.value.reason == "no_space" and "free for staging" in str(refused.value)


def test_reserve_when_no_room_comes_by_the_deadline_gives_up(tmp_path: Path) -> None:
    clock = [0.0]
    shared = budget(tmp_path, disk=100, clock=clock)
    shared.reserve(80, 10.0, lambda held: None)
    clock[0] = 11.0
    with pytest.raises(Rejected) as refused:
        shared.reserve(40, 10.0, lambda held: None)
    assert refused.value.reason == "download_timeout" and shared.reserved == 80


def test_take_when_a_rate_is_set_spaces_every_downloads_blocks_on_it(tmp_path: Path) -> None:
    clock = [0.0]
    shared = budget(tmp_path, rate=1000.0, clock=clock)
    stop = shared.stop
    assert isinstance(stop, Waits)
    shared.take(1000)  # the first second's worth may come at once (a second's burst)
    shared.take(500)  # another download's block: after the first, at the same rate
    shared.take(500)
    assert stop.asked == [0.5, 1.0]
    clock[0] = 60.0  # idle for a while: a burst of a second's worth again, no more
    shared.take(1000)
    shared.take(1000)
    assert stop.asked == [0.5, 1.0, 1.0]


def test_take_when_no_rate_is_set_never_waits(tmp_path: Path) -> None:
    shared = budget(tmp_path)
    shared.take(1 << 30)
    assert shared.stop.asked == []  # type: ignore[attr-defined]
