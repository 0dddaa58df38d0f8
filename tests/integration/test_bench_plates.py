"""`python -m tools.bench plates`, run quick: it prints its table, writes its JSON, reads the
same plates as agentclpr's own path and measures every stage and both streams (speed itself
is never asserted here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.bench.__main__ import main as bench


def test_bench_plates_when_run_quick_reads_agentclprs_texts_and_times_every_stage(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench(["plates", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "the same text as agentclpr: True" in out and "segment / detect" in out
    results = json.loads((tmp_path / "plates.json").read_text())
    plates, streams = results["plates"], results["streams"]
    assert plates["plates"] == 2 and "MLB803" in plates["texts"]
    assert plates["same_text_as_agentclpr"] is True
    for stage in ("warp_ms", "line_input_ms", "recogniser_ms", "ctc_decode_ms", "vote_ms",
                  "cascade_ms", "agentclpr_ms", "detector_frame_ms"):
        assert plates[stage] > 0, stage
    assert streams["det"]["detections"] == streams["seg"]["detections"] == 20
    assert streams["seg"]["masks"] == 20
    assert streams["seg_over_det"] > 0
    assert streams["seg_premasked"]["masks"] == 20 and streams["premasked_over_det"] > 0
