"""The pre-capture ring: whole groups of pictures from the last keyframe at least `seconds`
old, bounded in bytes by dropping the oldest groups, and what a clip starting at a time gets."""

from __future__ import annotations

from fractions import Fraction

from edged.recording.ring import PacketRing
from edged.sources.packets import Packet, StreamFormat, WallClock

FMT = StreamFormat("h264", 64, 48, Fraction(1, 90000), b"", None)


def packets(seconds: float, *, fps: int = 10, gop: int = 10, size: int = 100,
            start: float = 1000.0) -> list[Packet]:
    """`seconds` of a camera at `fps` with a keyframe every `gop` frames."""
    clock = WallClock(0, start, 1 / 90000)
    return [Packet(b"x" * size, i * 9000, i * 9000, 9000, i % gop == 0, clock, FMT)
            for i in range(int(seconds * fps))]


def test_ring_when_fed_keeps_from_the_last_keyframe_at_least_seconds_old() -> None:
    ring = PacketRing(seconds=2.5, max_bytes=10**9)
    for p in packets(10):
        ring.add(p)
    oldest = ring.oldest()
    newest = 1000.0 + 9.9
    assert oldest is not None and oldest <= newest - 2.5  # the whole pre-capture is there
    assert oldest > newest - 2.5 - 1.0  # and not a group more than it needs
    assert len(ring) == 30  # keyframes each second: from 1007 (2.9 s back) on


def test_ring_when_over_its_bytes_drops_the_oldest_whole_groups() -> None:
    ring = PacketRing(seconds=5.0, max_bytes=2500)
    for p in packets(10):
        ring.add(p)
    assert ring.bytes <= 2500 and ring.trimmed_for_bytes > 0
    assert ring.since(0.0)[0].keyframe  # still starts at a keyframe


def test_ring_when_packets_come_before_any_keyframe_drops_them() -> None:
    ring = PacketRing(seconds=2.0, max_bytes=10**9)
    for p in packets(3)[5:]:  # joins mid-group: the first keyframe is at 1001.0
        ring.add(p)
    assert ring.waiting == 5 and ring.since(0.0)[0].wall == 1001.0


def test_ring_since_when_asked_a_time_starts_at_the_keyframe_at_or_before_it() -> None:
    ring = PacketRing(seconds=5.0, max_bytes=10**9)
    for p in packets(6):
        ring.add(p)
    got = ring.since(1003.45)
    assert got[0].keyframe and got[0].wall == 1003.0 and got[-1].wall == 1005.9
    assert ring.since(0.0)[0].wall == ring.oldest()  # older than it holds: its oldest
    ring.clear()
    assert ring.since(1003.0) == [] and ring.bytes == 0
