"""Camera streams beside a chat, streams first or not (decision 040), in one daemon and one
run (`python -m tools.bench llm_streams`, also the last part of `llm`): four PP-OCR det
streams (ONNX Runtime, one instance of 1 intra-op thread, a looping 640x480 video offered at
twice the model's rate, so it is never idle; results counted at a real MQTT subscriber) and the
corpus's
SmolLM2 GGUF served twice (1 thread each, `llm.nice` at its default): `smol` with
`yield_to_streams: true` (the default) and `smol_off` with it false.

Each round measures the model-bound rate (the daemon SIGSTOPped, the same model run directly
on one thread, as `tools.bench streams` does), then three windows in an order that rotates
round to round: no chat, a client generating on `smol`, a client generating on `smol_off`.
Reported per window kind, medians over the rounds: the four streams' achieved fps, achieved /
model-bound, and the chat's streamed pieces per second (about a token each) within the window.
The client is cut when its window ends (the daemon stops its answer within a token), so
no chat spills into the next window."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from tools.bench.api import direct_session, edged_config, run_edged
from tools.bench.assets import PPOCR_DET, ppocr_model
from tools.bench.broker import loopback_broker
from tools.bench.streams import (
    DET_YAML,
    ResultCollector,
    det_input,
    model_bound_fps,
    write_text_video,
)
from tools.real_models import LANGUAGE_MODEL, ensure

STREAMS = 4
OFFERED = 2.0  # offered frames / model-bound fps: the det model is never idle
KINDS = ("alone", "yield_on", "yield_off")
MODEL_OF = {"yield_on": "smol", "yield_off": "smol_off"}
YIELD_MAX_MS = int(os.environ.get("EDGED_BENCH_YIELD_MAX_MS", "50"))  # 50: the default
# The threads split by config: the cameras' model one instance of one thread (a core), the
# chat one llama.cpp thread (the other core). EDGED_BENCH_DET_INSTANCES=2: the cameras' model
# on both cores, the chat's thread competing with them (no split).
DET_INSTANCES = int(os.environ.get("EDGED_BENCH_DET_INSTANCES", "1"))


class Talker:
    """A client that keeps asking for a streamed completion until stopped (its connection cut
    then); the times its pieces of text arrived."""

    def __init__(self, sock: Path, model: str, tag: str) -> None:
        self._sock, self._model, self._tag = sock, model, tag
        self._stop = threading.Event()
        self._conn: socket.socket | None = None
        self.pieces: list[float] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            body = json.dumps({"model": self._model, "prompt": f"Chat {self._tag}.{n}: tell "
                               "a long story about a lighthouse", "max_tokens": 128,
                               "temperature": 0, "stream": True}).encode()
            head = (f"POST /v1/completions HTTP/1.1\r\nHost: edged\r\nContent-Type: "
                    f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
            n += 1
            with socket.socket(socket.AF_UNIX) as conn:
                self._conn = conn
                try:
                    conn.connect(str(self._sock))
                    conn.sendall(head + body)
                    self._read(conn)
                except OSError:
                    return  # cut by stop()

    def _read(self, conn: socket.socket) -> None:
        buffer = b""
        while data := conn.recv(65536):
            now = time.perf_counter()
            buffer += data
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                line = event.split(b"data: ", 1)[-1]
                if line == b"[DONE]" or not line.startswith(b"{"):
                    continue
                chunk = json.loads(line)
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    self.pieces.append(now)

    def stop(self) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(30)


def write_models(models: Path) -> None:
    gguf = ensure() / LANGUAGE_MODEL
    (models / "det" / "1").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ppocr_model(PPOCR_DET), models / "det" / "1" / "model.onnx")
    (models / "det" / "model.yaml").write_text(DET_YAML + f"instances: {DET_INSTANCES}\n")
    for name, switch in (("smol", "true"), ("smol_off", "false")):
        (models / name / "1").mkdir(parents=True, exist_ok=True)
        link = models / name / "1" / "model.gguf"
        if not link.exists():
            link.symlink_to(gguf)
        (models / name / "model.yaml").write_text(
            f"llm: {{context: 512, threads: 1, batch_threads: 1, yield_max_ms: {YIELD_MAX_MS}, "
            f"yield_to_streams: {switch}}}\n")


def run_bench(workdir: Path, *, quick: bool) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    models = workdir / "models"
    write_models(models)
    rounds, window, settle, bound_s = (1, 2.0, 0.5, 0.5) if quick else (8, 4.0, 1.0, 1.5)
    probe = write_text_video(workdir / "probe.avi", fps=10, seconds=0.2)
    session = direct_session(models / "det" / "1" / "model.onnx")
    x = det_input(probe)
    first = max(model_bound_fps(session, x, bound_s) for _ in range(3))
    fps = round(OFFERED * first / STREAMS, 1)
    video = write_text_video(workdir / "text.avi", fps=fps)
    rows: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    streams = ", ".join(f"{{name: cam{i}, source: 'file://{video}', model: det, loop: true, "
                        "backpressure: drop_oldest}" for i in range(STREAMS))
    started = time.perf_counter()
    with loopback_broker(workdir / "broker") as (port, _):
        prefix = "benchllmstreams"
        config = edged_config(workdir, preload=["det", "smol", "smol_off"],
                              streams=f"[{streams}]",
                              mqtt=f"host: 127.0.0.1, port: {port}, prefix: {prefix}, "
                                   "qos_results: 1")
        collector = ResultCollector(port, prefix)
        try:
            with run_edged(workdir, config) as (sock, proc):
                collector.window(2.0)  # warm
                for i in range(rounds):
                    proc.send_signal(signal.SIGSTOP)
                    try:
                        bound = model_bound_fps(session, x, bound_s)
                    finally:
                        proc.send_signal(signal.SIGCONT)
                    for kind in KINDS[i % 3:] + KINDS[:i % 3]:
                        talker = Talker(sock, MODEL_OF[kind], f"{i}{kind}") \
                            if kind in MODEL_OF else None
                        collector.window(settle)  # the chat under way (or gone)
                        t0 = time.perf_counter()
                        results = len(collector.window(window))
                        t1 = time.perf_counter()
                        pieces = 0
                        if talker is not None:
                            talker.stop()
                            pieces = sum(t0 <= t <= t1 for t in talker.pieces)
                        achieved = results / (t1 - t0)
                        rows[kind].append({"fps": achieved, "bound_fps": bound,
                                           "vs_bound": achieved / bound,
                                           "chat_pieces_per_s": pieces / (t1 - t0)})
                with _client(sock) as client:
                    generations = client.status()["generations"]
        finally:
            collector.close()
    summary: dict[str, Any] = {
        "streams": STREAMS, "rounds": rounds, "window_s": window, "offered_fps": fps * STREAMS,
        "yield_max_ms": YIELD_MAX_MS, "det_instances": DET_INSTANCES,
        "wall_s": time.perf_counter() - started, "rows": rows,
        "counters": {m: {k: generations.get(m, {}).get(k) for k in
                         ("yields", "yield_s", "tokens", "cancelled")}
                     for m in MODEL_OF.values()}}
    for kind, measured in rows.items():
        summary[kind] = {key: statistics.median(r[key] for r in measured)
                         for key in ("fps", "bound_fps", "vs_bound", "chat_pieces_per_s")}
    alone = summary["alone"]["vs_bound"]
    for kind in MODEL_OF:
        summary[kind]["vs_alone"] = summary[kind]["vs_bound"] / alone if alone else 0.0
        summary[kind]["vs_alone_per_round"] = statistics.median(  # each round its own alone
            b["vs_bound"] / a["vs_bound"] for a, b in zip(rows["alone"], rows[kind],
                                                          strict=True) if a["vs_bound"])
    return summary


def _client(sock: Path) -> Any:
    from edged.ops.client import EdgedClient

    return EdgedClient(sock, timeout_s=30)


def format_table(r: dict[str, Any]) -> str:
    lines = [
        f"{r['streams']} PP-OCR det streams ({r['det_instances']} instance(s) of 1 ORT thread; "
        f"offered {r['offered_fps']:.1f} fps all together) beside a chat (SmolLM2, 1 "
        "llama.cpp thread), one daemon; medians of "
        f"{r['rounds']} rounds of {r['window_s']:.0f} s windows, interleaved; the run took "
        f"{r['wall_s']:.0f} s",
        "| windows | streams' fps | model-bound fps | achieved / model-bound | vs no chat | "
        "vs no chat, median of rounds | chat pieces/s (about tokens/s) |",
        "|---|---|---|---|---|---|---|"]
    names = {"alone": "no chat", "yield_on": "a chat, yield_to_streams on "
             f"(yield_max_ms {r['yield_max_ms']})", "yield_off": "a chat, yield_to_streams off"}
    for kind in KINDS:
        row = r[kind]
        vs = f"{row['vs_alone']:.2f}x" if "vs_alone" in row else ""
        per = f"{row['vs_alone_per_round']:.2f}x" if "vs_alone" in row else ""
        chat = f"{row['chat_pieces_per_s']:.1f}" if kind != "alone" else ""
        lines.append(f"| {names[kind]} | {row['fps']:.2f} | {row['bound_fps']:.2f} | "
                     f"{row['vs_bound']:.3f} | {vs} | {per} | {chat} |")
    for kind in MODEL_OF:
        ratios = [m["vs_bound"] for m in r["rows"][kind]]
        alone = [m["vs_bound"] for m in r["rows"]["alone"]]
        lines.append(f"{kind}: per round, achieved/model-bound beside the chat / alone: "
                     + ", ".join(f"{a / b:.2f}" for a, b in zip(ratios, alone, strict=True)))
    lines.append(f"counters: {json.dumps(r['counters'])}")
    return "\n".join(lines)
