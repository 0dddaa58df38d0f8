"""The camera's own compressed packets, as a demuxing reader hands them to whoever records
them (the `recording/` room): one access unit per packet, with its timestamps in the stream's
time base and the wall-clock time it stands for, and the stream's format (codec and parameter
sets) that a muxer needs to write them into a file without re-encoding."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol


@dataclass(frozen=True, eq=False)
class StreamFormat:
    """What a muxer copies into a file's track: the codec, size and parameter sets of one
    connection's video (a `template`: PyAV stream whose codec parameters a new output stream
    copies). A new format (another resolution or codec, new parameter sets) starts a new
    segment: `key` tells two formats apart."""

    codec: str  # "h264" | "hevc" | ...
    width: int
    height: int
    time_base: Fraction
    extradata: bytes
    template: Any  # av.VideoStream owned by a container edged never closes (see demux.py)

    @property
    def key(self) -> tuple[str, int, int, bytes]:
        return self.codec, self.width, self.height, self.extradata


class WallClock:
    """Maps one connection's timestamps to wall-clock time: `wall(pts)` = the anchor's wall
    time plus the time since the anchor's pts. Shared by every packet of the connection, so a
    move of the anchor (`move`) moves them all alike and the packets already in a ring stay
    in step with the frames read after."""

    __slots__ = ("pts", "tb", "wall0")

    def __init__(self, pts: int, wall0: float, tb: float) -> None:
        self.pts, self.wall0, self.tb = pts, wall0, tb

    def wall(self, pts: int) -> float:
        return self.wall0 + (pts - self.pts) * self.tb

    def move(self, pts: int, wall: float) -> None:
        """From now on `pts` stands for `wall`."""
        self.wall0 = wall - (pts - self.pts) * self.tb


@dataclass(frozen=True, eq=False, slots=True)
class Packet:
    """One access unit. `pts`/`dts` in `fmt.time_base`; `wall`: the capture time (Unix s) it
    stands for, on the same clock as the frames' `captured`; `keyframe`: decoding can start
    here."""

    data: bytes
    pts: int
    dts: int
    duration: int
    keyframe: bool
    clock: WallClock
    fmt: StreamFormat

    @property
    def wall(self) -> float:
        return self.clock.wall(self.pts)

    @property
    def size(self) -> int:
        return len(self.data)


class PacketSink(Protocol):
    """Who takes a reader's packets (on the capture thread: must not block for long)."""

    def packet(self, packet: Packet) -> None: ...

    def discontinuity(self, reason: str) -> None:
        """The packets that follow do not continue those before (a reconnect, a new format,
        a file that starts again): whatever is being written ends here."""
