"""A stream's section of the daemon config (`streams[]`): its source, model, rate and
back-pressure, cascades, and what its detections become (the events room's settings)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from edged.core.errors import ConfigIssue
from edged.core.schema import Parsed, at_least, between, check_name, setting
from edged.describer.config import StreamDescribeConfig
from edged.events.config import (
    LineConfig,
    PublishConfig,
    SnapshotsConfig,
    TrackConfig,
    ZoneConfig,
)
from edged.events.plates import LprConfig
from edged.recording.config import ClipsConfig, RecordConfig
from edged.streams.state_config import StateConfig, check_states

STREAM_SCHEMES = ("file", "rtsp", "http", "https", "v4l2", "csi", "gst", "mqtt")


def _check_size(size: list[int]) -> str | None:
    return None if len(size) == 2 and min(size) > 0 else "size must be [width, height] > 0"


@dataclass(frozen=True)
class SecondaryConfig:
    """A model run on crops of a detect stream's detections (a cascade, as DeepStream's
    secondary GIE and Frigate's sub-labels): one batch of crops per frame."""

    model: str = setting(help="model run on each crop", check=check_name)
    labels: list[str] = setting(factory=list, help="detections with these labels are cropped; "
                                                   "empty = every label")
    as_: Literal["sub_label", "attributes", "text", "identity", "plate"] = setting(
        "sub_label", "sub_label: a classify model's top label and score on the detection; "
        "text: a text recogniser's reading (and its score) on the detection; identity: the "
        "face pipeline's embedder (faces.embedder): each face with five landmarks aligned, "
        "embedded and matched against the gallery (its name also as sub_label); plate: the "
        "model is a plate detector run on the crop, and `reader` reads the best plate it finds "
        "onto the detection's text; attributes: the model's results under its name", key="as")
    reader: str | None = setting(None, "as: plate: the text recogniser that reads the plates "
                                       "the model finds", check=check_name)
    min_score: float = setting(0.0, "detections scoring below this are not cropped",
                               check=between(0, 1))
    crop_margin: float = setting(0.1, "each box grows by this share of its width and height "
                                      "on every side (context for the model)",
                                 check=between(0, 1))
    max_crops: int = setting(8, "crops per frame at most: the best-scoring detections",
                             check=at_least(1))
    crop: Literal["auto", "box", "corners"] = setting(
        "auto", "what is cut out for the model: box = the box grown by crop_margin; corners = "
        "a detection's four keypoints (a plate detector's corners) warped upright onto a "
        "rectangle (PaddleOCR's perspective crop); auto = corners where the detection has "
        "four keypoints, else the box")


@dataclass(frozen=True)
class GateConfig:
    """Change gating (`edged/streams/gate.py`): a frame goes to the model only when its picture
    changed since the frame the model last saw, and at least every `max_skip_s`; between, the
    last answer holds (tracked objects stay where they were)."""

    enabled: Literal["auto", True, False] = setting(
        "auto", "auto = on for a detect stream that tracks objects and publishes no per-frame "
        "results (the default detect stream), off for the others; true on any camera stream "
        "(gated frames then publish no result); false = every frame goes to the model")
    threshold: float = setting(0.0005, "share of the thumbnail's pixels that must have changed "
                                       "for a frame to go to the model (0.0005: 6 pixels of "
                                       "133x100; 0 = any changed pixel)",
                               check=between(0, 1))
    pixel_threshold: int = setting(12, "grey levels (of 255) by which a thumbnail pixel must "
                                       "differ from the last inferred frame's to count as "
                                       "changed: above the camera's noise",
                                   check=between(1, 254))
    max_skip_s: float = setting(2.0, "a frame goes to the model at least this often (seconds "
                                     "of capture time), changed or not", check=at_least(0))
    height: int = setting(100, "the thumbnail's height in pixels (its width keeps the frame's "
                               "aspect): the change is measured at this resolution",
                          check=between(8, 2160))


@dataclass(frozen=True)
class StreamConfig:
    name: str = setting(help="stream name (used in topics)", check=check_name)
    source: str = setting(help="where frames come from: file://, rtsp://, http(s):// (MJPEG), "
                               "v4l2://, csi:// and gst:// (GStreamer), mqtt://<topic> (sensors)")
    model: str = setting(help="model that processes the frames")
    fps: float | None = setting(None, "frame rate limit; null = as fast as the source",
                                check=at_least(0.01))
    backpressure: Literal["drop_oldest", "drop_newest", "block"] = setting(
        "drop_oldest", "what to do with frames when the model is behind")
    priority: int | None = setting(None, "scheduler priority of this stream's frames (1 = "
                                         "highest); null = the model's default_priority",
                                   check=at_least(1))
    queue: int = setting(2, "frames held between capture and the model", check=at_least(1))
    in_flight: int = setting(2, "frames of this stream inside the model at once",
                             check=at_least(1))
    loop: bool = setting(False, "file:// sources: start again at the end")
    watchdog_s: float = setting(10.0, "reconnect after this long without a frame",
                                check=at_least(0.1))
    backoff_initial_s: float = setting(0.5, "first reconnect delay", check=at_least(0.01))
    backoff_max_s: float = setting(30.0, "reconnect delays double up to this",
                                   check=at_least(0.01))
    size: list[int] | None = setting(None, "v4l2/csi capture size [width, height]",
                                     check=_check_size)
    decoder: Literal["auto", "ffmpeg", "nvv4l2decoder"] = setting(
        "auto", "rtsp:// and file:// decoding: auto = the Jetson's hardware decoder "
        "(nvv4l2decoder through GStreamer) where it can run, else FFmpeg on the CPU")
    codec: Literal["auto", "h264", "h265"] = setting(
        "auto", "the hardware decoder's codec: auto = read from a file, H.264 for rtsp://")
    reader: Literal["auto", "opencv", "pyav"] = setting(
        "auto", "camera reader: pyav = PyAV's demuxing reader (rtsp:// over TCP, http(s)://, "
        "file://: packets for clips and frames from one connection); opencv = "
        "cv2.VideoCapture; auto = pyav where the stream keeps clips, else opencv")
    payload: Literal["json", "raw"] = setting(
        "json", "mqtt:// sensors: JSON arrays, or raw little-endian tensors")
    log_results: bool = setting(False, "log one line per result at DEBUG (the demo does); "
                                       "a detect stream with events and no per-frame "
                                       "results: one at INFO per object that appears or ends")
    secondary: list[SecondaryConfig] = setting(
        factory=list, help="models run on crops of this detect stream's detections")
    # Events (edged/events/): what a detect stream's detections become.
    track: TrackConfig = setting(factory=TrackConfig, help="tracking: ids across frames")
    labels: list[str] = setting(factory=list, help="only detections with these labels become "
                                                   "objects; empty = every label")
    min_score: float = setting(0.0, "detections scoring below this are ignored by tracking",
                               check=between(0, 1))
    zones: list[ZoneConfig] = setting(factory=list, help="polygons objects are in or not")
    lines: list[LineConfig] = setting(factory=list, help="lines whose crossings are counted")
    snapshots: SnapshotsConfig = setting(factory=SnapshotsConfig,
                                         help="each object's best frame as a JPEG")
    publish: PublishConfig = setting(factory=PublishConfig, help="what the stream publishes")
    clips: ClipsConfig = setting(factory=ClipsConfig, help="event clips: the camera's own "
                                                          "packets around each object's event")
    record: RecordConfig = setting(factory=RecordConfig, help="continuous recording in "
                                                              "segments")
    gate: GateConfig = setting(factory=GateConfig, help="change gating: frames whose picture "
                                                        "did not change skip the model")
    lpr: LprConfig = setting(factory=LprConfig, help="licence plates: a text cascade's reads "
                                                    "voted per object, known plates named")
    states: list[StateConfig] = setting(factory=list, help="regions of the frame classified "
                                                           "into states (a gate open or shut)")
    masks: Literal["polygon", "rle"] = setting(
        "polygon", "a segment model's masks in this stream's per-frame results and its "
        "objects' events: polygon = the outer contour [[x, y], ...] in frame pixels; rle = "
        "COCO run-length encoding {size: [h, w], counts} of the mask drawn at frame size")
    describe: StreamDescribeConfig = setting(
        factory=StreamDescribeConfig, help="event descriptions: each ended object's snapshot "
                                           "and data to the describer (`describer:`)")


def check_stream_gate(parsed: Parsed[Any], path: str, stream: StreamConfig) -> list[ConfigIssue]:
    """A gate measures pictures: `gate.enabled: true` on a sensor stream is refused (`path`:
    the stream's key path, e.g. `streams[0]`)."""
    if stream.gate.enabled is True and stream.source.startswith("mqtt://"):
        return [parsed.issue(f"{path}.gate.enabled", "a change gate measures pictures; "
                                                     "mqtt:// sensor streams have none")]
    return []


def check_stream_clips(parsed: Parsed[Any], path: str, stream: StreamConfig) -> list[ConfigIssue]:
    """Clips need the camera's packets: the pyav reader on rtsp://, http(s):// or file://;
    `clips.zones` names zones of the stream, `clips.labels` labels it tracks (when it names
    them: the model's own are checked where it is known)."""
    clips = stream.clips
    if not clips.enabled and not stream.record.enabled:
        return []
    issues = []
    scheme = stream.source.partition("://")[0]
    key = "clips.enabled" if clips.enabled else "record.enabled"
    if scheme not in ("rtsp", "http", "https", "file"):
        issues.append(parsed.issue(f"{path}.{key}", f"clips are recorded from rtsp://, "
                                   f"http(s):// and file:// sources, not {scheme}://"))
    elif stream.reader == "opencv":
        issues.append(parsed.issue(f"{path}.reader", "clips need the camera's packets, which "
                                   "OpenCV does not give: reader: pyav (or auto)"))
    tracked = set(stream.labels)
    for i, label in enumerate(clips.labels if clips.enabled and tracked else ()):
        if label not in tracked:
            issues.append(parsed.issue(f"{path}.clips.labels[{i}]", f"{label!r} is not in this "
                                       f"stream's labels ({', '.join(stream.labels)}): no such "
                                       "object is tracked, so none would get a clip"))
    zones = {z.name for z in stream.zones}
    for i, zone in enumerate(clips.zones):
        if zone not in zones:
            issues.append(parsed.issue(f"{path}.clips.zones[{i}]", f"no zone {zone!r} in this "
                                                                   "stream"))
    return issues


def check_stream_states(parsed: Parsed[Any], path: str,
                        stream: StreamConfig) -> list[ConfigIssue]:
    """State names unique, regions inside the frame where it can be told (fractions; pixels
    within `size:`); `lpr.enabled` needs a text cascade to read the plates."""
    issues = check_states(parsed, path, stream.states, stream.size)
    if stream.states and stream.source.startswith("mqtt://"):
        issues.append(parsed.issue(f"{path}.states", "states classify regions of pictures; "
                                                     "mqtt:// sensor streams have none"))
    if stream.lpr.enabled and not any(s.as_ in ("text", "plate") for s in stream.secondary):
        issues.append(parsed.issue(f"{path}.lpr.enabled", "licence plates are read by a "
                                   "text cascade: add secondary: [{model: <recogniser>, "
                                   "labels: [<plate label>], as: text}] (a plate stream) or "
                                   "[{model: <plate detector>, labels: [car], as: plate, "
                                   "reader: <recogniser>}] (a car stream)"))
    for j, secondary in enumerate(stream.secondary):
        if (secondary.as_ == "plate") != (secondary.reader is not None):
            issues.append(parsed.issue(f"{path}.secondary[{j}].reader", "as: plate takes a "
                                       "reader (the text recogniser), and only as: plate does"))
    return issues
