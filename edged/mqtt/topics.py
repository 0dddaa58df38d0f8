"""Every MQTT topic edged publishes or takes, in one place: suffixes under the device's prefix
(`edged/<device_id>` by default; the link prepends it), and the filters OTA subscribes under
each root it listens on (the device's prefix, the fleet's, its groups'). Pure strings: the
events room and the OTA service name their topics here and never touch paho.

| suffix | what |
|---|---|
| `status` | `online`/`offline` (retained; the last will) |
| `stats` | the periodic stats message |
| `warnings` | Jetson throttling warnings |
| `models/<model>/state` | a model's state (retained) |
| `streams/<stream>/results` | each frame's results |
| `events` | tracked objects' new/update/end |
| `tracked_object_update` | a face told (Frigate's `type: face`), a plate read (`lpr`) |
| `state_changes` | a classified region's state changed |
| `streams/<stream>/states/<name>` | a classified region's state (retained) |
| `events/<id>/description` | an ended object's review summary (the describer) |
| `streams/<stream>/<label>` | objects of the label tracked now (retained) |
| `streams/<stream>/zones/<zone>/<label>` | of those, inside the zone now (retained) |
| `streams/<stream>/lines/<line>` | line crossings since start (retained) |
| `streams/<stream>/<label>/snapshot` | JPEG of the label's newest object (retained) |
| `streams/<stream>/recognized/<face or plate>` | the last face named, plate read (retained) |
| `presence/<kind>/<token>` | `ON`/`OFF`: a face or known plate name in view (retained) |
| `ota/<model>` (in) | an update's manifest |
| `ota/<model>/chunk/<i>` (in) | an inline artifact's chunks |
| `ota/<model>/command` (in) | a shadow rollout's promote/abort |
| `ota/<model>/status` | an update's progress (final states retained) |
| `ota/<model>/shadow` | a shadow rollout's progress (retained) |
| `infer/<model>` (in) | an MQTT 5 inference request (answered on its response topic) |

A label is a topic level as it is (spaces included), except the characters MQTT reserves
(`/`, `+`, `#`, NUL), which become `_`.
"""

from __future__ import annotations

STATUS = "status"
STATS = "stats"
WARNINGS = "warnings"
EVENTS = "events"
# Frigate's: what was learnt about a tracked object (a face's name or unknown group, a plate).
TRACKED_OBJECT_UPDATE = "tracked_object_update"
STATE_CHANGES = "state_changes"  # a classified region's state changed (streams/states.py)
# Each finished event clip (JSON: its id, stream, span, events, size, URL path).
CLIPS = "clips"
# What OTA takes under each root it listens on: manifests, inline chunks, shadow commands.
OTA_FILTERS = ("ota/+", "ota/+/chunk/+", "ota/+/command")
OTA = "/ota/"  # between a root and a model name in an inbound topic
CHUNK = "/chunk/"

_RESERVED = str.maketrans({"/": "_", "+": "_", "#": "_", "\0": "_"})


def topic_level(name: str) -> str:
    """A label as one topic level: MQTT's separators and wildcards replaced."""
    return name.translate(_RESERVED) or "_"


def model_state(model: str) -> str:
    return f"models/{model}/state"


def results(stream: str) -> str:
    return f"streams/{stream}/results"


def count(stream: str, label: str) -> str:
    return f"streams/{stream}/{topic_level(label)}"


def zone_count(stream: str, zone: str, label: str) -> str:
    return f"streams/{stream}/zones/{zone}/{topic_level(label)}"


def line_counts(stream: str, line: str) -> str:
    return f"streams/{stream}/lines/{line}"


def snapshot(stream: str, label: str) -> str:
    return f"streams/{stream}/{topic_level(label)}/snapshot"


def presence(kind: str, token: str) -> str:
    """A name's presence (`ON`/`OFF`, retained): `kind` face or plate, `token` the name made
    a safe topic level (edged.events.presence.token)."""
    return f"presence/{kind}/{token}"


def description(object_id: str) -> str:
    """An ended object's description (edged/describer): a review summary, JSON."""
    return f"events/{object_id}/description"


def ota(model: str) -> str:
    """Where a model's manifests are published (in)."""
    return f"ota/{model}"


def ota_command(model: str) -> str:
    """A shadow rollout's promote/abort (in)."""
    return f"ota/{model}/command"


def ota_status(model: str) -> str:
    return f"ota/{model}/status"


def ota_shadow(model: str) -> str:
    return f"ota/{model}/shadow"


def ota_chunk(model: str, index: int) -> str:
    return f"ota/{model}/chunk/{index}"


# MQTT 5 inference requests (in): one filter under the device's prefix, the model last.
INFER_FILTER = "infer/+"


def infer(model: str) -> str:
    """Where requests for a model's inference are published (in)."""
    return f"infer/{model}"


# MQTT 5 prompts to language models (in): Triton generate bodies, the model last.
GENERATE_FILTER = "generate/+"


def generate(model: str) -> str:
    """Where prompts for a language model are published (in)."""
    return f"generate/{model}"


def under(root: str, suffix: str) -> str:
    """A suffix under another device's or the fleet's root (operator tools, discovery)."""
    return f"{root}/{suffix}"


def state(stream: str, name: str) -> str:
    """A classified region's state (retained)."""
    return f"streams/{stream}/states/{name}"


def recognized(stream: str, kind: str) -> str:
    """The last face named (`face`) or plate read (`plate`) on a stream (retained): the
    `tracked_object_update` that told it, kept for Home Assistant's last-recognised sensors."""
    return f"streams/{stream}/recognized/{kind}"
