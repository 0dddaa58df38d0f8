"""`edged check-config` on plates and states: a state's model must be in the repository and a
classifier; a region outside the frame and lpr without a text cascade are config errors
naming the key and its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from edged.cli import main
from tools.assets import models as test_models


def test_check_config_when_a_state_model_is_no_classifier_or_missing_says_each(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], repo_dir: Path) -> None:
    test_models.write_repository(repo_dir, names=["grid_det"])
    config = tmp_path / "edged.yaml"
    config.write_text(f"models_dir: {repo_dir}\n"
                      "streams:\n"
                      "  - name: yard\n"
                      "    source: 'file:///nowhere.avi'\n"
                      "    model: grid_det\n"
                      "    states:\n"
                      "      - {name: gate, model: grid_det, region: [[0, 0], [10, 10]]}\n"
                      "      - {name: door, model: nothing, region: [[0, 0], [10, 10]]}\n"
                      "      - {name: spot, model: colors, region: [[0, 0], [10, 10]]}\n")
    assert main(["check-config", str(config)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("streams[0].states[0].model: grid_det") and
               "is not a classify model (postprocess.kind: detect)" in line and
               line.endswith("(line 7)") for line in out), out
    assert f"streams[0].states[1].model: 'nothing' is not in {repo_dir}; the stream would " \
           "not start (line 8)" in out
    assert not any("states[2]" in line for line in out)


def test_check_config_when_a_state_region_leaves_the_frame_names_the_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "edged.yaml"
    config.write_text("streams:\n"
                      "  - name: yard\n"
                      "    source: 'v4l2:///dev/video0'\n"
                      "    model: det\n"
                      "    size: [640, 480]\n"
                      "    states:\n"
                      "      - {name: gate, model: colors, region: [[600, 0], [700, 100]]}\n"
                      "    lpr: {enabled: true}\n")
    assert main(["check-config", str(config)]) == 1
    out = capsys.readouterr().out
    assert "streams[0].states[0].region: the region [[600.0, 0.0], [700.0, 100.0]] is " \
           "outside the stream's size 640x480" in out
    assert "streams[0].lpr.enabled: licence plates are read by a text cascade" in out


def test_check_config_when_a_plate_cascade_lacks_its_reader_or_names_a_missing_one_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], repo_dir: Path) -> None:
    config = tmp_path / "edged.yaml"
    config.write_text(f"models_dir: {repo_dir}\n"
                      "streams:\n"
                      "  - name: street\n"
                      "    source: 'file:///nowhere.avi'\n"
                      "    model: colors\n"
                      "    secondary:\n"
                      "      - {model: colors, labels: [car], as: plate}\n"
                      "      - {model: colors, as: plate, reader: nothing}\n"
                      "      - {model: colors, as: text, reader: colors}\n")
    assert main(["check-config", str(config)]) == 1
    out = capsys.readouterr().out
    assert "streams[0].secondary[0].reader: as: plate takes a reader" in out
    assert "streams[0].secondary[2].reader: as: plate takes a reader" in out
    assert f"streams[0].secondary[1].reader: 'nothing' is not in {repo_dir}" in out
