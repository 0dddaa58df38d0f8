"""Record what a daemon publishes for one video: `python tools/mqtt_capture.py CONFIG OUT`.

Starts a private mosquitto on a free port and `edged run` with CONFIG (its streams must read
files without looping; `backpressure: block` makes every frame count), subscribes to `#`,
waits until no stream result has come for --quiet seconds, stops the daemon (its objects end,
its states go offline) and writes every message but the periodic stats as one JSON line,
grouped by topic in the order each topic's messages came: topic, retain flag, and the payload
with what differs run to run (clock times, latencies, ids made of capture times) replaced by
placeholders. Two runs on the same video, before and after a change, then compare
byte for byte: `diff before.jsonl after.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

VOLATILE = {"capture_ts", "publish_ts", "latency_ms", "inference_ms", "start_time", "end_time",
            "frame_time", "ts", "uptime_s", "events_ms", "pid"}
_ID = re.compile(r"^\d+\.\d{3}-")  # object ids start with their first frame's capture time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _normalise(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: ("<volatile>" if k in VOLATILE and v is not None else _normalise(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    if isinstance(value, str) and _ID.match(value):
        return _ID.sub("<t>-", value)
    return value


def _line(topic: str, payload: bytes, retain: bool) -> str:
    try:
        body: Any = _normalise(json.loads(payload))
        text = json.dumps(body, separators=(",", ":"))  # the daemon's own compact form
    except (UnicodeDecodeError, json.JSONDecodeError):
        text = f"<{len(payload)} bytes>"  # JPEG snapshots
    return json.dumps({"topic": _ID.sub("<t>-", topic), "retain": retain, "payload": text})


def capture(config: Path, out: Path, quiet_s: float, timeout_s: float) -> int:
    port = _free_port()
    workdir = Path(tempfile.mkdtemp(prefix="edged-capture-"))
    broker = subprocess.Popen(["mosquitto", "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    lines: list[str] = []
    last_result: list[float] = []  # when the last stream result came
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)

    def on_message(_c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        if msg.topic.endswith("/stats"):
            return  # periodic: how many fall in a run depends on its length
        lines.append(_line(msg.topic, msg.payload, bool(msg.retain)))
        if "/results" in msg.topic or "/events" in msg.topic:
            last_result[:] = [time.monotonic()]

    client.on_message = on_message
    daemon = None
    try:
        for _ in range(100):
            try:
                client.connect("127.0.0.1", port)
                break
            except OSError:
                time.sleep(0.05)
        client.subscribe("#", qos=1)
        client.loop_start()
        text = config.read_text().replace("@PORT@", str(port)).replace("@DIR@", str(workdir))
        cfg = workdir / "edged.yaml"
        cfg.write_text(text)
        daemon = subprocess.Popen([sys.executable, "-m", "edged", "run", "--config", str(cfg),
                                   "--socket", str(workdir / "edged.sock")],
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and daemon.poll() is None:
            if last_result and time.monotonic() - last_result[0] > quiet_s:
                break
            time.sleep(0.1)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        time.sleep(0.5)  # the last messages reach the subscriber
    finally:
        client.loop_stop()
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
        broker.terminate()
        broker.wait(5)
    # Grouped by topic, each topic's messages in the order they came: QoS 0 results and QoS 1
    # events interleave differently run to run, each topic's own sequence does not.
    lines.sort(key=lambda line: json.loads(line)["topic"])
    out.write_text("".join(line + "\n" for line in lines))
    print(f"{len(lines)} messages → {out}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path, help="daemon config; @PORT@ and @DIR@ are filled")
    parser.add_argument("out", type=Path)
    parser.add_argument("--quiet", type=float, default=3.0, help="seconds without results")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    return capture(args.config, args.out, args.quiet, args.timeout)


if __name__ == "__main__":
    raise SystemExit(main())
