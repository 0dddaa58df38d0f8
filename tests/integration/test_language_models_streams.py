"""A chat beside a running camera stream, in the running daemon: the real SmolLM2 GGUF and
PP-OCR det on a looping 640x480 video (its model busy with frames all the time). Streams
first (decision 040): the generation worker waits for the stream's inference before its
tokens, which its counters show (`yields` in the status, `edged_generation_yields_total` on
/metrics); the same GGUF served with `yield_to_streams: false` beside it never waits, and both
answer the same. Counters, never timings."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from support.daemon import Served, ServeFactory
from support.polling import wait_until

from tools.bench.assets import PPOCR_DET, ppocr_model
from tools.bench.streams import DET_YAML, write_text_video
from tools.real_models import LANGUAGE_MODEL

ASK = {"text_input": "1 2 3 4 5 6 7 8 9 10", "max_tokens": 16,
       "parameters": {"temperature": 0}}


def generate(served: Served, model: str) -> str:
    done = subprocess.run(["curl", "-sS", "--unix-socket", str(served.socket), "-H",
                           "Content-Type: application/json", "-d", json.dumps(ASK),
                           f"http://localhost/v2/models/{model}/generate"],
                          capture_output=True, text=True, timeout=120, check=True)
    text: str = json.loads(done.stdout)["text_output"]
    return text


def status(served: Served) -> dict[str, Any]:
    with served.client() as client:
        return client.status()  # type: ignore[no-any-return]


def test_generation_when_a_stream_keeps_its_model_busy_waits_for_it_between_tokens(
        make_served: ServeFactory, repo_dir: Path, real_models: Path, tmp_path: Path) -> None:
    (repo_dir / "det" / "1").mkdir(parents=True)
    shutil.copyfile(ppocr_model(PPOCR_DET), repo_dir / "det" / "1" / "model.onnx")
    (repo_dir / "det" / "model.yaml").write_text(DET_YAML)
    for name, switch in (("smol", "true"), ("smol_off", "false")):
        (repo_dir / name / "1").mkdir(parents=True)
        (repo_dir / name / "1" / "model.gguf").symlink_to(real_models / LANGUAGE_MODEL)
        (repo_dir / name / "model.yaml").write_text(
            "llm: {context: 128, threads: 1, sequences: 2, yield_max_ms: 50, "
            f"yield_to_streams: {switch}}}\n")
    video = write_text_video(tmp_path / "text.avi", fps=30)
    served = make_served(
        cache="preload: [det, smol, smol_off]",
        streams=f"[{{name: cam, source: 'file://{video}', model: det, loop: true, "
                "backpressure: drop_oldest}]")
    wait_until(lambda: status(served)["streams"]["cam"]["processed"] > 1, timeout=60,
               what="the stream's first results")
    assert generate(served, "smol") == generate(served, "smol_off")
    generations = status(served)["generations"]
    assert generations["smol"]["yields"] >= 1 and generations["smol"]["yield_s"] > 0
    assert generations["smol_off"]["yields"] == 0
    with served.client() as client:
        _, _, raw = client.request("GET", "/metrics")
    metrics = raw.decode()
    for model, test in (("smol", lambda v: v >= 1), ("smol_off", lambda v: v == 0)):
        found = re.search(rf'^edged_generation_yields_total\{{model="{model}"\}} (\S+)$',
                          metrics, re.M)
        assert found is not None and test(float(found.group(1)))
    assert re.search(r'^edged_generation_yield_seconds_total\{model="smol"\} ', metrics, re.M)
    assert re.search(r'^edged_generation_preempted_total\{model="smol"\} 0\.0$', metrics, re.M)
