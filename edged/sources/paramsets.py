"""Parameter sets in H.264/H.265 Annex B access units (the byte streams RTSP and MPEG-TS
carry): a camera that changes resolution or codec settings sends new ones with a keyframe,
and what it sends next must go into a new file (a track has one set of parameters)."""

from __future__ import annotations

import io
import re
from dataclasses import replace
from fractions import Fraction
from typing import Any

from edged.sources.packets import StreamFormat

START = re.compile(b"\x00\x00\x01")
H264_SETS = frozenset({7, 8})  # SPS, PPS
HEVC_SETS = frozenset({32, 33, 34})  # VPS, SPS, PPS


def parameter_sets(data: bytes, codec: str) -> bytes | None:
    """The access unit's distinct parameter set NAL units, joined in a fixed order (None: it
    carries none, or it is not Annex B, as MP4's length-prefixed samples are not: theirs are
    in the extradata)."""
    if not (data.startswith(b"\x00\x00\x01") or data.startswith(b"\x00\x00\x00\x01")):
        return None
    sets = []
    starts = [m.end() for m in START.finditer(data)]
    for i, begin in enumerate(starts):
        if begin >= len(data):
            continue
        end = starts[i + 1] - 3 if i + 1 < len(starts) else len(data)
        unit = data[begin:end].rstrip(b"\x00")
        kind = unit[0] & 0x1F if codec == "h264" else (unit[0] >> 1) & 0x3F
        if kind in (H264_SETS if codec == "h264" else HEVC_SETS):
            sets.append(unit)
    # Each distinct set once, in a fixed order: RTP depayloaders repeat them at will.
    return b"".join(b"\x00\x00\x00\x01" + s for s in sorted(set(sets))) or None


def probed_format(data: bytes, codec: str, time_base: Fraction,
                  make: Any) -> StreamFormat | None:
    """The format of a keyframe that carries its parameter sets, read by FFmpeg's raw stream
    demuxer (size, profile and extradata as a file of it would have them); `make` turns the
    probed stream into a `StreamFormat` (demux.stream_format). None when FFmpeg cannot read it."""
    import av

    try:
        with av.open(io.BytesIO(data), format=codec) as raw:
            if not raw.streams.video:
                return None
            fmt: StreamFormat = make(raw.streams.video[0])
    except (av.FFmpegError, OSError):
        return None
    return replace(fmt, time_base=time_base)
