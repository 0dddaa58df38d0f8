"""A power cut mid-clip: `edged run` as a subprocess records clips from an RTSP camera
(Debian's GStreamer server) and is SIGKILLed while one clip is finished and another is still
being written; started again, it serves the finished clip whole (ffprobe) and never the cut
one, which is gone from the disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from support.polling import wait_until
from support.video import crossing_h264, ffprobe, rtsp_server

from edged.ops.client import EdgedClient
from tools.assets import models as test_models


def start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "edged.cli", "run", "--config",
                                 str(config)], stdout=out, stderr=out)


def wait_ready(client: EdgedClient, proc: subprocess.Popen[bytes], log: Path) -> None:
    def ready() -> bool:
        try:
            return client.ready()
        except OSError:
            return False

    wait_until(ready, timeout=60, interval=0.1, what="edged ready",
               alive=lambda: proc.poll() is None, details=lambda: log.read_text())


def test_daemon_when_killed_mid_clip_serves_only_whole_clips_after_restart(
        repo_dir: Path, short_dir: Path, tmp_path: Path) -> None:
    test_models.write_repository(repo_dir, names=["grid_det"])
    video = crossing_h264(tmp_path)
    recordings = tmp_path / "recordings"
    folder = recordings / "door"
    sock = short_dir / "k.sock"
    log = tmp_path / "edged.log"
    with rtsp_server(video) as url:
        config = tmp_path / "edged.yaml"
        config.write_text(f"""device_id: crash
models_dir: {repo_dir}
cache: {{dir: {tmp_path / 'cache'}, preload: [grid_det]}}
backends: {{onnxruntime: {{providers: [cpu], intra_op_threads: 1}}}}
api: {{socket: {sock}}}
mqtt: {{enabled: false}}
recording: {{dir: {recordings}}}
streams:
  - {{name: door, source: '{url}', model: grid_det, labels: [red, blue],
     clips: {{enabled: true, pre_capture_s: 1, post_capture_s: 1.5}}}}
""")
        proc = start(config, log)
        try:
            with EdgedClient(sock, timeout_s=10) as client:
                wait_ready(client, proc, log)

            def one_whole_one_cut() -> tuple[list[Path], list[Path]] | None:
                whole = sorted(folder.glob("*.mp4")) if folder.is_dir() else []
                cut = sorted(folder.glob("*.mp4.part")) if folder.is_dir() else []
                return (whole, cut) if whole and cut else None

            whole, cut = wait_until(one_whole_one_cut, timeout=60, interval=0.02,
                                    what="a finished clip and one being written",
                                    alive=lambda: proc.poll() is None,
                                    details=lambda: log.read_text())
            os.kill(proc.pid, signal.SIGKILL)  # a power cut
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        assert all(p.exists() for p in cut), "the cut clip is on disk until the restart"

        proc = start(config, log)
        try:
            with EdgedClient(sock, timeout_s=10) as client:
                wait_ready(client, proc, log)
                status, _, body = client.request("GET", "/v2/edged/clips?stream=door")
                assert status == 200
                listed = json.loads(body)["clips"]
                cut_ids = {p.name.removesuffix(".mp4.part") for p in cut}
                assert {c["id"] for c in listed} >= {p.stem for p in whole}
                assert not cut_ids & {c["id"] for c in listed}
                for row in listed:
                    status, _, data = client.request("GET", row["url"])
                    assert status == 200 and len(data) == row["size"]
                    saved = tmp_path / f"{row['id']}.mp4"
                    saved.write_bytes(data)
                    probe = ffprobe(saved)
                    assert probe["frames"][0]["key_frame"] == 1
                    assert len(probe["frames"]) == row["packets"]
                for cid in cut_ids:
                    status, _, _ = client.request("GET", f"/v2/edged/clips/{cid}")
                    assert status == 404
            assert not any(p.exists() for p in cut), "the cut clip was dropped at start"
            assert "dropped: cut short" in log.read_text()
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
