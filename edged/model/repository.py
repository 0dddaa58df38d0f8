"""The on-disk model repository: `<root>/<name>/model.yaml` + `<root>/<name>/<version>/model.onnx`,
with version policies, an active-version pointer and atomic installs.

Every model is read on its own: a broken one raises InvalidModel naming its file, and the
others still load.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edged.core.errors import ConfigError, InvalidModel, ModelNotFound
from edged.core.fsutil import copy_synced, file_sha256, fsync_dir, write_atomically
from edged.core.numbers import ascii_int
from edged.core.schema import parse, parse_file
from edged.model.config import MODEL_CHECKS, ModelConfig
from edged.model.gguf import read_header
from edged.model.heads import Head
from edged.model.resolve import resolve_processing
from edged.model.signature import Signature, read_signature, reconcile
from edged.model.tensor import TensorSpec, fixed_batch
from edged.model.trtllm import kv_bytes_per_token

logger = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
GGUF_FILE = "model.gguf"  # a language model, served by the llama.cpp backend
MODEL_FILES = (MODEL_FILE, GGUF_FILE)  # a version holds one of them: its kind is told by it
# Or this folder: a TensorRT-LLM engine (trtllm-build's output) or checkpoint with its
# tokenizer, a language model served by the tensorrt_llm backend on a GPU.
TRTLLM_DIR = "trtllm"
LANGUAGE_BACKENDS = ("llamacpp", "tensorrt_llm")
INT8_FILE = "model.int8.onnx"
CONFIG_FILE = "model.yaml"
ACTIVE_FILE = "active"  # holds the version new requests get, written atomically
STAGING_DIR = ".staging"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_model_name(name: str) -> str:
    """Return `name` if it is a safe directory name, else raise ModelNotFound."""
    if not _NAME.fullmatch(name) or ".." in name:
        raise ModelNotFound(f"invalid model name {name!r}: use letters, digits, _ . -")
    return name


@dataclass(frozen=True)
class ModelVersion:
    """One servable version: its files, its config and its I/O signature (batch dim included:
    -1, or N where the graph's batch is fixed at N)."""

    name: str
    version: int
    dir: Path
    # max_batch_size resolved; inputs/outputs complete; pre- and post-processing filled in
    # from the ONNX file's metadata where model.yaml is silent
    config: ModelConfig
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    head: Head | None = None  # a detector's head, chosen when the version is read
    reasons: Mapping[str, str] = field(default_factory=dict)  # why pre/post-processing is so

    @property
    def onnx_path(self) -> Path:
        return self.dir / MODEL_FILE

    @property
    def is_language(self) -> bool:
        """A language model (model.gguf, or a trtllm/ folder): it generates text; it takes no
        tensors."""
        return self.config.backend in LANGUAGE_BACKENDS

    @property
    def model_path(self) -> Path:
        """What a backend loads: model.gguf or the trtllm/ folder for a language model, else
        model.onnx."""
        if self.config.backend == "tensorrt_llm":
            return self.dir / TRTLLM_DIR
        return self.dir / (GGUF_FILE if self.is_language else MODEL_FILE)

    @property
    def int8_path(self) -> Path | None:
        path = self.dir / INT8_FILE
        return path if path.exists() else None

    @property
    def max_batch_size(self) -> int:
        return self.config.max_batch_size or 0

    @property
    def fixed_batch(self) -> int | None:
        """N when the graph's batch dim is fixed at N (the specs' first dim): every batch runs
        as exactly N rows, the real ones padded with zero rows. None for a dynamic batch dim
        or none at all."""
        return fixed_batch(self.max_batch_size, self.inputs)

    @property
    def label(self) -> str:
        return f"{self.name}:{self.version}"

    def sha256(self) -> str:
        return file_sha256(self.model_path)


class ModelRepository:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        # (path, mtime_ns, size) of model.yaml and model.onnx -> parsed version
        self._parsed: dict[tuple[str, int], tuple[tuple[object, ...], ModelVersion]] = {}
        self._removed: list[Callable[[str, int], None]] = []

    def on_version_removed(self, callback: Callable[[str, int], None]) -> None:
        """Call `callback(name, version)` after a version leaves the disk (what was made for
        it, such as a batcher for requests that name it, can go too)."""
        self._removed.append(callback)

    # -- layout ------------------------------------------------------------------------------
    def model_dir(self, name: str) -> Path:
        """`<root>/<name>/`: model.yaml, the versions, the active pointer (and the files other
        rooms keep per model, such as OTA's install journal)."""
        return self.root / check_model_name(name)

    def version_dir(self, name: str, version: int) -> Path:
        """`<root>/<name>/<version>/`: the version's model files."""
        return self.model_dir(name) / str(version)

    # -- discovery ---------------------------------------------------------------------------
    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and _NAME.fullmatch(p.name) and not p.name.startswith("."))

    def versions_on_disk(self, name: str) -> list[int]:
        model_dir = self.model_dir(name)
        if not model_dir.is_dir():
            raise ModelNotFound(f"model {name!r} is not in the repository ({self.root})")
        found = ((ascii_int(p.name), p) for p in model_dir.iterdir())  # "²/", "٣/": not ours
        return sorted(v for v, p in found if v is not None and v > 0 and _model_file(p))

    def served_versions(self, name: str) -> list[int]:
        """Versions on disk that the model's version policy serves (plus the active one)."""
        on_disk = self.versions_on_disk(name)
        policy = self.model_config(name).version_policy
        if policy.all:
            served = on_disk
        elif policy.specific is not None:
            served = [v for v in on_disk if v in policy.specific]
        else:
            served = on_disk[-(policy.latest or 1):]
        active = self.active_version(name)
        if active is not None and active in on_disk and active not in served:
            served = sorted([*served, active])
        return served

    def active_version(self, name: str) -> int | None:
        """The version named by the active pointer, if one was set and is readable."""
        path = self.model_dir(name) / ACTIVE_FILE
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            return None
        version = ascii_int(text)
        if version is None:
            logger.warning("%s: ignoring unreadable active pointer %r", path, text)
        return version

    def default_version(self, name: str) -> int:
        """The version a request that names none gets: the active pointer, else the latest."""
        served = self.served_versions(name)
        if not served:
            raise ModelNotFound(f"model {name!r} has no servable version ({self.root / name})")
        active = self.active_version(name)
        return active if active in served else served[-1]

    # -- reading -----------------------------------------------------------------------------
    def model_config(self, name: str, version: int | None = None) -> ModelConfig:
        """model.yaml of a version (if it has its own) or of the model; defaults when absent."""
        candidates = [self.model_dir(name) / CONFIG_FILE]
        if version is not None:
            candidates.insert(0, self.version_dir(name, version) / CONFIG_FILE)
        for path in candidates:
            if path.is_file():
                try:
                    return parse_file(ModelConfig, path, MODEL_CHECKS).value
                except ConfigError as exc:
                    raise InvalidModel(str(exc)) from exc
        return ModelConfig()

    def resolve(self, name: str, version: int | None = None) -> ModelVersion:
        """A served version: the default one when version is None, else one the policy serves."""
        if version is None:
            return self.get(name, self.default_version(name))
        served = self.served_versions(name)
        if version not in served:
            raise ModelNotFound(f"model {name!r} has no served version {version} "
                                f"(served: {served})")
        return self.get(name, version)

    def get(self, name: str, version: int) -> ModelVersion:
        """A version on disk, parsed and validated (cached until its files change)."""
        if version not in self.versions_on_disk(name):
            raise ModelNotFound(f"model {name!r} has no version {version} ({self.root / name})")
        vdir = self.version_dir(name, version)
        stamp = tuple(_stamp(p) for p in (self.model_dir(name) / CONFIG_FILE, vdir / CONFIG_FILE,
                                           vdir / MODEL_FILE, vdir / GGUF_FILE,
                                           vdir / TRTLLM_DIR / "config.json"))
        with self._lock:
            cached = self._parsed.get((name, version))
        if cached and cached[0] == stamp:
            return cached[1]
        model = self._read_version(name, version, vdir)
        with self._lock:
            self._parsed[(name, version)] = (stamp, model)
        return model

    def _read_version(self, name: str, version: int, vdir: Path) -> ModelVersion:
        yaml_path = vdir / CONFIG_FILE
        if not yaml_path.is_file():
            yaml_path = self.model_dir(name) / CONFIG_FILE
        if yaml_path.is_file():
            try:
                parsed = parse_file(ModelConfig, yaml_path, MODEL_CHECKS)
            except ConfigError as exc:
                raise InvalidModel(str(exc)) from exc
        else:
            parsed = parse(ModelConfig, "{}")
        if (vdir / GGUF_FILE).is_file() and not (vdir / MODEL_FILE).is_file():
            return language_version(name, version, vdir, parsed.value, yaml_path)
        if _trtllm(vdir) and not (vdir / MODEL_FILE).is_file():
            return trtllm_version(name, version, vdir, parsed.value, yaml_path)
        signature: Signature = read_signature(vdir / MODEL_FILE)
        config, inputs, outputs = reconcile(parsed, signature, yaml_path, vdir / MODEL_FILE)
        resolved = resolve_processing(config, parsed.lines, signature, inputs, outputs,
                                      vdir / MODEL_FILE, vdir.parent)
        return ModelVersion(name, version, vdir, resolved.config, inputs, outputs,
                            resolved.head, resolved.reasons)

    # -- writing -----------------------------------------------------------------------------
    def install(self, name: str, version: int, files: Mapping[str, bytes | Path]) -> ModelVersion:
        """Atomically add `<name>/<version>/` holding `files` (name → bytes or source path).

        The files are written under .staging on the same filesystem, fsynced, checked, and the
        directory renamed into place, so a crash leaves either nothing or the whole version.
        """
        stage = self.staging_dir() / f"{check_model_name(name)}-{version}-{uuid.uuid4().hex[:8]}"
        stage.mkdir(parents=True)
        try:
            for filename, content in files.items():
                if "/" in filename or filename.startswith(".") or filename == ACTIVE_FILE:
                    raise InvalidModel(f"refusing file name {filename!r} in an install")
                if isinstance(content, Path):
                    copy_synced(content, stage / filename)
                else:
                    write_atomically(stage / filename, content)
        except BaseException:  # remove the half-written stage, then re-raise whatever it was
            shutil.rmtree(stage, ignore_errors=True)
            raise
        return self.adopt(name, version, stage)

    def adopt(self, name: str, version: int, stage: Path) -> ModelVersion:
        """Rename a prepared directory under .staging into place as `<name>/<version>/`, after
        fsyncing it and checking its model file. The stage is removed whatever happens."""
        check_model_name(name)
        installed = False
        try:
            if version < 1:
                raise InvalidModel(f"version must be a positive integer, got {version}")
            if not _model_file(stage):
                raise InvalidModel(f"an install of {name}:{version} needs {MODEL_FILE} or "
                                   f"{GGUF_FILE}")
            target = self.version_dir(name, version)
            if target.exists():
                raise InvalidModel(f"{target} already exists; versions are immutable")
            for path in stage.rglob("*"):
                if path.is_file():
                    with path.open("rb+") as f:
                        os.fsync(f.fileno())
            fsync_dir(stage)
            # A corrupt file never reaches the repository (a GGUF's header; its tensors at load).
            if (stage / MODEL_FILE).is_file():
                read_signature(stage / MODEL_FILE)
            else:
                read_header(stage / GGUF_FILE)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(stage, target)
            installed = True
            fsync_dir(target.parent)
        finally:
            if not installed:  # whatever stopped it, the half-written stage goes
                shutil.rmtree(stage, ignore_errors=True)
        logger.info("installed %s:%d into %s", name, version, target)
        return self.get(name, version)

    def read_candidate(self, name: str, vdir: Path) -> ModelVersion:
        """Parse a version that is not (yet) in the repository, e.g. a staged update: its own
        model.yaml if it has one, else the model's."""
        return self._read_version(check_model_name(name), 0, vdir)

    def set_active(self, name: str, version: int) -> None:
        """Point new requests at `version`, atomically (tmp file, fsync, rename)."""
        if version not in self.versions_on_disk(name):
            raise ModelNotFound(f"model {name!r} has no version {version} on disk")
        write_atomically(self.model_dir(name) / ACTIVE_FILE, f"{version}\n")

    def remove_version(self, name: str, version: int) -> None:
        """Delete a version: renamed out of sight first, so readers never see half of it."""
        target = self.version_dir(name, version)
        if not target.is_dir():
            raise ModelNotFound(f"model {name!r} has no version {version} on disk")
        doomed = self.staging_dir() / f"removed-{name}-{version}-{uuid.uuid4().hex[:8]}"
        os.rename(target, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        with self._lock:
            self._parsed.pop((name, version), None)
        for callback in list(self._removed):
            callback(name, version)

    def staging_dir(self) -> Path:
        path = self.root / STAGING_DIR
        path.mkdir(parents=True, exist_ok=True)
        return path

    def clean_staging(self) -> int:
        """Remove what an interrupted install or removal left behind; returns entries removed."""
        path = self.root / STAGING_DIR
        if not path.is_dir():
            return 0
        leftovers = list(path.iterdir())
        for entry in leftovers:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        if leftovers:
            logger.info("removed %d leftover staging entries from %s", len(leftovers), path)
        return len(leftovers)


def _model_file(vdir: Path) -> bool:
    return any((vdir / f).is_file() for f in MODEL_FILES) or _trtllm(vdir)


def _trtllm(vdir: Path) -> bool:
    return (vdir / TRTLLM_DIR / "config.json").is_file()


def language_version(name: str, version: int, vdir: Path, config: ModelConfig,
                     yaml_path: Path) -> ModelVersion:
    """A model.gguf version: its header checked, its backend llama.cpp (another named in
    model.yaml is an error), and its signature Triton's for language models: a text in, a
    text out (what /v2/models/<m> reports; inference requests are refused, generate serves)."""
    if config.backend not in ("auto", "llamacpp"):
        raise InvalidModel(f"{yaml_path}: backend: {config.backend} cannot run {GGUF_FILE} "
                           "(a language model runs on llamacpp)")
    header = read_header(vdir / GGUF_FILE)
    trained = header.number("context_length")
    if trained and config.llm.context > trained:
        raise InvalidModel(f"{yaml_path}: llm.context is {config.llm.context}, more than the "
                           f"{trained} tokens {vdir / GGUF_FILE} was trained for")
    config = dataclasses.replace(config, backend="llamacpp", max_batch_size=0, batching=False,
                                 deterministic=False, response_cache=False)
    text = np.dtype(np.object_)
    return ModelVersion(name, version, vdir, config, (TensorSpec("text_input", text, (1,)),),
                        (TensorSpec("text_output", text, (-1,)),))


def trtllm_version(name: str, version: int, vdir: Path, config: ModelConfig,
                   yaml_path: Path) -> ModelVersion:
    """A trtllm/ version: its backend TensorRT-LLM (another named in model.yaml is an error),
    its config.json readable for the KV cache's size, its signature a language model's."""
    if config.backend not in ("auto", "tensorrt_llm"):
        raise InvalidModel(f"{yaml_path}: backend: {config.backend} cannot run "
                           f"{vdir / TRTLLM_DIR} (a TensorRT-LLM model runs on tensorrt_llm)")
    kv_bytes_per_token(vdir / TRTLLM_DIR)
    config = dataclasses.replace(config, backend="tensorrt_llm", max_batch_size=0,
                                 batching=False, deterministic=False, response_cache=False)
    text = np.dtype(np.object_)
    return ModelVersion(name, version, vdir, config, (TensorSpec("text_input", text, (1,)),),
                        (TensorSpec("text_output", text, (-1,)),))


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_mtime_ns, st.st_size)

