"""Home Assistant MQTT discovery for a detect stream: the retained configs that make its
counts, occupancy, line counters and snapshots entities of one device, without YAML on the
Home Assistant side.

Per stream and label: a count sensor and, with snapshots on, a camera showing the label's
newest snapshot. Per zone and label: a count sensor and an occupancy binary sensor (on while
the count is above 0). Per line, label and direction: a total_increasing sensor. Each is
`<discovery prefix>/<component>/<device>_<stream>_<thing>/config` (ids reduced to
`[A-Za-z0-9_-]`, as Home Assistant wants them), available while `<prefix>/status` says online.
An empty retained payload on the same topic removes the entity.

A stream that names faces (an `as: identity` cascade) or reads plates (`lpr.enabled`) also
gets Frigate's "Last Recognized Face" and "Last Recognized Plate" sensors: the state is the
name (a plate's text where no name is known), the attributes the whole message (id, score,
timestamp...), so an automation sees each new recognition even of the same name.

Per enrolled face name and known plate name (the device's, not a stream's): a binary sensor
`<name> present` (device class presence) on `<prefix>/presence/<kind>/<token>`, on while an
object with that name is in view on any stream (`edged/events/presence.py`: the off delay,
and the token that makes any name a safe topic level and id).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from edged.events.presence import Name, token
from edged.mqtt import topics

_NOT_ID = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True)
class DeviceInfo:
    """What every entity shares: the device, where its topics live, where discovery goes."""

    device_id: str
    prefix: str  # the device's topic prefix, e.g. edged/edge-01
    discovery_prefix: str  # Home Assistant's, e.g. homeassistant
    version: str

    def device(self) -> dict[str, Any]:
        return {"identifiers": [f"edged_{self.device_id}"], "name": f"edged {self.device_id}",
                "manufacturer": "edged", "model": "edged inference daemon",
                "sw_version": self.version}


def slug(text: str) -> str:
    """Text as a Home Assistant id: runs of other characters become one `_`."""
    return _NOT_ID.sub("_", text).strip("_") or "_"


def _entity(info: DeviceInfo, scope: str, component: str, thing: str, name: str,
            **fields: Any) -> dict[str, dict[str, Any]]:
    """One entity of a stream (`scope`: the stream's name) or of the device's presence
    (`scope` "presence": its things end in `_present`, which no stream's thing does): its
    discovery topic → its config (with the device's availability and the device itself)."""
    object_id = slug(f"{info.device_id}_{scope}_{thing}")
    return {f"{info.discovery_prefix}/{component}/{object_id}/config": {
        "name": name, "unique_id": f"edged_{object_id}", **fields,
        "availability_topic": topics.under(info.prefix, topics.STATUS),
        "payload_available": "online", "payload_not_available": "offline",
        "device": info.device()}}


def _encoded(configs: dict[str, dict[str, Any]]) -> dict[str, bytes]:
    return {topic: json.dumps(config, separators=(",", ":")).encode()
            for topic, config in configs.items()}


def stream_configs(info: DeviceInfo, stream: str, labels: Sequence[str],
                   zones: Sequence[str], lines: Sequence[str],
                   snapshots: bool) -> dict[str, bytes]:
    """Discovery topic → retained config (compact JSON) for every entity of the stream."""
    configs: dict[str, dict[str, Any]] = {}

    def entity(component: str, thing: str, name: str, **fields: Any) -> None:
        configs.update(_entity(info, stream, component, thing, name, **fields))

    def state(suffix: str) -> str:
        return topics.under(info.prefix, suffix)

    for label in labels:
        entity("sensor", f"{label}_count", f"{stream} {label} count",
               state_topic=state(topics.count(stream, label)), state_class="measurement",
               unit_of_measurement="objects", icon="mdi:counter")
        if snapshots:
            entity("camera", f"{label}_snapshot", f"{stream} {label} snapshot",
                   topic=state(topics.snapshot(stream, label)))
        for zone in zones:
            topic = state(topics.zone_count(stream, zone, label))
            entity("sensor", f"{zone}_{label}_count", f"{stream} {zone} {label} count",
                   state_topic=topic, state_class="measurement",
                   unit_of_measurement="objects", icon="mdi:counter")
            entity("binary_sensor", f"{zone}_{label}_occupancy",
                   f"{stream} {zone} {label} occupancy", state_topic=topic,
                   device_class="occupancy",
                   value_template="{{ 'ON' if value | int(0) > 0 else 'OFF' }}")
        for line in lines:
            for direction in ("in", "out"):
                entity("sensor", f"{line}_{label}_{direction}",
                       f"{stream} {line} {label} {direction}",
                       state_topic=state(topics.line_counts(stream, line)),
                       state_class="total_increasing", icon="mdi:transit-transfer",
                       value_template=f"{{{{ value_json.get({json.dumps(label)}, {{}})"
                                      f".get({json.dumps(direction)}, 0) }}}}")
    return _encoded(configs)


def state_configs(info: DeviceInfo, stream: str, states: Sequence[str]) -> dict[str, bytes]:
    """Discovery topic → retained config of a sensor per classified region of the stream
    (`streams[].states`): its state is the retained state's `state`."""
    configs: dict[str, dict[str, Any]] = {}
    for name in states:
        topic = topics.under(info.prefix, topics.state(stream, name))
        configs.update(_entity(info, stream, "sensor", f"{name}_state", f"{stream} {name}",
                               state_topic=topic, value_template="{{ value_json.state }}",
                               json_attributes_topic=topic, icon="mdi:state-machine"))
    return _encoded(configs)


# What each last-recognised sensor shows: Frigate's integration's rule (a face's name; a
# plate's name where known, else the plate read).
RECOGNIZED = {
    "face": ("last recognized face", "{{ value_json.name }}", "mdi:face-recognition"),
    "plate": ("last recognized plate", "{{ value_json.name if value_json.name else "
              "value_json.plate }}", "mdi:car-search"),
}


def recognition_configs(info: DeviceInfo, stream: str, *, faces: bool,
                        plates: bool) -> dict[str, bytes]:
    """Discovery topic → retained config of the stream's last recognised face and plate
    sensors (`streams/<stream>/recognized/face|plate`), for what the stream recognises."""
    configs: dict[str, dict[str, Any]] = {}
    for kind in [k for k, on in (("face", faces), ("plate", plates)) if on]:
        name, template, icon = RECOGNIZED[kind]
        topic = topics.under(info.prefix, topics.recognized(stream, kind))
        configs.update(_entity(info, stream, "sensor", f"recognized_{kind}",
                               f"{stream} {name}", state_topic=topic,
                               value_template=template, json_attributes_topic=topic,
                               icon=icon))
    return _encoded(configs)


PRESENCE = {"face": "mdi:account-check", "plate": "mdi:car-connected"}


def presence_configs(info: DeviceInfo, names: Iterable[Name]) -> dict[str, bytes]:
    """Discovery topic → retained config of a presence binary sensor per (kind, name): an
    enrolled face or a known plate, on while an object with that name is in view."""
    configs: dict[str, dict[str, Any]] = {}
    for kind, name in sorted(names):
        configs.update(_entity(info, "presence", "binary_sensor", f"{kind}_{token(name)}_present",
                               f"{name} present", device_class="presence",
                               state_topic=topics.under(info.prefix,
                                                        topics.presence(kind, token(name))),
                               icon=PRESENCE[kind]))
    return _encoded(configs)
