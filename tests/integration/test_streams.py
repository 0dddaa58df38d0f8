"""Streams end to end: real video written by OpenCV and a real HTTP MJPEG server on 127.0.0.1,
the daemon in-process, a real private mosquitto and a real subscriber. Results follow the
published JSON Schema and are right; a camera that goes away is reported and comes back;
malformed sensor payloads are rejected and counted while the stream goes on."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.backends import GateBackend
from support.broker import Broker, Received, Subscriber
from support.daemon import ServeFactory
from support.polling import wait_until

from edged.sources import SourceState
from tools.assets.demo import COLORS_BGR, color_of, write_color_video

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "schemas" /
                     "stream-result.schema.json").read_text())


def results_of(sub: Subscriber, topic: str, count: int, timeout: float = 20) -> list[dict]:
    messages = sub.collect(topic, until=lambda got: len(got) >= count, timeout=timeout,
                           what=f"{count} results")
    return [json.loads(m.payload) for m in messages]


def test_stream_when_a_video_plays_publishes_right_results_in_the_schema(
        broker: Broker, make_served: ServeFactory, tmp_path: Path) -> None:
    video = write_color_video(tmp_path / "colors.avi", fps=60, frames_per_color=10)
    topic = "t/video/streams/cam/results"
    sub = Subscriber(broker, topic)
    try:
        served = make_served(
            mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: t/video, qos_results: 1",
            streams=f"[{{name: cam, source: 'file://{video}', model: colors, loop: true, "
                    "backpressure: block}]")
        results = results_of(sub, topic, 40)
    finally:
        sub.close()
    for message in results:
        jsonschema.validate(message, SCHEMA)
        frame_index = (message["seq"] - 1) % 30
        assert message["results"]["classes"][0]["label"] == color_of(frame_index, 10)
        assert message["frame"] == {"width": 320, "height": 240}
        assert message["backend"] == "onnxruntime:CPUExecutionProvider"
    seqs = [m["seq"] for m in results]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    stats = served.daemon.pipelines[0].read_stats().as_dict()
    assert stats["dropped"] == 0  # `block` drops nothing


def test_stream_when_frames_flowed_metrics_and_the_stats_message_count_them(
        broker: Broker, make_served: ServeFactory, tmp_path: Path) -> None:
    video = write_color_video(tmp_path / "colors.avi", fps=60, frames_per_color=10)
    stats_topic = "t/metrics/stats"
    sub = Subscriber(broker, stats_topic)
    try:
        served = make_served(
            cache="preload: [colors]",
            mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: t/metrics, "
                 "stats_interval_s: 0.2",
            streams=f"[{{name: cam, source: 'file://{video}', model: colors, loop: true}}]")

        def counted(got: list[Received]) -> bool:
            stats = json.loads(got[-1].payload)
            return bool(stats.get("streams", {}).get("cam", {}).get("processed") and
                        stats["mqtt"]["published_by_class"].get("results"))

        stats = json.loads(sub.collect(stats_topic, until=counted, timeout=30,
                                       what="stats counting processed and published frames")
                           [-1].payload)
        with served.client() as client:
            text = client.metrics()
    finally:
        sub.close()
    colors = stats["models"]["colors"]
    assert (colors["version"], colors["state"], colors["backend"], colors["loads"],
            colors["failed_loads"], colors["evictions"]) == (1, "READY", "onnxruntime", 1, 0, 0)
    assert colors["load_s"] > 0
    assert stats["process"]["rss_bytes"] > 0 and stats["process"]["uptime_s"] >= 0
    for gpu in stats.get("gpus", []):  # only where NVML sees a GPU
        assert gpu["memory_total_bytes"] >= gpu["memory_used_bytes"]
    assert {"published", "buffered", "dropped"} <= set(stats["mqtt"])

    found = {(m.name, tuple(sorted(m.labels.items()))): m.value
             for family in text_string_to_metric_families(text) for m in family.samples}
    cam = (("stream", "cam"),)
    # The scrape came after the stats message: counters only grow.
    assert found[("edged_stream_frames_in_total", cam)] >= stats["streams"]["cam"]["frames_in"]
    assert found[("edged_stream_frames_processed_total", cam)] >= \
        stats["streams"]["cam"]["processed"] > 0
    assert found[("edged_stream_frames_failed_total", cam)] == 0
    assert found[("edged_stream_reconnects_total", cam)] == 0
    assert found[("edged_stream_up", cam)] == 1
    assert ("edged_stream_queue_depth", cam) in found
    assert found[("edged_model_loads_total", (("model", "colors"), ("outcome", "ok")))] == 1
    assert found[("edged_model_evictions_total", (("model", "colors"),))] == 0
    assert found[("edged_model_load_duration_seconds",
                  (("model", "colors"), ("version", "1")))] == pytest.approx(colors["load_s"],
                                                                            abs=1e-3)
    assert found[("edged_mqtt_published_total", (("class", "results"),))] > 0
    assert found[("edged_mqtt_connected", ())] == 1
    assert ("edged_mqtt_queued", ()) in found
    assert found[("process_resident_memory_bytes", ())] > 0


class MjpegServer:
    """multipart/x-mixed-replace JPEG frames, as IP cameras serve them; stop() drops every
    client, start() comes back on the same port. The first start binds port 0: the kernel
    picks a free port and no one can take it between picking and binding."""

    def __init__(self) -> None:
        import cv2

        self.port = 0
        frame = np.empty((120, 160, 3), np.uint8)
        frame[:] = COLORS_BGR["green"]
        self.jpeg = cv2.imencode(".jpg", frame)[1].tobytes()
        self.server: ThreadingHTTPServer | None = None
        self.running = threading.Event()

    def start(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
                self.end_headers()
                try:
                    while owner.running.is_set():
                        self.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\n"
                                         b"Content-Length: %d\r\n\r\n" % len(owner.jpeg))
                        self.wfile.write(owner.jpeg + b"\r\n")
                        time.sleep(1 / 30)
                except OSError:
                    pass

            def log_message(self, *args: object) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        self.server.daemon_threads = True
        self.running.set()
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.running.clear()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


@pytest.fixture
def camera() -> Iterator[MjpegServer]:
    server = MjpegServer()
    server.start()
    yield server
    server.stop()


def test_stream_when_the_camera_goes_away_reports_it_and_resumes_within_the_backoff_bound(
        camera: MjpegServer, make_served: ServeFactory) -> None:
    served = make_served(streams=f"[{{name: door, source: 'http://127.0.0.1:{camera.port}/', "
                                 "model: colors, watchdog_s: 2, backoff_initial_s: 0.2, "
                                 "backoff_max_s: 1.0}]")
    pipeline = served.daemon.pipelines[0]
    assert pipeline.source.wait_state(SourceState.STREAMING, 15)
    camera.stop()
    assert pipeline.source.wait_state(SourceState.RECONNECTING, 15)
    gone = pipeline.read_stats().as_dict()
    assert gone["reconnects"] >= 1 and gone["state"] in ("reconnecting", "connecting")
    processed = gone["processed"]
    camera.start()
    returned = time.monotonic()
    assert pipeline.source.wait_state(SourceState.STREAMING, 15)
    # Back within one capped backoff (1 s) plus one open attempt (watchdog 2 s) and slack.
    assert time.monotonic() - returned < 1.0 + 2.0 + 5.0
    wait_until(lambda: pipeline.read_stats().as_dict()["processed"] > processed, timeout=10,
               interval=0.05, what="frames processed again after the camera came back")


def test_sensor_stream_when_payloads_are_malformed_rejects_counts_and_goes_on(
        broker: Broker, make_served: ServeFactory, caplog: pytest.LogCaptureFixture) -> None:
    topic = "t/sensor/streams/vib/results"
    sub = Subscriber(broker, topic)
    try:
        served = make_served(
            mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: t/sensor",
            streams="[{name: vib, source: 'mqtt://t/sensor/in/vib', model: tiny_nobatch, "
                    "backpressure: block}]")
        assert served.daemon.mqtt is not None and served.daemon.mqtt.wait_connected(10)
        pipeline = served.daemon.pipelines[0]
        assert pipeline.source.wait_state(SourceState.CONNECTING, 5)
        bad = [b"not json", b"{\"a\": 1}", b"[1, 2]", b"[1, 2, \"x\", 4]", b"[1, 2, NaN, 4]",
               b"[[1, 2, 3, 4]]", b"\xff\xfe"]

        def publish(payload: bytes) -> dict | None:
            """Publish, then the next result (None if none came within a second)."""
            sub.client.publish("t/sensor/in/vib", payload, qos=1).wait_for_publish(5)
            try:
                return json.loads(sub.wait_for(topic, 1).payload)
            except queue.Empty:
                return None

        def outputs(result: dict) -> object:
            return result["results"]["outputs"]["out"].get("data")

        # A well-formed payload until one is answered: the stream's subscription is in place
        # from then on, so none of the malformed ones below can be lost before it.
        probe = wait_until(lambda: publish(b"[1, 2, 3, 4]"), timeout=15, interval=0,
                           what="a result: the stream subscribed")
        for payload in bad:
            sub.client.publish("t/sensor/in/vib", payload, qos=1).wait_for_publish(5)
        sub.client.publish("t/sensor/in/vib", b"[4, 3, 2, 1]", qos=1).wait_for_publish(5)
        # The last payload's result, told apart from late answers to the probes by its
        # outputs: the stream takes payloads in order, so the malformed ones are dealt with.
        message = json.loads(sub.collect(
            topic, until=lambda got: outputs(json.loads(got[-1].payload)) != outputs(probe),
            timeout=10, what="the result of the last payload")[-1].payload)
        jsonschema.validate(message, SCHEMA)
        assert message["results"]["outputs"]["out"]["shape"] == [4]
        snapshot = pipeline.read_stats().as_dict()
        assert snapshot["rejected"] >= len(bad) and snapshot["processed"] >= 1
        assert "rejected payload" in caplog.text and "expected a JSON array" in caplog.text
    finally:
        sub.close()


def test_daemon_when_killed_leaves_offline_as_its_last_will(
        broker: Broker, repo_dir: Path, short_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "edged.yaml"
    config.write_text(f"""device_id: lwt
models_dir: {repo_dir}
cache: {{dir: {tmp_path / 'cache'}, preload: []}}
api: {{socket: {short_dir / 'e.sock'}}}
mqtt: {{host: 127.0.0.1, port: {broker.port}, prefix: t/lwt}}
""")
    sub = Subscriber(broker, "t/lwt/status")
    proc = subprocess.Popen([sys.executable, "-m", "edged.cli", "run", "--config", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert sub.wait_for("t/lwt/status", 30).payload == b"online"
        proc.kill()  # no DISCONNECT: the broker publishes the will when the connection drops
        proc.wait(10)
        assert sub.wait_for("t/lwt/status", 60).payload == b"offline"
        late = Subscriber(broker, "t/lwt/status")  # and keeps it, retained, for newcomers
        try:
            assert late.wait_for("t/lwt/status", 10).payload == b"offline"
        finally:
            late.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        sub.close()


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_stream_when_the_model_is_slower_than_the_camera_drops_and_keeps_memory_flat(
        gate: GateBackend, make_served: ServeFactory, tmp_path: Path) -> None:
    video = write_color_video(tmp_path / "big.avi", fps=120, frames_per_color=20,
                              size=(640, 480))  # 0.9 MB per frame: a leak would show at once
    served = make_served(cache="preload: [colors]",
                         streams=f"[{{name: fast, source: 'file://{video}', model: colors, "
                                 "loop: true, queue: 2, in_flight: 2}]")
    pipeline = served.daemon.pipelines[0]
    gate.gate.clear()  # the model now takes as long as the test wants

    def dropped(n: int) -> dict | None:
        row = pipeline.read_stats().as_dict()
        assert row["queue_depth"] <= 2
        return row if row["dropped"] >= n else None

    wait_until(lambda: dropped(20), timeout=30, what="20 frames dropped")
    before = rss_bytes()
    row = wait_until(lambda: dropped(220), timeout=30,
                     what="220 frames dropped: the source should keep capturing (and dropping)")
    grown = rss_bytes() - before
    assert grown < 50 * 1024 * 1024, f"RSS grew {grown / 2**20:.0f} MB over 200 dropped frames"
    processed = row["processed"]
    gate.gate.set()
    wait_until(lambda: pipeline.read_stats().as_dict()["processed"] > processed, timeout=10,
               what="frames processed again once the model was released")


def _broker_restart_mid_stream(broker: Broker, make_served: ServeFactory, tmp_path: Path,
                               prefix: str, buffer: int) -> tuple[set[int], int, dict]:
    """A 20 fps video stream publishing QoS 1 results; the broker goes away for 40 frames and
    comes back. Returns the seqs a persistent subscriber got up to a seq published well after
    the reconnect, that seq, and the daemon's last stats message."""
    video = write_color_video(tmp_path / "c.avi", fps=20, frames_per_color=10)
    results, stats_topic = f"{prefix}/streams/cam/results", f"{prefix}/stats"
    sub = Subscriber(broker, results, stats_topic, client_id=f"{prefix}-sub", persistent=True)
    try:
        served = make_served(
            cache="preload: [colors]",
            mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}, qos_results: 1, "
                 f"buffer_messages: {buffer}, stats_interval_s: 0.5",
            streams=f"[{{name: cam, source: 'file://{video}', model: colors, loop: true, "
                    "backpressure: block}]")  # every frame is published: seqs are 1, 2, 3...
        link, pipeline = served.daemon.mqtt, served.daemon.pipelines[0]
        assert link is not None
        seqs = {json.loads(sub.wait_for(results, 20).payload)["seq"]}
        broker.stop()
        wait_until(lambda: not link.stats()["connected"], timeout=10,
                   what="the link noticed the broker is gone")
        outage_start = pipeline.read_stats().as_dict()["processed"]
        wait_until(lambda: pipeline.read_stats().as_dict()["processed"] >= outage_start + 40,
                   timeout=30, interval=0.05,
                   what="40 frames while offline: the stream stalled while offline")
        broker.start()
        assert link.wait_connected(40)  # paho's reconnect delay is capped at 30 s
        end = pipeline.read_stats().as_dict()["processed"] + 10
        last_stats: dict = {}

        def through_end(got: list[Received]) -> bool:
            nonlocal last_stats
            if got[-1].topic == results:
                seqs.add(json.loads(got[-1].payload)["seq"])
            else:
                last_stats = json.loads(got[-1].payload)
            return max(seqs) >= end

        sub.collect(until=through_end, timeout=60, what=f"results up to seq {end}")

        def flushed(stats: dict) -> bool:  # a stats message from after the flush
            return ("mqtt" in stats and not stats["mqtt"]["buffered"]
                    and stats["mqtt"]["connected"])

        if not flushed(last_stats):
            last_stats = json.loads(sub.collect(
                stats_topic, until=lambda got: flushed(json.loads(got[-1].payload)), timeout=60,
                what="stats from after the flush")[-1].payload)
        return seqs, end, last_stats
    finally:
        sub.close()
        if broker.process is None:
            broker.start()


def test_stream_when_the_broker_restarts_loses_no_qos1_result_within_the_buffer(
        broker: Broker, make_served: ServeFactory, tmp_path: Path) -> None:
    seqs, end, stats = _broker_restart_mid_stream(broker, make_served, tmp_path, "t/rs1", 1000)
    first = min(seqs)
    assert set(range(first, end + 1)) <= seqs, \
        f"missing results: {sorted(set(range(first, end + 1)) - seqs)}"
    assert stats["mqtt"]["dropped"] == 0 and stats["mqtt"]["disconnects"] == 1


def test_stream_when_the_broker_stays_away_past_the_buffer_reports_what_was_dropped(
        broker: Broker, make_served: ServeFactory, tmp_path: Path) -> None:
    seqs, end, stats = _broker_restart_mid_stream(broker, make_served, tmp_path, "t/rs2", 5)
    missing = set(range(min(seqs), end + 1)) - seqs
    dropped = stats["mqtt"]["dropped_by_class"].get("results", 0)
    assert dropped > 0 and len(missing) == dropped, (sorted(missing), stats["mqtt"])
    assert stats["streams"]["cam"]["dropped"] == 0  # the stream itself lost nothing
