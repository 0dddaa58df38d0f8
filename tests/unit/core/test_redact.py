"""remote_text: what an error tells a caller beyond the device (an MQTT request's answer) keeps
the model, its version and what is wrong, and nothing of the device's filesystem."""

from __future__ import annotations

from pathlib import Path

import pytest

from edged.core.redact import UNSAID, remote_text

MODELS = Path("/var/lib/edged/models")
CACHE = Path("/var/cache/edged")

CASES = {
    "repository in parentheses": (
        "model 'nope' is not in the repository (/var/lib/edged/models)",
        "model 'nope' is not in the repository"),
    "a model's folder in parentheses": (
        "model 'empty' has no servable version (/var/lib/edged/models/empty)",
        "model 'empty' has no servable version"),
    "a version's file": (
        "/var/lib/edged/models/corrupt/1/model.onnx: not a valid ONNX model (truncated?)",
        "corrupt/1/model.onnx: not a valid ONNX model (truncated?)"),
    "ONNX Runtime's own text": (
        "[ONNXRuntimeError] : 1 : FAIL : Load model from /var/lib/edged/models/c/1/model.onnx "
        "failed:Fatal error: com.example:NoSuchOp(-1) is not a registered function/op",
        "[ONNXRuntimeError] : 1 : FAIL : Load model from c/1/model.onnx failed:Fatal error: "
        "com.example:NoSuchOp(-1) is not a registered function/op"),
    "the repository alone": ("cannot list /var/lib/edged/models", f"cannot list {UNSAID}"),
    "the engine cache": ("cannot open /var/cache/edged/tensorrt/d/1/ab.engine: gone",
                         f"cannot open {UNSAID}: gone"),
    "a quoted path elsewhere": (
        "[Errno 2] No such file or directory: '/etc/edged/labels.txt'",
        f"[Errno 2] No such file or directory: '{UNSAID}'"),
    "a folder that only starts like the repository": (
        "no /var/lib/edged/models2/x here", f"no {UNSAID} here"),
    "home, here, a file URL": ("~/m.onnx ./m.onnx ../m.onnx file:///srv/m.onnx",
                               " ".join([UNSAID] * 4)),
    "not paths": ("20 requests/s, 1/2 of (mqtt.requests.rate_per_s) https://a.example/b/c, "
                  "replies/hq/# and a lone / stay",
                  "20 requests/s, 1/2 of (mqtt.requests.rate_per_s) https://a.example/b/c, "
                  "replies/hq/# and a lone / stay"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_remote_text_when_an_error_names_paths_keeps_what_is_wrong_without_them(
        case: str) -> None:
    text, told = CASES[case]
    assert remote_text(text, MODELS, [CACHE]) == told


def test_remote_text_when_the_folders_are_relative_takes_them_only_as_paths() -> None:
    """models_dir: models (a checkout's config): the word "models" is not a path, models/x is;
    the same for a relative cache folder."""
    text = ("2 models (models) cannot read 'models/x/1/model.onnx', nor cache/x/1/a.engine "
            "of the cache")
    assert remote_text(text, Path("models"), [Path("cache")]) == (
        f"2 models cannot read 'x/1/model.onnx', nor {UNSAID} of the cache")


def test_remote_text_when_the_repository_has_a_space_takes_the_whole_path(
        tmp_path: Path) -> None:
    root = tmp_path / "my models"
    assert remote_text(f"{root}/a/1/model.onnx: bad", root) == "a/1/model.onnx: bad"


def test_remote_text_when_a_file_is_in_the_repositorys_hidden_folders_names_no_path() -> None:
    text = f"corrupt_model: {MODELS}/.staging/ota-cls-2-ab12/version/model.onnx: not ONNX"
    assert remote_text(text, MODELS) == f"corrupt_model: {UNSAID}: not ONNX"
