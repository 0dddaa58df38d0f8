"""`python -m tools.bench live` (also the last part of `streams`): what a live view costs, and
that nobody watching costs nothing.

edged runs as a real subprocess (`edged run`) with one detect stream: squares crossing a
640x640 MJPG video at 10 fps through grid_det, tracked into events, with a zone and a line, as
the demo's crossing stream. In rounds, interleaved so that the machine's drift touches every
case alike, it is watched by 0, 1 and 3 clients of `live.mjpeg` (each its own connection,
reading every part), and per case the bench reads

- the stream's own thread's CPU per processed frame (`pipeline-cam` in /proc, schedstat ns):
  the inference path, which must not change when someone watches;
- the whole process's CPU per processed frame: what the viewers do cost, elsewhere;
- the parts each viewer received a second (capped by api.live_fps) and the pictures edged drew
  a second (each shared by every viewer of its frame and size: 1 or 3 viewers, one drawing).
"""

from __future__ import annotations

import http.client
import statistics
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from tools.bench.api import edged_config, run_edged
from tools.bench.assets import tiny_model_tools
from tools.bench.broker import free_port

CASES = (0, 1, 3)  # viewers
LIVE_FPS = 5
VIDEO_FPS = 10.0
CELL = 160  # 4 x 160 = 640 pixels square


class Viewer:
    """A live.mjpeg client on a thread, counting the parts it reads."""

    def __init__(self, address: str, stream: str) -> None:
        host, port = address.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        self.conn.request("GET", f"/v2/edged/streams/{stream}/live.mjpeg")
        self.answer = self.conn.getresponse()
        if self.answer.status != 200:
            raise RuntimeError(f"live.mjpeg answered {self.answer.status}")
        self.parts = 0
        self._stop = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while not self._stop:
                line = self.answer.readline()
                if not line:
                    return
                if line.lower().startswith(b"content-length:"):
                    while self.answer.readline() not in (b"\r\n", b""):
                        pass  # the part's other headers
                    self.answer.read(int(line.split(b":")[1]))
                    self.parts += 1
        except OSError:
            return

    def close(self) -> None:
        self._stop = True
        self.answer.close()
        self.conn.close()
        self._thread.join(10)


def cpu_ns(pid: int) -> tuple[int, int]:
    """(the stream thread's, every thread's) CPU time so far, ns (/proc schedstat)."""
    total, pipeline = 0, 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ns = int((task / "schedstat").read_text().split()[0])
            name = (task / "comm").read_text().strip()
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        total += ns
        if name.startswith("pipeline-cam"):
            pipeline += ns
    return pipeline, total


def counters(address: str) -> tuple[float, float]:
    """(frames processed, pictures drawn) of the stream, from /metrics."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found = {}
    for line in text.splitlines():
        for key in ("edged_stream_frames_processed_total", "edged_live_pictures_total"):
            if line.startswith(key + '{stream="cam"}'):
                found[key] = float(line.rsplit(" ", 1)[1])
    return found["edged_stream_frames_processed_total"], found["edged_live_pictures_total"]


def window(address: str, pid: int, viewers: int, seconds: float, settle_s: float
           ) -> dict[str, float]:
    clients = [Viewer(address, "cam") for _ in range(viewers)]
    try:
        time.sleep(settle_s)  # the viewers' first parts (and their connections) not counted
        frames0, pictures0 = counters(address)
        pipe0, total0 = cpu_ns(pid)
        parts0 = [c.parts for c in clients]
        start = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - start
        frames1, pictures1 = counters(address)
        pipe1, total1 = cpu_ns(pid)
        parts = [c.parts - p for c, p in zip(clients, parts0, strict=True)]
    finally:
        for client in clients:
            client.close()
    frames = max(frames1 - frames0, 1.0)
    return {"viewers": viewers, "processed_fps": frames / elapsed,
            "pipeline_ms_per_frame": (pipe1 - pipe0) / 1e6 / frames,
            "process_ms_per_frame": (total1 - total0) / 1e6 / frames,
            "parts_per_viewer_s": statistics.fmean(parts) / elapsed if parts else 0.0,
            "pictures_s": (pictures1 - pictures0) / elapsed}


def run_live(workdir: Path, *, quick: bool) -> dict[str, Any]:
    from tools.assets import demo as demo_assets

    workdir.mkdir(parents=True, exist_ok=True)
    tiny_model_tools().write_repository(workdir / "models", names=["grid_det"])
    passes = [demo_assets.Pass(colour, row, leftwards=row % 2 == 1)
              for row in range(4) for colour in ("red", "green", "blue")]
    video = demo_assets.write_crossing_video(workdir / "crossing.avi", passes, fps=VIDEO_FPS,
                                           cell=CELL, gap_frames=2)
    address = f"127.0.0.1:{free_port()}"
    side = 4 * CELL
    stream = (f"[{{name: cam, source: 'file://{video}', model: grid_det, loop: true, "
              f"labels: [red, green, blue], zones: [{{name: right, polygon: [[{side // 2}, 0], "
              f"[{side}, 0], [{side}, {side}], [{side // 2}, {side}]]}}], lines: [{{name: "
              f"middle, points: [[{side // 2}, {side}], [{side // 2}, 0]]}}], "
              # every frame through the model, as before the change gate: CPU per frame
              # compares across runs (`tools.bench gate` measures the gate)
              f"gate: {{enabled: false}}}}]")
    config = edged_config(workdir, preload=["grid_det"], http=address, streams=stream)
    config = config.replace("api: {", f"api: {{live_fps: {LIVE_FPS}, ", 1)
    rounds, seconds, settle = (1, 2.0, 0.5) if quick else (3, 8.0, 1.5)
    rows: dict[int, list[dict[str, float]]] = {n: [] for n in CASES}
    with run_edged(workdir, config) as (_, proc):
        time.sleep(settle * 2)  # warm: the tracker's first objects, the first pictures
        for _ in range(rounds):
            for viewers in CASES:
                rows[viewers].append(window(address, proc.pid, viewers, seconds, settle))
    means = [{key: statistics.fmean(r[key] for r in measured) for key in measured[0]}
             for measured in rows.values()]
    base = means[0]
    cases: list[dict[str, Any]] = []
    for mean, measured in zip(means, rows.values(), strict=True):
        cases.append({**mean, "rounds": measured,
                      "pipeline_vs_unwatched": mean["pipeline_ms_per_frame"]
                      / max(base["pipeline_ms_per_frame"], 1e-9),
                      "process_vs_unwatched": mean["process_ms_per_frame"]
                      / max(base["process_ms_per_frame"], 1e-9)})
    return {"video": f"{side}x{side} MJPG at {VIDEO_FPS:g} fps, grid_det, events, a zone and "
                     "a line", "live_fps": LIVE_FPS, "rounds": rounds, "window_s": seconds,
            "cases": cases}


def run_bench(workdir: Path, *, quick: bool) -> dict[str, Any]:
    return run_live(workdir / "live", quick=quick)


def format_table(r: dict[str, Any]) -> str:
    lines = [f"\nlive view ({r['video']}; live_fps {r['live_fps']}; {r['rounds']} rounds of "
             f"{r['window_s']:g} s per case, interleaved)",
             "| viewers | processed fps | stream thread CPU ms/frame | vs unwatched | "
             "process CPU ms/frame | vs unwatched | parts/s per viewer | pictures drawn/s |",
             "|---|---|---|---|---|---|---|---|"]
    for c in r["cases"]:
        lines.append(f"| {c['viewers']:.0f} | {c['processed_fps']:.1f} | "
                     f"{c['pipeline_ms_per_frame']:.3f} | {c['pipeline_vs_unwatched']:.2f} | "
                     f"{c['process_ms_per_frame']:.3f} | {c['process_vs_unwatched']:.2f} | "
                     f"{c['parts_per_viewer_s']:.2f} | {c['pictures_s']:.2f} |")
    return "\n".join(lines)
