"""The recording sections: a stream's `clips:` (which events get a clip, pre- and post-capture)
and the daemon's `recording:` (where clips are kept, the byte budget, the free-space floor)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edged.core.schema import at_least, between, check_names, setting


@dataclass(frozen=True)
class ClipsConfig:
    """Event clips (`edged/recording/clips.py`): an object's event keeps the camera's packets
    from `pre_capture_s` before its start to `post_capture_s` after its end, remuxed into MP4.
    Needs the pyav reader (rtsp://, http(s)://, file://; `reader: auto` picks it)."""

    enabled: bool = setting(False, "keep a clip of each object's event")
    pre_capture_s: float = setting(5.0, "seconds of video before the object's start (from the "
                                        "keyframe at or before it)", check=between(0, 60))
    post_capture_s: float = setting(5.0, "seconds of video after the object's end",
                                    check=between(0, 300))
    labels: list[str] = setting(factory=list, help="only objects with these labels get a "
                                                   "clip; empty = every tracked label",
                                check=check_names)
    zones: list[str] = setting(factory=list, help="only objects that entered one of these "
                                                  "zones get a clip; empty = anywhere",
                               check=check_names)
    max_clip_s: float = setting(600.0, "a clip longer than this is cut at the next keyframe "
                                       "and goes on in a new one", check=at_least(5))
    ring_mb: int = setting(32, "the pre-capture ring's bound in MiB (whole groups of "
                               "pictures are dropped from its start beyond it)",
                           check=between(1, 4096))


@dataclass(frozen=True)
class RecordConfig:
    """Continuous recording (`edged/recording/segments.py`): every packet of the stream into
    MP4 segments cut at keyframes, kept `recording.segments_days` (event clips are kept
    longer: `recording.clips_days`, and the budget deletes segments before clips)."""

    enabled: bool = setting(False, "record the stream continuously, in segments")
    segment_s: float = setting(10.0, "a segment ends at the first keyframe this long after "
                                     "its start", check=between(1, 3600))
    mode: Literal["all", "motion", "active_objects"] = setting(
        "all", "all: every segment is kept; motion: only segments during which the picture "
        "changed (the change gate's measure, gate.threshold); active_objects: only segments "
        "during which a tracked object was in view (a detect stream with events)")


@dataclass(frozen=True)
class RecordingConfig:
    """Where clips are kept and how much disk they may use."""

    dir: Path = setting(Path("/var/lib/edged/recordings"), "clips are kept here, a folder per "
                        "stream; it must exist or be creatable, and be writable")
    clips_mb: int = setting(10240, "clips and segments kept at most (MiB): the oldest "
                                   "segments are deleted first, then the oldest clips",
                            check=at_least(1))
    clips_days: float = setting(30.0, "clips older than this (days, by their end) are "
                                      "deleted; 0 = kept until the budget needs the room",
                                check=at_least(0))
    segments_days: float = setting(7.0, "continuous segments older than this (days) are "
                                        "deleted; 0 = kept until the budget needs the room",
                                   check=at_least(0))
    min_free_mb: int = setting(1024, "free space the disk keeps: below it no clip starts "
                                     "(inference goes on)", check=at_least(0))
