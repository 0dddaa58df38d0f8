"""`edged check-config`: a config file and what it names, checked the way `edged run` would use
them, every problem at once (the models that streams name are checked even where other keys
are wrong: `ConfigError.partial`). Errors stop `run` (a model file that is not ONNX, a stream or a
secondary model that is not in the repository, a stream's `labels:` or `clips.labels:` its
model cannot produce, a camera stream whose model cannot take its frames: no known
pre-processing, or one whose tensors are not the model's input); warnings are paths that
exist only where the service runs (a device's models folder, keys, a video file, a systemd
credential), so a shipped config checks clean on a developer's machine and says what it
could not see."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from edged.config import DaemonConfig
from edged.core.errors import ConfigError, EdgedError
from edged.core.schema import Parsed
from edged.events.config import check_labels, outputs
from edged.model.config import PostprocessConfig
from edged.model.repository import ModelRepository
from edged.processing.post import Postprocessor
from edged.processing.pre import KEYS, mismatch
from edged.streams.config import StreamConfig
from edged.streams.states import check_classifier

_Line = Callable[[str], str]  # a key path -> " (line N)" or ""


@dataclass
class Findings:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def check(parsed: Parsed[DaemonConfig], *, models_dir_given: bool = False) -> Findings:
    """What `run` would refuse (errors) and what cannot be seen from here (warnings). The
    models are checked where `models_dir` exists (or was given on the command line)."""
    config, found = parsed.value, Findings()
    # Each stream with its key path in the file (one that did not convert is not here).
    streams = [(parsed.at("streams", i), s) for i, s in enumerate(config.streams)]

    def line(path: str) -> str:
        number = parsed.lines.get(path)
        return f" (line {number})" if number is not None else ""

    if config.models_dir.is_dir():
        _check_models(config, streams, found, line)
    elif models_dir_given:
        found.errors.append(f"--models-dir {config.models_dir} does not exist")
    else:
        found.warnings.append(
            f"models_dir: {config.models_dir} does not exist here (a path on the device?); "
            "models, streams' models and cache names were not checked: add --models-dir DIR "
            f"to check them{line('models_dir')}")
    _check_secrets(config, found, line)
    for at, stream in streams:
        if stream.source.startswith("file://"):
            path = Path(stream.source.removeprefix("file://"))
            if not path.is_file():
                found.warnings.append(f"{at}.source: {path} does not exist here (a file on "
                                      f"the device?){line(f'{at}.source')}")
    _check_recording(config, found, line)
    return found


def _check_recording(config: DaemonConfig, found: Findings, line: _Line) -> None:
    """A stream keeps clips: the recording folder must be usable, as `run` would find it
    (an error where it exists but is not writable, or cannot be made; a warning where its
    parent does not exist here: a path on the device)."""
    if not any(s.clips.enabled or s.record.enabled for s in config.streams):
        return
    folder = config.recording.dir
    at = line("recording.dir")
    if folder.is_dir():
        if not os.access(folder, os.W_OK | os.X_OK):
            found.errors.append(f"recording.dir: {folder} is not writable by this user{at}")
    elif folder.exists():
        found.errors.append(f"recording.dir: {folder} is not a folder{at}")
    elif (blocker := _file_above(folder)) is not None:
        found.errors.append(f"recording.dir: {folder} cannot be made: {blocker} is a file{at}")
    elif not folder.parent.is_dir():
        found.warnings.append(f"recording.dir: {folder} does not exist here (a path on the "
                              f"device?); `edged run` makes it{at}")
    elif not os.access(folder.parent, os.W_OK | os.X_OK):
        found.errors.append(f"recording.dir: {folder} cannot be made: {folder.parent} is not "
                            f"writable by this user{at}")


def _file_above(folder: Path) -> Path | None:
    """The nearest existing path above `folder`, when it is not a folder."""
    for above in folder.parents:
        if above.exists():
            return None if above.is_dir() else above
    return None


def _check_models(config: DaemonConfig, streams: list[tuple[str, StreamConfig]],
                  found: Findings, line: _Line) -> None:
    repository = ModelRepository(config.models_dir)
    names = repository.names()
    for name in names:
        try:
            for version in repository.served_versions(name):
                repository.get(name, version)
        except EdgedError as exc:
            found.errors.append(str(exc))
    for key, wanted in (("preload", config.cache.preload_names(names)),
                        ("pinned", config.cache.pinned)):
        for name in wanted:
            if name not in names:
                found.errors.append(f"cache.{key}: model {name!r} is not in "
                                    f"{config.models_dir}{line(f'cache.{key}')}")
    _check_describer(repository, config, found, line)
    for at, stream in streams:
        if stream.model not in names:
            found.errors.append(f"{at}.model: {stream.model!r} is not in "
                                f"{config.models_dir}; the stream would not start"
                                f"{line(f'{at}.model')}")
        else:
            _check_labels(repository, stream, at, found, line)
            _check_frames(repository, stream, at, found, line)
        for j, secondary in enumerate(stream.secondary):
            key = f"{at}.secondary[{j}].model"
            if secondary.model not in names:
                found.errors.append(f"{key}: {secondary.model!r} is not in "
                                    f"{config.models_dir}; the stream would not start"
                                    f"{line(key)}")
            reader = f"{at}.secondary[{j}].reader"
            if secondary.reader is not None and secondary.reader not in names:
                found.errors.append(f"{reader}: {secondary.reader!r} is not in "
                                    f"{config.models_dir}; the stream would not start"
                                    f"{line(reader)}")
        _check_states(repository, names, stream, at, found, line)


def _check_describer(repository: ModelRepository, config: DaemonConfig, found: Findings,
                     line: _Line) -> None:
    """`describer.model` is a language model in the repository (a model.gguf)."""
    name = config.describer.model
    if name is None:
        return
    key = "describer.model"
    if name not in repository.names():
        found.errors.append(f"{key}: {name!r} is not in {config.models_dir}; no event would "
                            f"be described{line(key)}")
        return
    try:
        model = repository.get(name, repository.default_version(name))
    except EdgedError:
        return  # reported with the models above
    if not model.is_language:
        found.errors.append(f"{key}: {model.label} is not a language model (its file is "
                            f"{model.model_path.name}; a describer generates text: a "
                            f"model.gguf){line(key)}")


def _check_labels(repository: ModelRepository, stream: StreamConfig, at: str,
                  found: Findings, line: _Line) -> None:
    """A detect stream's `labels:` (and its `clips.labels:`) against those its model names (a
    model that names none cannot be checked; one that does not load was reported above)."""
    clip_labels = stream.clips.labels if stream.clips.enabled else []
    if not stream.labels and not clip_labels:
        return
    try:
        model = repository.get(stream.model, repository.default_version(stream.model))
        known = Postprocessor(model.config.postprocess, model.dir.parent, model.head).labels
    except EdgedError:
        return
    if not known or not outputs(stream.publish, (model.config.postprocess
                                                 or PostprocessConfig()).kind).events:
        return
    for labels, path in ((stream.labels, at), (clip_labels, f"{at}.clips")):
        try:
            check_labels(labels, known, path=path)
        except ConfigError as exc:
            found.errors += [f"{issue}; the stream would not start{line(issue.path)}"
                             for issue in exc.issues]


def _check_frames(repository: ModelRepository, stream: StreamConfig, at: str,
                  found: Findings, line: _Line) -> None:
    """A camera stream's model must say how a frame becomes its input (nothing is guessed),
    and that pre-processing must make the tensor its input takes (layout, channels, size).
    Sensor streams (mqtt://) send tensors as they are. No stream runs a language model."""
    try:
        model = repository.get(stream.model, repository.default_version(stream.model))
    except EdgedError:
        return  # reported with the models above
    if model.is_language:
        found.errors.append(f"{at}.model: {model.label} is a language model (model.gguf): it "
                            "generates text for the API, it takes no frames or tensors"
                            f"{line(f'{at}.model')}")
        return
    if stream.source.partition("://")[0] == "mqtt":
        return
    pre, spec = model.config.preprocess, model.inputs[0]
    why: str | None
    if pre is None:
        why = (f"{model.label} has no known pre-processing for frames (its input "
               f"{spec.name} {list(spec.shape)}): set `preprocess:` in its model.yaml "
               f"(keys: {', '.join(KEYS)})")
    else:
        why = mismatch(pre, spec, model.max_batch_size > 0)
        why = None if why is None else f"{model.label}: {why}"
    if why is not None:
        found.errors.append(f"{at}.model: {why}; every frame would fail{line(f'{at}.model')}")


def _check_secrets(config: DaemonConfig, found: Findings, line: _Line) -> None:
    """Keys and passwords: a relative path is a systemd credential, read from
    $CREDENTIALS_DIRECTORY, which only the service has."""
    secrets = [(f"ota.trusted_keys[{i}]", path) for i, path in enumerate(config.ota.trusted_keys)]
    if config.mqtt.enabled and config.mqtt.password_file is not None:
        secrets.append(("mqtt.password_file", config.mqtt.password_file))
    endpoint = config.describer.endpoint
    if endpoint is not None and endpoint.api_key_file is not None:
        secrets.append(("describer.endpoint.api_key_file", endpoint.api_key_file))
    credentials = os.environ.get("CREDENTIALS_DIRECTORY")
    for key, path in secrets:
        if not path.is_absolute():
            where = Path(credentials) / path if credentials else None
            if where is None:
                found.warnings.append(
                    f"{key}: {str(path)!r} is a systemd credential (LoadCredential=), read "
                    "from $CREDENTIALS_DIRECTORY, which is not set here: `edged run` outside "
                    f"the service refuses it; give an absolute path to run it by hand"
                    f"{line(key)}")
            elif not where.is_file():
                found.errors.append(f"{key}: {where} does not exist{line(key)}")
        elif not path.is_file():
            found.warnings.append(f"{key}: {path} does not exist here (a file on the "
                                  f"device?){line(key)}")


def _check_states(repository: ModelRepository, names: list[str], stream: StreamConfig,
                  at: str, found: Findings, line: _Line) -> None:
    """Each state's model is in the repository and is a classifier taking one image."""
    for j, state in enumerate(stream.states):
        key = f"{at}.states[{j}].model"
        if state.model not in names:
            found.errors.append(f"{key}: {state.model!r} is not in {repository.root}; the "
                                f"stream would not start{line(key)}")
            continue
        try:
            check_classifier(key, repository.get(state.model,
                                                 repository.default_version(state.model)))
        except ConfigError as exc:
            found.errors += [f"{issue}; the stream would not start{line(issue.path)}"
                             for issue in exc.issues]
        except EdgedError:
            pass  # a model that does not load was reported with the models
