"""Canary waves: `edged ota push --waves 1,10%,100%` sends an update to a fleet a wave at a
time. The devices are those named (--device) or those that say they exist (their retained
`<prefix>/status`, under --watch or the fleet prefix's siblings), in name order; each wave
size is a count or a share of the whole fleet, cumulative. A wave's devices each get a
manifest signed for their own prefix; the next wave starts only when every device of this
one is healthy: `active` on the version (for a shadow rollout, promoted after its shadow
run). Otherwise the rollout halts there, rolls that wave back when asked (a signed `reject`
for a candidate still shadowing, a `rollback` from the version for one already serving it),
and exits non-zero. Devices offline when their wave comes are reported and skipped, never
waited on.
"""

from __future__ import annotations

import json
import math
import queue
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from edged.core.errors import ToolError
from edged.core.states import OtaState
from edged.mqtt import topics
from edged.ops.keys import DEFAULT_TTL_S, freshness, load_private_key
from edged.ops.push import (
    Broker,
    Session,
    Target,
    follow_status,
    prepare,
    publish_manifest,
    serve,
)
from edged.ota.manifest import sign_document

DISCOVER_S = 3.0  # retained device status arrives at once; this bounds a quiet broker


@dataclass(frozen=True)
class Wave:
    number: int
    devices: list[str]


def parse_waves(spec: str) -> list[tuple[int, bool]]:
    """`1,10%,100%` -> [(1, False), (10, True), (100, True)] (a count or a percentage)."""
    waves = []
    for part in spec.split(","):
        text = part.strip()
        share = text.endswith("%")
        number = text[:-1] if share else text
        if not number.isdigit() or int(number) < 1 or (share and int(number) > 100):
            raise ToolError(f"--waves: {text!r} is neither a device count (1, 5) nor a share "
                            "of the fleet (10%, 100%)")
        waves.append((int(number), share))
    if not waves:
        raise ToolError("--waves: give at least one wave, e.g. 1,10%,100%")
    return waves


def plan(devices: list[str], spec: list[tuple[int, bool]]) -> list[Wave]:
    """Split `devices` (in order) into waves: each size cumulative, shares rounded up, every
    wave at least one device while any are left; the last wave takes the rest."""
    waves: list[Wave] = []
    done = 0
    for i, (number, share) in enumerate(spec):
        upto = math.ceil(len(devices) * number / 100) if share else number
        upto = len(devices) if i == len(spec) - 1 else min(len(devices), max(upto, done + 1))
        if upto > done:
            waves.append(Wave(len(waves) + 1, devices[done:upto]))
            done = upto
    return waves


def discover(session: Session, watch: list[str], named: list[str], wait_s: float,
             ) -> tuple[list[str], list[str]]:
    """(online, offline) device prefixes from their retained `status`: the named devices, or
    every device under `watch` that has one."""
    session.follow([topics.under(w, topics.STATUS) for w in (named or watch)])
    states: dict[str, str] = {}
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not (named and len(states) >= len(named)):
        try:
            topic, payload, _retained = session.events.get(timeout=0.1)
        except queue.Empty:
            continue
        if topic.endswith("/status"):
            states[topic.rsplit("/status", 1)[0]] = payload.decode(errors="replace")
    devices = named or sorted(states)
    online = [d for d in devices if states.get(d) == "online"]
    return online, [d for d in devices if d not in online]


def push_waves(manifest_path: Path, broker: Broker, *, waves: str, devices: list[str],
               fleet: str | None, watch: list[str], key: Path | None,
               artifact: Path | None = None, serve_at: str | None = None,
               url_host: str | None = None, inline: bool = False,
               timeout_s: float = 600.0, ttl_s: float = DEFAULT_TTL_S,
               rollback_on_halt: bool = False, discover_s: float = DISCOVER_S,
               out: TextIO | None = None) -> int:
    """Exit code: 0 every wave healthy, 1 a device failed (halted), 2 a device did not answer
    within `timeout_s` of its wave (halted)."""
    out = out or sys.stdout
    spec = parse_waves(waves)
    if key is None:
        raise ToolError("--waves signs one manifest per device: give --key")
    if bool(devices) == bool(fleet):
        raise ToolError("--waves goes with the devices (--device, repeatable) or --fleet")
    if serve_at is not None and artifact is None:
        raise ToolError("--serve needs --artifact FILE")
    devices = [d.rstrip("/") for d in devices]
    parent = (fleet or "").rstrip("/").rpartition("/")[0]
    watch = watch or [f"{parent}/+" if parent else "+"]
    serving = serve(artifact, serve_at, url_host) if serve_at is not None and \
        artifact is not None else nullcontext(None)
    with serving as url:
        if url is not None:
            out.write(f"serving {artifact} at {url}\n")
        session = Session(broker)
        try:
            online, offline = discover(session, watch, devices, discover_s)
            return _roll(manifest_path, session, spec, online, offline, key, artifact, url,
                         inline, timeout_s, ttl_s, rollback_on_halt, out)
        finally:
            session.close()


def _roll(manifest_path: Path, session: Session, spec: list[tuple[int, bool]],
          online: list[str], offline: list[str], key: Path, artifact: Path | None,
          url: str | None, inline: bool, timeout_s: float, ttl_s: float,
          rollback_on_halt: bool, out: TextIO) -> int:
    for device in offline:
        out.write(f"offline: {device} (not sent; push to it when it is back)\n")
    if not online:
        out.write("FAILED: no device is online\n")
        return 2
    first, _data = prepare(manifest_path, key=key, artifact=artifact, url=url, inline=inline,
                           target=online[0], ttl_s=ttl_s)
    model, version = str(first["model"]), int(first["version"])
    rollout = first.get("rollout") or {}
    shadow = isinstance(rollout, dict) and rollout.get("mode") == "shadow"
    planned = plan(online, spec)
    out.write(f"rolling {model}:{version} out to {len(online)} device(s) in {len(planned)} "
              f"wave(s){' with a shadow run on each' if shadow else ''}\n")
    done: list[str] = []
    for wave in planned:
        out.write(f"wave {wave.number}/{len(planned)}: {', '.join(wave.devices)}\n")
        target = Target(wave.devices, wave.devices, len(wave.devices))
        session.follow([topics.under(d, topics.ota_status(model)) for d in wave.devices])
        for device in wave.devices:
            doc, data = prepare(manifest_path, key=key, artifact=artifact, url=url,
                                inline=inline, target=device, ttl_s=ttl_s)
            publish_manifest(session, device, model, doc, data)
        outcome = follow_status(session, target, model, version, timeout_s, out)
        healthy = [d for d in wave.devices
                   if outcome.states.get(d, {}).get("state") == OtaState.ACTIVE]
        if len(healthy) == len(wave.devices):
            done += wave.devices
            out.write(f"wave {wave.number}: {len(healthy)} device(s) healthy"
                      f"{' (promoted)' if shadow else ''}\n")
            continue
        failed = [d for d in wave.devices if outcome.states.get(d, {}).get("state") in
                  (OtaState.FAILED, OtaState.ROLLED_BACK)]
        silent = [d for d in wave.devices if d not in healthy and d not in failed]
        left = [d for w in planned[wave.number:] for d in w.devices]
        out.write(f"HALTED at wave {wave.number}: "
                  + "; ".join(filter(None, [
                      f"failed: {', '.join(failed)}" if failed else "",
                      f"no answer in {timeout_s:g} s: {', '.join(silent)}" if silent else ""]))
                  + f"; not sent to {len(left)} device(s)"
                  + (f"; {len(done)} device(s) of earlier waves keep version {version}"
                     if done else "") + "\n")
        if rollback_on_halt:
            _roll_back(session, model, version, wave.devices, outcome.states, key, ttl_s, out)
        return 1 if failed else 2
    out.write(f"done: {model}:{version} on {len(done)} device(s)"
              + (f"; {len(offline)} offline, not sent" if offline else "") + "\n")
    return 0


def _roll_back(session: Session, model: str, version: int, devices: list[str],
               states: dict[str, dict[str, Any]], key: Path, ttl_s: float,
               out: TextIO) -> None:
    """Undo the halted wave: a signed `reject` where the candidate may still be shadowing (or
    downloading), a `rollback` from `version` where it serves; devices that failed already
    serve their old version."""
    private = load_private_key(key)
    for device in devices:
        state = states.get(device, {}).get("state")
        if state in (OtaState.FAILED, OtaState.ROLLED_BACK):
            continue
        if state == OtaState.ACTIVE:
            command = {"model": model, "action": "rollback", "from_version": version}
        else:
            command = {"model": model, "action": "reject", "version": version}
        signed = sign_document({**command, **freshness(device, ttl_s=ttl_s)}, private)
        session.publish(topics.under(device, topics.ota(model)), b"", retain=True)
        session.publish(topics.under(device, topics.ota_command(model)),
                        json.dumps(signed, separators=(",", ":")).encode())
        out.write(f"{device}  {command['action']} sent\n")
