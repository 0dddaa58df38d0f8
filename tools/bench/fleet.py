"""`python -m tools.bench fleet`: a signed rollout to a simulated fleet through one broker.

One private mosquitto (`sys_interval 1`, for its own message counters) and N simulated
devices (tools/bench/fleet_agents.py: the daemon's real OTA path, its MqttLink, OtaService
and Updater with the download, sha256, staging and swap, only the model not loaded), in a
few processes. The rollout is the operator's real code: `edged ota push --waves 1,10%,100%`
(push_waves: discovery from retained status, one manifest signed per device, each wave
followed to `active` before the next), then `edged ota push --fleet` (one manifest on the
fleet topic, every device answering), each with the artifact served over HTTP from the
pusher as `--serve` does. The table gives the time to the last device active, each wave's
time, and what it cost the broker: PUBLISH packets taken in and sent out, and bytes, from
mosquitto's own `$SYS` counters (the status the pusher follows included).

Limits: one machine plays the broker, the pusher and every device (a shared 2-core VM here),
so the times are an upper bound of the tools' own cost, not of a real fleet's (whose devices
each have their own CPU and whose downloads travel a real network)."""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tools.bench.assets import tiny_model_tools
from tools.bench.broker import free_port, stop_process

SIZES = (100, 1000)
QUICK_SIZES = (20,)
PER_PROCESS = 250
QUIET_S = 0.3  # a $SYS report's topics come within this of each other
WAVES = "1,10%,100%"
SYS = ("$SYS/broker/publish/messages/sent", "$SYS/broker/bytes/received",
       "$SYS/broker/bytes/sent")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def fleet_broker(workdir: Path) -> Iterator[tuple[int, int]]:
    """A private mosquitto with its counters every second and room for every connection."""
    import getpass

    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = workdir / "mosquitto.conf"
    config.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                      f"user {getpass.getuser()}\nsys_interval 1\nmax_queued_messages 100000\n")

    def more_files() -> None:
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    with (workdir / "mosquitto.log").open("wb") as log:
        process = subprocess.Popen(["mosquitto", "-c", str(config)], stdout=log, stderr=log,
                                   preexec_fn=more_files)
    try:
        counters = Counters(port)  # waits for the broker, and its first $SYS report
        counters.close()
        yield port, process.pid
    finally:
        stop_process(process, 10)


class Counters:
    """What the broker carries. PUBLISH packets into it are counted here, by what they are
    (a subscriber to every simulated topic: each is delivered to it once): mosquitto 2.0's own
    `publish/messages/received` leaves QoS 2 out and lagged ours. Deliveries out are
    mosquitto's `$SYS/broker/publish/messages/sent` less what this watcher itself took (its
    copies and the `$SYS` reports); bytes are mosquitto's, every packet and ack included."""

    def __init__(self, port: int, prefix: str = "sim") -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        self.prefix = prefix
        self.values: dict[str, int] = {}
        self.taken: dict[str, int] = {"manifest": 0, "status": 0, "other": 0, "own": 0}
        self.stamp = 0.0
        self.updated = threading.Condition()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-sys-{port}")
        self.client.on_connect = lambda c, *a: c.subscribe(
            [(t, 0) for t in (*SYS, f"{prefix}/#")])
        self.client.on_message = self._on_message
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client.connect("127.0.0.1", port)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the bench's mosquitto did not start") from None
                time.sleep(0.05)
        self.client.loop_start()
        self.settled()

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        topic = message.topic
        with self.updated:
            self.taken["own"] += 1  # every message this watcher takes is one "sent"
            if topic.startswith("$SYS/"):
                self.values[topic] = int(message.payload)
                self.stamp = time.monotonic()
                self.updated.notify_all()
                return
            kind = "status" if topic.endswith("/status") else \
                "manifest" if topic.rsplit("/", 2)[-2] == "ota" else "other"
            self.taken[kind] += 1

    def settled(self) -> dict[str, int]:
        """The counts as of a `$SYS` report begun after this call (at most ~2 s away):
        mosquitto sends its topics one after another, and only those that changed, so a
        report is over once none has come for QUIET_S."""
        asked = time.monotonic()
        with self.updated:
            if not self.updated.wait_for(lambda: len(self.values) == len(SYS) and
                                         self.stamp > asked + 1.05, 10):
                raise RuntimeError("mosquitto's $SYS counters did not come")
            while self.updated.wait_for(lambda: time.monotonic() - self.stamp > QUIET_S,
                                        QUIET_S) is False:
                pass
            return {**self.values, **self.taken}

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@contextmanager
def simulated_devices(workdir: Path, port: int, count: int, key: Path,
                      model: Path) -> Iterator[tuple[float, list[int]]]:
    """`count` agents in processes of PER_PROCESS; yields how long they took to be ready,
    and their pids."""
    started = time.monotonic()
    procs = []
    try:
        for first in range(0, count, PER_PROCESS):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tools.bench.fleet_agents", "--port", str(port),
                 "--root", str(workdir), "--key", str(key), "--model", str(model),
                 "--first", str(first), "--count", str(min(PER_PROCESS, count - first))],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("ready"):
                raise RuntimeError(f"simulated devices did not start: {line!r}")
        yield time.monotonic() - started, [proc.pid for proc in procs]
    finally:
        for proc in procs:
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in procs:
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()


class Timestamped(io.StringIO):
    """What a push command prints, each line with the time it came."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[float, str]] = []

    def write(self, text: str) -> int:
        now = time.monotonic()
        self.lines += [(now, line) for line in text.splitlines() if line]
        return super().write(text)


def rollout(mode: str, port: int, count: int, version: int, key: Path, workdir: Path,
            counters: Counters, pids: dict[str, list[int]]) -> dict[str, Any]:
    """One signed rollout with the operator's code; its time, its broker message counts and
    the CPU time each party spent (pusher: this process, with its HTTP artifact server)."""
    from edged.ops.push import Broker, Target, push
    from edged.ops.waves import push_waves

    make = tiny_model_tools()
    artifact = workdir / f"model-v{version}.onnx"
    artifact.write_bytes(make.make_tiny_cls(version - 1).SerializeToString())
    manifest = workdir / f"manifest-v{version}.json"
    manifest.write_text(json.dumps({"model": "tiny_cls", "version": version, "format": "onnx",
                                    "artifact": {}}))
    broker = Broker("127.0.0.1", port)
    out = Timestamped()
    before = counters.settled()
    cpu = {who: sum(map(cpu_seconds, procs)) for who, procs in pids.items()}
    pusher_cpu = time.process_time()
    started = time.monotonic()
    if mode == "waves":
        code = push_waves(manifest, broker, waves=WAVES, devices=[], fleet="sim/fleet",
                          watch=["sim/+"], key=key, artifact=artifact, serve_at="127.0.0.1:0",
                          url_host="127.0.0.1", timeout_s=900, out=out)
    else:
        code = push(manifest, broker, Target.of([], "sim/fleet", None, ["sim/+"], count),
                    key=key, artifact=artifact, serve_at="127.0.0.1:0", url_host="127.0.0.1",
                    timeout_s=900, out=out)
    seconds = time.monotonic() - started
    cpu = {f"{who}_cpu_s": round(sum(map(cpu_seconds, procs)) - cpu[who], 2)
           for who, procs in pids.items()}
    cpu["pusher_cpu_s"] = round(time.process_time() - pusher_cpu, 2)
    after = counters.settled()
    if code != 0:
        raise RuntimeError(f"the {mode} rollout to {count} devices failed ({code}):\n"
                           + out.getvalue()[-3000:])
    delta = {k: after[k] - before[k] for k in after}
    taken_in = delta["manifest"] + delta["status"] + delta["other"]
    cost = {"publish_in": taken_in, "manifests": delta["manifest"], "statuses": delta["status"],
            "publish_out": delta["$SYS/broker/publish/messages/sent"] - delta["own"],
            "bytes_in": delta["$SYS/broker/bytes/received"],
            "bytes_out": delta["$SYS/broker/bytes/sent"]}
    return {"mode": mode, "devices": count, "version": version, "seconds": round(seconds, 2),
            "waves": _waves(out.lines, started), **cost, **cpu,
            "publish_in_per_device": round(taken_in / count, 2),
            "publish_out_per_device": round(cost["publish_out"] / count, 2)}


def _waves(lines: list[tuple[float, str]], started: float) -> list[dict[str, Any]]:
    """Each wave's devices and seconds, from push_waves' own lines."""
    waves: list[dict[str, Any]] = []
    for when, line in lines:
        if line.startswith("wave ") and "/" in line.split(":")[0]:
            waves.append({"devices": len(line.split(":", 1)[1].split(",")), "start": when})
        elif line.startswith("wave ") and "healthy" in line and waves:
            waves[-1]["seconds"] = round(when - waves[-1].pop("start"), 2)
    return waves


def run_bench(workdir: Path, *, quick: bool = False) -> dict[str, Any]:
    from edged.ops.keys import keygen

    key = workdir / "fleet.key"
    public, _key_id = keygen(key)
    model = workdir / "model-v1.onnx"
    model.write_bytes(tiny_model_tools().make_tiny_cls(0).SerializeToString())
    cases = []
    with fleet_broker(workdir / "broker") as (port, broker_pid):
        counters = Counters(port)
        try:
            for count in QUICK_SIZES if quick else SIZES:
                root = workdir / f"fleet-{count}"
                with simulated_devices(root, port, count, public, model) as (ready_s, agents):
                    for version, mode in ((2, "waves"), (3, "fleet")):
                        case = rollout(mode, port, count, version, key, root, counters,
                                       {"broker": [broker_pid], "devices": agents})
                        case["devices_ready_s"] = round(ready_s, 1)
                        cases.append(case)
        finally:
            counters.close()
    return {"cases": cases, "waves": WAVES, "per_process": PER_PROCESS}


def format_table(results: dict[str, Any]) -> str:
    rows = [f"signed rollout of one model version to simulated devices, one mosquitto "
            f"(waves {results['waves']})",
            f"{'devices':>8} {'how':>6} {'total s':>8}  {'waves (devices: s)':<30}"
            f"{'PUBLISH in':>11} {'out':>7} {'in/dev':>7} {'out/dev':>8} {'MB in':>6} "
            f"{'MB out':>7}  {'CPU s: broker':>13} {'pusher':>7} {'devices':>8}"]
    for c in results["cases"]:
        waves = ", ".join(f"{w['devices']}: {w.get('seconds', '?')}" for w in c["waves"]) \
            if c["waves"] else "one fleet manifest"
        rows.append(f"{c['devices']:>8} {c['mode']:>6} {c['seconds']:>8.1f}  {waves:<30}"
                    f"{c['publish_in']:>11} {c['publish_out']:>7} "
                    f"{c['publish_in_per_device']:>7} {c['publish_out_per_device']:>8} "
                    f"{c['bytes_in'] / 1e6:>6.2f} {c['bytes_out'] / 1e6:>7.2f}  "
                    f"{c['broker_cpu_s']:>13.2f} {c['pusher_cpu_s']:>7.2f} "
                    f"{c['devices_cpu_s']:>8.1f}")
    return "\n".join(rows)
