"""The describer's config: one describer, needed by a stream that asks for descriptions, its
endpoint URL well formed; and `edged check-config`'s look at the repository (the local model
must be a language model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edged.cli import main
from edged.config import parse_config
from edged.core.errors import ConfigError

STREAM = "streams:\n  - {name: door, source: 'file:///v.avi', model: det, labels: [car]%s}\n"


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    return [str(issue) for issue in caught.value.issues]


def test_config_when_a_stream_asks_for_descriptions_without_a_describer_says_so() -> None:
    assert errors_of(STREAM % ", describe: {enabled: true}") == [
        "streams[0].describe.enabled: descriptions need a describer: set describer.model (a "
        "language model here) or describer.endpoint (line 2)"]


def test_config_when_both_a_model_and_an_endpoint_describe_refuses() -> None:
    [error] = errors_of("describer: {model: smol, endpoint: {url: 'http://h/v1', model: m}}\n")
    assert error.startswith("describer.endpoint: a describer is a local model or an endpoint")


def test_config_when_describe_labels_are_not_the_streams_names_them() -> None:
    [error] = errors_of("describer: {model: smol}\n" + STREAM % ", describe: {enabled: true, "
                        "labels: [car, person]}")
    assert error.startswith("streams[0].describe.labels[1]: 'person' is not one of the "
                            "stream's labels (car)")


@pytest.mark.parametrize(("url", "why"), [
    ("ftp://h/v1", "http:// or https://"), ("http:///v1", "names no host"),
    ("http://user:pw@h/v1", "credentials do not go in the URL"),
    ("http://h:99999/v1", "is not a URL"), ("http://h/v1?x=1", "no query")])
def test_config_when_the_endpoint_url_is_malformed_says_why(url: str, why: str) -> None:
    [error] = errors_of(f"describer: {{endpoint: {{url: '{url}', model: m}}}}\n")
    assert error.startswith("describer.endpoint.url:") and why in error


def test_config_when_a_describer_is_valid_reads_every_key() -> None:
    config = parse_config("describer: {endpoint: {url: 'https://vlm.lan:8443/v1', model: "
                          "qwen2.5-vl, vision: true, api_key_file: key}, queue: 4, "
                          "timeout_s: 20}\n" + STREAM % ", describe: {enabled: true, "
                          "per_minute: 2, burst: 1, min_duration_s: 3}")
    assert config.describer.endpoint is not None and config.describer.endpoint.vision
    assert config.describer.queue == 4 and config.describer.timeout_s == 20
    describe = config.streams[0].describe
    assert (describe.enabled, describe.per_minute, describe.burst) == (True, 2, 1)


def test_check_config_when_the_describer_model_is_not_a_language_model_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], repo_dir: Path) -> None:
    config = tmp_path / "edged.yaml"
    config.write_text(f"models_dir: {repo_dir}\ndescriber:\n  model: tiny_cls\n")
    assert main(["check-config", str(config)]) == 1
    out = capsys.readouterr().out
    assert "describer.model: tiny_cls:1 is not a language model (its file is model.onnx; a " \
           "describer generates text: a model.gguf) (line 3)" in out
    config.write_text(f"models_dir: {repo_dir}\ndescriber:\n  model: nothing\n")
    assert main(["check-config", str(config)]) == 1
    assert f"describer.model: 'nothing' is not in {repo_dir}" in capsys.readouterr().out


def test_check_config_when_the_api_key_is_a_credential_outside_systemd_warns(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], repo_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    config = tmp_path / "edged.yaml"
    config.write_text(f"models_dir: {repo_dir}\ndescriber:\n  endpoint: {{url: "
                      "'http://127.0.0.1:1/v1', model: m, api_key_file: describer-key}\n")
    assert main(["check-config", str(config)]) == 0
    assert "warning: describer.endpoint.api_key_file: 'describer-key' is a systemd " \
           "credential" in capsys.readouterr().out
