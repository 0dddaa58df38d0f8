"""Snapshots: the best view of an object is the largest score x area, a box cut by the frame's
border losing to any whole one; the JPEG decodes and shows the object with its box drawn; the
disk store keeps within its byte budget, dropping the oldest."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from support.events import Box, frame

from edged.events.config import SnapshotsConfig
from edged.events.snapshot import Snapshots, SnapshotState
from edged.events.store import SnapshotStore


def offer(snapshots: Snapshots, state: SnapshotState, box: Box, score: float = 0.9) -> bool:
    return snapshots.consider(state, frame(red=box), np.array(box, float), score)


def decode(jpeg: bytes) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None
    return image


def test_snapshot_when_a_larger_or_surer_view_comes_it_becomes_the_best() -> None:
    snapshots, state = Snapshots(SnapshotsConfig()), SnapshotState()
    assert offer(snapshots, state, (100, 100, 140, 200), 0.6)
    assert not offer(snapshots, state, (100, 100, 140, 200), 0.6)  # no better
    assert not offer(snapshots, state, (100, 100, 120, 150), 0.9)  # smaller, not sure enough
    assert offer(snapshots, state, (100, 100, 140, 200), 0.9)  # same box, surer
    assert offer(snapshots, state, (100, 100, 160, 250), 0.9)  # larger


def test_snapshot_when_a_box_is_cut_by_the_border_any_whole_view_beats_it() -> None:
    snapshots, state = Snapshots(SnapshotsConfig()), SnapshotState()
    assert offer(snapshots, state, (0, 100, 200, 400))  # large, but half out of the picture
    assert offer(snapshots, state, (300, 100, 340, 200))  # small and whole: better
    assert not offer(snapshots, state, (0, 50, 300, 479))  # larger still, cut again


def test_snapshot_jpeg_when_decoded_shows_the_object_with_its_box() -> None:
    snapshots, state = Snapshots(SnapshotsConfig(jpeg_quality=90)), SnapshotState()
    box: Box = (200, 100, 280, 260)
    snapshots.consider(state, frame(red=box, blue=(0, 0, 100, 100)), np.array(box, float), 0.9)
    image = decode(snapshots.encode(state, 0.0) or b"")
    # Cropped to the box and a quarter of its size around it: 120 x 240 pixels.
    assert image.shape == (240, 120, 3)
    inside = image[80:160, 40:80].reshape(-1, 3).mean(axis=0)
    assert inside == pytest.approx([0, 0, 255], abs=12)  # red, in BGR
    edge = image[40:200, 20].reshape(-1, 3).mean(axis=0)  # the box's left side, drawn
    assert edge == pytest.approx([0, 255, 0], abs=40)
    assert image[:15, :15].mean() < 20  # around the object: the black background
    assert state.pending is None and snapshots.encode(state, 1.0) is None  # nothing new


def test_snapshot_when_not_cropped_shows_the_whole_frame_scaled_to_fit() -> None:
    config = SnapshotsConfig(crop=False, draw_box=False, max_height=240)
    snapshots, state = Snapshots(config), SnapshotState()
    box: Box = (320, 240, 640, 480)
    snapshots.consider(state, frame(white=box), np.array(box, float), 0.9)
    image = decode(snapshots.encode(state, 0.0) or b"")
    assert image.shape == (240, 320, 3)
    assert image[180:, 240:].mean() > 235 and image[:100, :100].mean() < 20


def test_snapshot_when_the_box_lies_off_the_picture_still_keeps_a_view() -> None:
    snapshots, state = Snapshots(SnapshotsConfig()), SnapshotState()
    box = np.array([700.0, 500.0, 760.0, 600.0])  # past a 640x480 frame's corner
    assert snapshots.consider(state, frame(), box, 0.9)
    assert decode(snapshots.encode(state, 0.0) or b"").shape[:2] == (5, 1)  # the corner


def test_store_when_over_its_budget_removes_the_oldest_first(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps", budget_bytes=2500)
    for n in range(1, 4):
        assert store.put(f"1700000000.000-door-{n}", bytes([n]) * 1000)
    assert [s.id for s in store.list()] == ["1700000000.000-door-3", "1700000000.000-door-2"]
    assert store.read("1700000000.000-door-1") is None
    assert store.read("1700000000.000-door-2") == b"\x02" * 1000
    assert store.used_bytes == 2000
    assert sorted(p.name for p in (tmp_path / "snaps").iterdir()) == [
        "1700000000.000-door-2.jpg", "1700000000.000-door-3.jpg"]


def test_store_when_an_object_gets_a_better_snapshot_replaces_it_as_newest(
        tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, budget_bytes=2500)
    store.put("a", b"1" * 1000)
    store.put("b", b"2" * 1000)
    store.put("a", b"3" * 1200)  # a's better view: now the newest, b is the oldest
    store.put("c", b"4" * 400)  # 2600 bytes: over by 100
    assert [s.id for s in store.list()] == ["c", "a"]
    assert store.used_bytes == 1600


def test_store_when_reopened_finds_what_is_on_disk(tmp_path: Path) -> None:
    first = SnapshotStore(tmp_path, budget_bytes=10_000)
    first.put("x-1", b"j" * 100)
    (tmp_path / "notes.txt").write_text("not a snapshot")
    again = SnapshotStore(tmp_path, budget_bytes=10_000)
    assert [(s.id, s.size) for s in again.list()] == [("x-1", 100)]
    assert again.remove("x-1") and again.list() == [] and not (tmp_path / "x-1.jpg").exists()


def test_store_when_the_id_is_no_file_name_or_too_large_refuses_it(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, budget_bytes=100)
    assert not store.put("../escape", b"x")
    assert not store.put(".hidden", b"x")
    assert not store.put("big", b"x" * 101)
    assert store.list() == [] and list(tmp_path.iterdir()) == []


def test_store_when_an_object_is_described_keeps_it_beside_its_snapshot_within_budget(
        tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, budget_bytes=2500)
    store.put("a", b"1" * 1000)
    assert not store.describe("nobody", b"{}")  # no snapshot: nothing to keep it with
    assert store.describe("a", b'{"state":"described"}' + b" " * 479)  # 500 bytes
    assert store.description("a") == b'{"state":"described"}' + b" " * 479
    assert store.used_bytes == 1500 and store.list()[0].described == 500
    store.put("a", b"2" * 1000)  # a better view keeps the description
    assert store.description("a") is not None and store.used_bytes == 1500
    store.put("b", b"3" * 1100)  # 2600: a goes, its description with it
    assert store.description("a") is None and not (tmp_path / "a.json").exists()
    assert store.used_bytes == 1100


def test_store_when_reopened_finds_descriptions_and_drops_orphans(tmp_path: Path) -> None:
    first = SnapshotStore(tmp_path, budget_bytes=10_000)
    first.put("x-1", b"j" * 100)
    first.describe("x-1", b'{"state":"failed"}')
    (tmp_path / "gone-2.json").write_text("{}")  # its snapshot was removed by hand
    again = SnapshotStore(tmp_path, budget_bytes=10_000)
    assert again.description("x-1") == b'{"state":"failed"}'
    assert again.used_bytes == 100 + 18 and not (tmp_path / "gone-2.json").exists()
    assert again.remove("x-1") and list(tmp_path.iterdir()) == []


def test_store_when_a_plate_picture_is_kept_it_goes_with_its_snapshot_within_budget(
        tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, budget_bytes=2500)
    assert not store.put_plate("nobody", b"p")  # no snapshot: nothing to keep it with
    assert store.plate("nobody") is None and list(tmp_path.iterdir()) == []
    store.put("1.000-drive-1", b"1" * 1000)
    assert store.plate("1.000-drive-1") is None  # a snapshot, no plate read yet
    assert store.put_plate("1.000-drive-1", b"p" * 300)
    assert store.put_plate("1.000-drive-1", b"q" * 400)  # a better read replaces it
    assert store.plate("1.000-drive-1") == b"q" * 400
    assert store.used_bytes == 1400 and store.list()[0].plate == 400
    store.put("1.000-drive-1", b"2" * 1000)  # a better view of the car keeps its plate
    assert store.plate("1.000-drive-1") == b"q" * 400 and store.used_bytes == 1400
    store.put("2.000-drive-2", b"3" * 1200)  # 2600: the first goes, its plate with it
    assert store.plate("1.000-drive-1") is None
    assert not (tmp_path / "1.000-drive-1.plate.jpg").exists() and store.used_bytes == 1200


def test_store_when_reopened_finds_plates_and_never_takes_one_for_a_snapshot(
        tmp_path: Path) -> None:
    first = SnapshotStore(tmp_path, budget_bytes=10_000)
    first.put("x-1", b"j" * 100)
    first.put_plate("x-1", b"p" * 50)
    (tmp_path / "gone-2.plate.jpg").write_bytes(b"p")  # its snapshot was removed by hand
    again = SnapshotStore(tmp_path, budget_bytes=10_000)
    assert [(s.id, s.size, s.plate) for s in again.list()] == [("x-1", 100, 50)]
    assert again.plate("x-1") == b"p" * 50 and again.used_bytes == 150
    assert not (tmp_path / "gone-2.plate.jpg").exists()
    assert again.read("x-1.plate") is None  # the plate file is no snapshot of its own
    assert not again.put("x-1.plate", b"j")  # nor can an id write over it
    assert again.remove("x-1") and list(tmp_path.iterdir()) == []
