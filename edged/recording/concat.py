"""One MP4 from several (a span of continuous segments), remuxed, never re-encoded: each
file's packets follow the previous file's, their timestamps moved on by its duration. Files
of another format (a camera that changed resolution) cannot share one track: refused, naming
the first such file. `concatenate` writes a file; `concatenate_into` writes a fragmented MP4
to anything with a `write` (the socket API streams a span as it is made: no file, no seek)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from edged.core.errors import InvalidInput
from edged.recording.store import ClipInfo
from edged.recording.writer import MP4_OPTIONS


class Sink(Protocol):
    def write(self, data: bytes) -> int: ...


def check_formats(infos: Sequence[ClipInfo]) -> None:
    """One format from start to end (by the store's records, before a byte is written)."""
    if not infos:
        raise InvalidInput("no recordings in that span")
    first = infos[0]
    for info in infos[1:]:
        if (info.codec, info.width, info.height) != (first.codec, first.width, first.height):
            raise InvalidInput(f"{info.id} is {info.codec} {info.width}x{info.height}, the "
                               f"span began {first.codec} {first.width}x{first.height}: "
                               "export it in parts")


def concatenate(parts: Sequence[Path], output: Path) -> int:
    """Write `parts` one after another into `output` (via `output.part`, renamed when
    complete); returns the packets written."""
    import av

    if not parts:
        raise InvalidInput("no recordings in that span")
    partial = output.with_name(output.name + ".part")
    try:
        with av.open(str(partial), "w", format="mp4",
                     options={"movflags": "+faststart"}) as out:
            written = _remux(parts, out)
        os.replace(partial, output)
    finally:
        partial.unlink(missing_ok=True)
    return written


def concatenate_into(parts: Sequence[Path], sink: Sink) -> int:
    """Write `parts` one after another into `sink` as a fragmented MP4 (a fragment per group
    of pictures, nothing rewritten: a stream); returns the packets written."""
    import av

    if not parts:
        raise InvalidInput("no recordings in that span")
    with av.open(sink, "w", format="mp4", options=MP4_OPTIONS) as out:
        return _remux(parts, out)


def _remux(parts: Sequence[Path], out: Any) -> int:
    stream = None
    key: tuple[str, int, int] | None = None
    offset = 0.0  # seconds the files so far last
    written = 0
    for path in parts:
        with av_open(path) as source:
            video = source.streams.video[0]
            ctx = video.codec_context
            this = (ctx.name, int(ctx.width), int(ctx.height))
            if stream is None:
                stream, key = out.add_stream_from_template(video), this
            elif key is not None and this != key:
                raise InvalidInput(f"{path.name} is {this[0]} {this[1]}x{this[2]}, "
                                   f"the span began {key[0]} {key[1]}x{key[2]}: "
                                   "export it in parts")
            tb = video.time_base
            shift = round(offset / tb)
            end = 0
            for packet in source.demux(video):
                if packet.size == 0 or packet.pts is None:
                    continue
                end = max(end, packet.pts + int(packet.duration or 0))
                packet.pts += shift
                packet.dts = (packet.dts if packet.dts is not None
                              else packet.pts - shift) + shift
                packet.stream = stream
                out.mux(packet)
                written += 1
            offset += float(end * tb)
    return written


def av_open(path: Path) -> Any:
    import av

    return av.open(str(path))
