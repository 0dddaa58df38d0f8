"""The daemon config: typed, strict, and every error names its key path and line."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from edged.api import config as config_module
from edged.api.config import default_socket
from edged.cli import main
from edged.config import DaemonConfig, load_config, parse_config, with_overrides
from edged.core.errors import ConfigError
from edged.core.schema import parse
from edged.model.config import BatchingConfig, ModelConfig
from tools.assets import models as test_models

ROOT = Path(__file__).resolve().parents[3]


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    return [str(issue) for issue in caught.value.issues]


def test_config_when_shipped_default_loaded_has_expected_values() -> None:
    config = load_config(ROOT / "deploy" / "edged.yaml")
    assert config.device_id == "edge-01"
    assert config.backends.onnxruntime.allow_spinning is False
    assert config.mqtt_prefix == "edged/edge-01"
    assert config.api.socket == Path("/run/edged/edged.sock")


def test_config_when_empty_document_uses_defaults() -> None:
    config = parse_config("")
    assert config.cache.budget_mb == 2048
    assert config.streams == []


def test_config_when_unknown_key_names_path_line_and_suggestion() -> None:
    errors = errors_of("device_id: a\ncache:\n  budget_mbb: 10\n")
    assert errors == ["cache.budget_mbb: unknown key (did you mean 'budget_mb'?) (line 3)"]


def test_config_when_wrong_type_names_path_and_line() -> None:
    errors = errors_of("cache:\n  budget_mb: lots\n")
    assert errors == ["cache.budget_mb: expected an integer, got 'lots' (line 2)"]


def test_config_when_value_out_of_range_is_rejected() -> None:
    assert errors_of("cache: {budget_mb: 0}") == ["cache.budget_mb: must be >= 1, got 0 (line 1)"]


def test_config_when_stream_scheme_unsupported_names_stream_index_and_line() -> None:
    text = """streams:
  - {name: a, source: "file:///tmp/a.mp4", model: m}
  - name: b
    source: "rtmp://10.0.0.5/live"
    model: m
"""
    assert errors_of(text) == ["streams[1].source: unsupported scheme 'rtmp' (line 4)"]


def test_config_when_several_problems_reports_them_all() -> None:
    text = """device_id: "bad id!"
api: {http: "0.0.0.0:8000", socket_mode: "999"}
streams:
  - {name: a, source: "file:///x", model: m, backpressure: sometimes}
  - {name: a, source: "file:///y"}
"""
    errors = errors_of(text)
    assert any(e.startswith("device_id:") and "(line 1)" in e for e in errors)
    assert any(e.startswith("api.http:") and "loopback" in e for e in errors)
    assert any(e.startswith("api.socket_mode:") for e in errors)
    assert any(e.startswith("streams[0].backpressure:") and "(line 4)" in e for e in errors)
    assert any(e.startswith("streams[1].model: missing required key") for e in errors)
    assert len(errors) == 5


def test_config_when_duplicate_stream_names_rejected() -> None:
    text = "streams:\n  - {name: a, source: 'file:///x', model: m}\n" \
           "  - {name: a, source: 'file:///y', model: m}\n"
    assert errors_of(text) == ["streams[1].name: duplicate stream 'a' (line 3)"]


def test_config_when_yaml_is_malformed_reports_line() -> None:
    errors = errors_of("cache:\n  budget_mb: [1, 2\n")
    assert len(errors) == 1 and errors[0].startswith("invalid YAML")  # no "(document):" prefix
    assert "(line" in errors[0]


def test_config_when_list_given_for_mapping_says_so() -> None:
    assert errors_of("cache: [1, 2]") == ["cache: expected a mapping, got a list (line 1)"]


def test_config_when_optional_section_is_null_keeps_none() -> None:
    assert parse_config("mqtt: {tls: null}").mqtt.tls is None
    assert parse_config("mqtt: {tls: {ca: /etc/ca.pem}}").mqtt.tls.ca == Path("/etc/ca.pem")


def test_config_when_cli_overrides_given_replaces_those_fields() -> None:
    config = with_overrides(parse_config(""), models_dir=Path("/m"), socket=Path("/s.sock"),
                            http="127.0.0.1:8000")
    assert (config.models_dir, config.api.socket, config.api.http) == \
        (Path("/m"), Path("/s.sock"), "127.0.0.1:8000")
    with pytest.raises(ConfigError, match="loopback-only"):
        with_overrides(config, http="10.0.0.5:8000")


def test_model_config_when_batching_off_has_no_batching_params() -> None:
    assert parse(ModelConfig, "batching: off").value.batching_params is None
    assert parse(ModelConfig, "").value.batching_params == BatchingConfig()
    with pytest.raises(ConfigError, match=r"batching.max_queue_size: must be >= 1"):
        parse(ModelConfig, "batching: {max_queue_size: 0}")


def test_check_config_when_valid_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            repo_dir: Path) -> None:
    config = tmp_path / "edged.yaml"
    config.write_text(f"models_dir: {repo_dir}\ncache: {{preload: [tiny_cls]}}\n")
    assert main(["check-config", str(config)]) == 0
    assert "ok" in capsys.readouterr().out


def test_check_config_when_invalid_prints_every_error_and_exits_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "edged.yaml"
    config.write_text("cache:\n  budget_mb: -1\nbogus: 1\n")
    assert main(["check-config", str(config)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert f"{config}: cache.budget_mb: must be >= 1, got -1 (line 2)" in out
    assert f"{config}: bogus: unknown key (line 3)" in out


def test_check_config_when_a_model_is_broken_names_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], repo_dir: Path) -> None:
    (repo_dir / "tiny_cls" / "1" / "model.onnx").write_bytes(b"not a model")
    config = tmp_path / "edged.yaml"
    config.write_text(f"models_dir: {repo_dir}\ncache: {{preload: [nothere]}}\n")
    assert main(["check-config", str(config)]) == 1
    out = capsys.readouterr().out
    assert "tiny_cls/1/model.onnx: not a valid ONNX model" in out
    assert "cache.preload: model 'nothere' is not in" in out


def test_config_when_stream_capture_size_is_not_width_height_names_it() -> None:
    text = 'streams: [{name: a, source: "v4l2:///dev/video0", model: m, size: [640]}]\n'
    assert errors_of(text) == ["streams[0].size: size must be [width, height] > 0 (line 1)"]


def test_default_socket_when_a_user_cannot_write_run_edged_is_in_their_runtime_dir(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_module.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(config_module.os, "getuid", lambda: 1000)
    monkeypatch.setattr(config_module.os, "access", lambda path, mode: False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert default_socket() == Path("/run/user/1000/edged.sock")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert default_socket() == Path(tempfile.gettempdir()) / "edged-1000.sock"


def test_default_socket_when_root_is_the_services_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_module.os, "geteuid", lambda: 0)
    assert default_socket() == Path("/run/edged/edged.sock")
    assert DaemonConfig().api.socket == Path("/run/edged/edged.sock")


def test_config_when_one_section_is_wrong_still_reports_the_others_cross_checks() -> None:
    text = ("mqtt: {port: x}\n"
            "streams:\n"
            "  - {name: a, source: 'rtmp://x', model: m}\n")
    assert errors_of(text) == ["mqtt.port: expected an integer, got 'x' (line 1)",
                               "streams[0].source: unsupported scheme 'rtmp' (line 3)"]


def test_check_config_when_streams_name_models_not_in_the_repository_says_each(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], repo_dir: Path) -> None:
    config = tmp_path / "edged.yaml"
    config.write_text(f"models_dir: {repo_dir}\n"
                      "streams:\n"
                      "  - name: door\n"
                      "    source: 'file:///nowhere.avi'\n"
                      "    model: detector\n"
                      "    secondary: [{model: plates}]\n")
    assert main(["check-config", str(config)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert f"streams[0].model: 'detector' is not in {repo_dir}; the stream would not start " \
           "(line 5)" in out
    assert f"streams[0].secondary[0].model: 'plates' is not in {repo_dir}; the stream would " \
           "not start (line 6)" in out
    assert "warning: streams[0].source: /nowhere.avi does not exist here (a file on the " \
           "device?) (line 4)" in out


def test_check_config_when_a_detect_stream_names_labels_its_model_lacks_says_each(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], repo_dir: Path) -> None:
    test_models.write_repository(repo_dir, names=["grid_det"])
    config = tmp_path / "edged.yaml"
    config.write_text(f"models_dir: {repo_dir}\n"
                      "streams:\n"
                      "  - name: door\n"
                      "    source: 'file:///nowhere.avi'\n"
                      "    model: grid_det\n"
                      "    labels: [red, cat]\n"
                      "  - name: hall\n"
                      "    source: 'file:///nowhere.avi'\n"
                      "    model: colors\n"
                      "    labels: [cat]\n")  # a classify stream tracks nothing: not checked
    assert main(["check-config", str(config)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "streams[0].labels[1]: the model has no label 'cat' (red, green, blue); the stream " \
           "would not start (line 6)" in out
    assert not any("streams[1].labels" in line for line in out)


def test_check_config_when_the_shipped_config_meets_a_dev_machine_warns_and_exits_zero(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    assert main(["check-config", str(ROOT / "deploy" / "edged.yaml")]) == 0
    out = capsys.readouterr().out
    assert "warning: models_dir: /var/lib/edged/models does not exist here" in out
    assert "add --models-dir DIR to check them" in out
    assert out.rstrip().endswith("warning(s) above)")


def test_check_config_when_a_key_is_a_credential_outside_systemd_warns_that_run_refuses_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], repo_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    config = tmp_path / "edged.yaml"
    config.write_text(f"models_dir: {repo_dir}\nota: {{trusted_keys: [release.pub]}}\n")
    assert main(["check-config", str(config)]) == 0
    assert "warning: ota.trusted_keys[0]: 'release.pub' is a systemd credential " \
           "(LoadCredential=), read from $CREDENTIALS_DIRECTORY, which is not set here" \
           in capsys.readouterr().out
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))  # as under systemd: it is not
    assert main(["check-config", str(config)]) == 1
    assert f"ota.trusted_keys[0]: {tmp_path / 'release.pub'} does not exist" in \
        capsys.readouterr().out


def test_check_config_when_one_stream_has_a_bad_scheme_and_another_a_missing_model_says_both(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], repo_dir: Path) -> None:
    # Issue 41 #4: only the first was reported; the models were not looked at.
    config = tmp_path / "edged.yaml"
    config.write_text(f"models_dir: {repo_dir}\n"
                      "streams:\n"
                      "  - {name: door, source: 'rtmp://cam/1', model: tiny_cls}\n"
                      "  - {name: hall, source: 'file:///nowhere.avi', model: detector}\n")
    assert main(["check-config", str(config)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert f"{config}: streams[0].source: unsupported scheme 'rtmp' (line 3)" in out
    assert f"streams[1].model: 'detector' is not in {repo_dir}; the stream would not start " \
           "(line 4)" in out
    assert "warning: streams[1].source: /nowhere.avi does not exist here (a file on the " \
           "device?) (line 4)" in out


def test_check_config_when_a_stream_does_not_convert_names_the_others_by_their_own_index(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], repo_dir: Path) -> None:
    """A stream with an unknown key is left out of the cross checks; the ones after it keep
    their place in the file (they were checked one index off, under another stream's line)."""
    config = tmp_path / "edged.yaml"
    config.write_text(f"models_dir: {repo_dir}\n"
                      "streams:\n"
                      "  - {name: door, source: 'file:///a.avi', model: tiny_cls, colour: red}\n"
                      "  - {name: hall, source: 'rtmp://cam/2', model: tiny_cls}\n"
                      "  - {name: yard, source: 'file:///b.avi', model: detector}\n"
                      "  - {name: yard, source: 'file:///c.avi', model: tiny_cls}\n")
    assert main(["check-config", str(config)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert f"{config}: streams[0].colour: unknown key (line 3)" in out
    assert f"{config}: streams[1].source: unsupported scheme 'rtmp' (line 4)" in out
    assert f"{config}: streams[3].name: duplicate stream 'yard' (line 6)" in out
    assert f"streams[2].model: 'detector' is not in {repo_dir}; the stream would not start " \
           "(line 5)" in out


def test_config_when_an_identity_cascade_has_no_face_pipeline_names_the_key() -> None:
    text = ("streams:\n  - {name: door, source: 'file:///x.avi', model: face_yolo,\n"
            "     secondary: [{model: arcface, as: identity}]}\n")
    with pytest.raises(ConfigError, match=r"streams\[0\].secondary\[0\].as: identity needs the "
                                          r"face pipeline"):
        parse_config(text)
    with pytest.raises(ConfigError, match=r"secondary\[0\].model: as: identity runs the face "
                                          r"pipeline's embedder \(face_embedder\)"):
        parse_config(text + "faces: {enabled: true}\n")
    assert parse_config(text.replace("arcface", "face_embedder")
                 + "faces: {enabled: true}\n").faces.enabled
