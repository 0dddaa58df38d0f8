"""A stream's live view: frames kept by reference and drawn only when asked, once per frame and
size whoever asks, a few sizes kept within bytes, each size drawn without waiting for another;
tracked objects drawn with their ids, untracked detections as they are; a bounded number of
viewers; and the MJPEG parts paced at the capped rate, never faster."""

from __future__ import annotations

import asyncio
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cv2
import numpy as np
import pytest

from edged.api.http.messages import Body, Headers, Request
from edged.api.live import BOUNDARY, DRAWINGS_AT_ONCE, KEEPALIVE_S, LiveRoutes, _parts, _Watch
from edged.events.config import LineConfig, ZoneConfig
from edged.processing.detections import Detections
from edged.processing.draw import colour_of
from edged.streams.config import StreamConfig
from edged.streams.live import (
    KEEP_BYTES,
    KEEP_SIZES,
    LiveView,
    Picture,
    answer_of,
    boxes_of,
)

SIDE = 256


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def config() -> StreamConfig:
    return StreamConfig(name="cam", source="file:///x.avi", model="det",
                        zones=[ZoneConfig("right", [[128, 0], [256, 0], [256, 256], [128, 256]])],
                        lines=[LineConfig("middle", [[128, 256], [128, 0]])])


def frame_with_square() -> np.ndarray:
    frame = np.zeros((SIDE, SIDE, 3), np.uint8)
    frame[64:128, 64:128] = (0, 0, 255)
    return frame


def decode(picture: Picture) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(picture.jpeg, np.uint8), cv2.IMREAD_COLOR)


def view(clock: Clock | None = None, viewers: int = 2) -> LiveView:
    return LiveView(config(), state=lambda: "streaming", max_viewers=viewers,
                    clock=clock or Clock())


def test_picture_when_nothing_was_recorded_is_none() -> None:
    assert view().picture() is None


def test_record_when_a_frame_is_processed_keeps_it_by_reference_and_draws_nothing() -> None:
    live = view()
    frame = frame_with_square()
    live.record(1, 1e9, frame, {"detections": []}, None)
    assert live.latest is not None and live.latest.frame is frame
    assert live.pictures == 0


def test_picture_when_asked_twice_for_one_frame_draws_it_once_per_size() -> None:
    live = view()
    live.record(1, 1e9, frame_with_square(), {"detections": []}, ())
    first = live.picture()
    assert first is not None and live.picture() is first
    small = live.picture(height=64)
    assert small is not None and decode(small).shape[0] == 64
    assert live.pictures == 2
    live.record(2, 1e9 + 0.25, frame_with_square(), {"detections": []}, ())
    again = live.picture()
    assert again is not None and again.seq == 2 and live.pictures == 3


def test_picture_when_a_young_one_is_held_answers_it_for_a_newer_frame_until_it_ages() -> None:
    clock = Clock()
    live = view(clock)
    live.record(1, 1e9, frame_with_square(), {}, ())
    first = live.picture(max_age_s=0.2)
    live.record(2, 1e9 + 0.1, frame_with_square(), {}, ())
    clock.now += 0.1
    assert live.picture(max_age_s=0.2) is first  # a viewer out of step: no second drawing
    clock.now += 0.15
    newer = live.picture(max_age_s=0.2)
    assert newer is not None and newer.seq == 2 and live.pictures == 2


def noise(height: int, width: int) -> np.ndarray:
    """A frame whose JPEG is about as large as a JPEG gets (nothing in it compresses)."""
    return np.random.default_rng(7).integers(0, 256, (height, width, 3), np.uint8)


def test_picture_when_hundreds_of_heights_are_asked_keeps_a_few_sizes_within_bytes() -> None:
    live = view()
    live.record(1, 1e9, noise(480, 640), {}, ())
    sizes = set()
    for height in range(16, 616):  # 600 heights: 464 below the frame's, the rest above
        picture = live.picture(raw=bool(height % 2), height=height)
        assert picture is not None
        sizes.add(decode(picture).shape[:2])
    assert (480, 640) in sizes and (16, 21) in sizes
    count, held = live.kept()
    assert count <= KEEP_SIZES and held <= KEEP_BYTES, (count, held)
    assert live.pictures == 464 + 2  # every height above the frame's: one full-size picture each


def test_picture_when_asked_at_or_above_the_frames_height_is_one_full_size_picture() -> None:
    live = view()
    live.record(1, 1e9, frame_with_square(), {}, ())
    full = live.picture()
    assert full is not None and decode(full).shape[:2] == (SIDE, SIDE)
    assert all(live.picture(height=h) is full for h in (SIDE, SIDE + 1, 4320))
    assert live.pictures == 1 and live.kept() == (1, len(full.jpeg))


def test_picture_when_kept_sizes_are_full_drops_the_least_recently_asked_for() -> None:
    live = view()
    live.record(1, 1e9, frame_with_square(), {}, ())
    often = live.picture(height=100)
    for height in range(16, 16 + KEEP_SIZES * 2):
        live.picture(height=height)
        assert live.picture(height=100) is often  # asked all along: kept, never drawn again
    assert live.kept()[0] == KEEP_SIZES
    drawn = live.pictures
    assert live.picture(height=16) is not None and live.pictures == drawn + 1  # dropped


def test_picture_when_one_size_is_being_drawn_another_size_is_not_held_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow drawing (a sweep of odd sizes) holds up only askers of its own size: the
    viewers of other sizes are answered meanwhile."""
    from edged.streams import live as live_module

    release, started = threading.Event(), threading.Event()
    real = live_module.annotate

    def slow(frame: np.ndarray, overlay: Any, height: int | None = None) -> np.ndarray:
        if height == 64:
            started.set()
            assert release.wait(30), "the held drawing was never let go"
        return real(frame, overlay, height)

    monkeypatch.setattr(live_module, "annotate", slow)
    live = view()
    live.record(1, 1e9, frame_with_square(), {}, ())
    got: dict[str, Picture | None] = {}
    held = threading.Thread(target=lambda: got.update(held=live.picture(height=64)))
    held.start()
    try:
        assert started.wait(30)
        other = threading.Thread(target=lambda: got.update(other=live.picture(height=128)))
        other.start()
        other.join(30)  # bounded: before the fix it waited for the held drawing forever
        assert not other.is_alive() and got["other"] is not None, "held up by another size"
        assert decode(got["other"]).shape[0] == 128 and "held" not in got
    finally:
        release.set()
        held.join(30)
    assert got["held"] is not None and decode(got["held"]).shape[0] == 64


def test_picture_when_objects_are_tracked_draws_their_boxes_zone_and_line() -> None:
    live = view()
    objects = (("1.000-cam-7", "red", 0.99, [64.0, 64.0, 128.0, 128.0], None),)
    live.record(5, 1e9, frame_with_square(), {"detections": []}, objects)
    drawn = live.picture()
    raw = live.picture(raw=True)
    assert drawn is not None and raw is not None
    annotated, plain = decode(drawn), decode(raw)
    box = np.array(colour_of("red"))
    assert np.abs(annotated[96, 62].astype(int) - box).max() < 60  # left edge, outside
    assert plain[96, 62].max() < 30  # black in the raw frame
    assert annotated[220, 220].any() and not plain[220, 220].any()  # the zone's tint


def test_boxes_of_when_the_stream_does_not_track_draws_every_detection() -> None:
    live = view()
    detections = Detections.from_rows([{"box": [1, 2, 3, 4], "label": "car", "score": 0.5,
                                        "sub_label": "ABC"}])
    live.record(1, 1e9, frame_with_square(), {"detections": detections}, None)
    assert live.latest is not None
    [box] = boxes_of(live.latest)
    assert (box.box, box.label, box.object_id, box.sub_label) == ((1, 2, 3, 4), "car", None,
                                                                  "ABC")


def test_answer_of_when_a_classifier_answered_says_its_top_classes() -> None:
    assert answer_of({"classes": [{"label": "red", "score": 0.991}]}) == "red 0.99"
    assert answer_of({"detections": []}) is None


def test_fps_when_frames_come_four_a_second_is_four_and_zero_once_they_stop() -> None:
    clock = Clock()
    live = view(clock)
    assert live.fps() is None
    for seq in range(1, 10):
        live.record(seq, 1e9 + seq / 4, frame_with_square(), {}, None)
        clock.now += 0.25
    fps = live.fps()
    assert fps is not None and fps == pytest.approx(4.0)
    clock.now += 10
    assert live.fps() == 0.0


def test_watch_when_all_places_are_taken_refuses_until_one_is_given_back() -> None:
    live = view(viewers=2)
    first, second = live.watch(), live.watch()
    assert first is not None and second is not None
    assert live.watch() is None and live.viewers == 2
    first()
    first()  # twice: given back once
    assert live.viewers == 1
    third = live.watch()
    assert third is not None and live.viewers == 2


class CountingView:
    """A new frame at every call (a camera far faster than the cap)."""

    def __init__(self) -> None:
        self.seq = itertools.count(1)

    def picture(self, *, raw: bool, height: int | None, max_age_s: float) -> Any:
        return Picture(next(self.seq), 0.0, b"\xff\xd8jpeg\xff\xd9")

    def watch(self) -> Any:
        return lambda: None


class StillView(CountingView):
    """The same frame every time (a stream that stopped)."""

    def picture(self, *, raw: bool, height: int | None, max_age_s: float) -> Any:
        return Picture(7, 0.0, b"\xff\xd8jpeg\xff\xd9")


def paced(source: Any, period_s: float, count: int) -> tuple[list[bytes], list[float]]:
    """`count` parts of `_parts` on a fake clock that moves only when it sleeps."""
    clock = Clock()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds

    async def read() -> list[bytes]:
        parts = _parts(source, False, None, period_s, clock=clock, sleep=sleep)
        got = [await anext(parts) for _ in range(count)]
        await parts.aclose()
        return got

    return asyncio.run(read()), slept


def test_parts_when_frames_come_faster_than_the_cap_send_one_per_period() -> None:
    got, slept = paced(CountingView(), 0.5, 6)
    assert len(got) == 6
    assert sum(slept) == pytest.approx(0.5 * 5)  # six parts: five periods between them
    head, jpeg = got[0].split(b"\r\n\r\n", 1)
    assert head.startswith(f"--{BOUNDARY}\r\nContent-Type: image/jpeg".encode())
    assert b"Content-Length: 8" in head and jpeg == b"\xff\xd8jpeg\xff\xd9\r\n"


def test_parts_when_no_new_frame_comes_send_the_last_again_after_the_keepalive() -> None:
    got, slept = paced(StillView(), 0.5, 3)
    assert len(got) == 3
    assert sum(slept) == pytest.approx(2 * KEEPALIVE_S)


def test_watch_closing_when_the_client_left_before_the_first_part_gives_the_place_back() -> None:
    released: list[bool] = []
    stream = _Watch(_parts(CountingView(), False, None, 1.0), lambda: released.append(True))
    asyncio.run(stream.aclose())
    assert released == [True]


def test_latest_when_many_ask_at_once_gives_a_few_of_them_worker_threads() -> None:
    """A burst of latest.jpg askers (a sweep of sizes from many connections) waits its turn
    on the loop: at most DRAWINGS_AT_ONCE of them hold a worker thread, the ones live viewers
    draw on, and every one is answered."""
    lock, entered, gate = threading.Lock(), threading.Semaphore(0), threading.Event()
    inside = [0, 0]  # now, most at once

    class SlowView:
        def picture(self, *, raw: bool, height: int | None, max_age_s: float) -> Picture:
            with lock:
                inside[0] += 1
                inside[1] = max(inside[1], inside[0])
            entered.release()
            assert gate.wait(30)
            with lock:
                inside[0] -= 1
            return Picture(1, 1e9, b"\xff\xd8jpeg\xff\xd9")

        def watch(self) -> None:
            return None

    slow = SlowView()
    routes = LiveRoutes(lambda name: slow, max_fps=5.0)

    async def burst() -> list[int]:
        asks = [asyncio.ensure_future(routes.latest(request(f"h={16 + i}"))) for i in range(6)]
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1) as own:  # not the loop's workers: the askers may hold them
            for _ in range(DRAWINGS_AT_ONCE):  # the first ones are drawing ...
                assert await loop.run_in_executor(own, entered.acquire, True, 30)
        for _ in range(10):
            await asyncio.sleep(0)  # ... and the others had every chance to start
        gate.set()
        return [answer.status for answer in await asyncio.gather(*asks)]

    assert asyncio.run(burst()) == [200] * 6
    assert inside[1] == DRAWINGS_AT_ONCE


def request(query: str) -> Request:
    made = Request("GET", "/v2/edged/streams/cam/latest.jpg", query, Headers(), "1.1", True,
                   Body(None), None, True, 30.0)  # type: ignore[arg-type]
    made.match_info = {"name": "cam"}
    return made
