"""Built TensorRT engines on disk: `<cache_dir>/tensorrt/<model>/<version>/<digest>.engine`
with a JSON sidecar beside it. The key names everything that makes an engine wrong for a
load: the ONNX file's sha256, the TensorRT version, the GPU and its compute capability, the
precision, the profiles (one per execution context), the DLA core and the workspace. An engine
that is missing, cut short, altered or keyed otherwise reads as absent (and is removed), so the
caller rebuilds it instead of crashing."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged.backends.profiles import InputProfile
from edged.core.fsutil import write_atomically

logger = logging.getLogger(__name__)

ENGINE_DIR = "tensorrt"
SIDECAR_FORMAT = 1


@dataclass(frozen=True)
class EngineKey:
    model_sha256: str  # of the ONNX file the engine is built from
    tensorrt: str  # tensorrt.__version__
    gpu: str  # the device name
    compute_capability: str  # "8.7"
    precision: str  # what the engine really runs: fp32 | fp16 | int8
    profiles: tuple[tuple[InputProfile, ...], ...]  # one per execution context
    dla_core: int | None = None
    workspace_mb: int = 0
    flags: tuple[str, ...] = ()  # BuilderFlags set, and cleared as "-NAME"

    def fields(self) -> dict[str, Any]:
        return {"flags": list(self.flags), "model_sha256": self.model_sha256,
                "tensorrt": self.tensorrt, "gpu": self.gpu,
                "compute_capability": self.compute_capability, "precision": self.precision,
                "profiles": [[p.as_json() for p in profile] for profile in self.profiles],
                "dla_core": self.dla_core, "workspace_mb": self.workspace_mb}

    @property
    def digest(self) -> str:
        canonical = json.dumps(self.fields(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class EngineFiles:
    engine: Path
    sidecar: Path


def files_for(cache_dir: Path, name: str, version: int, key: EngineKey) -> EngineFiles:
    folder = cache_dir / ENGINE_DIR / name / str(version)
    return EngineFiles(folder / f"{key.digest}.engine", folder / f"{key.digest}.json")


def timing_cache_path(cache_dir: Path, key: EngineKey) -> Path:
    """One timing cache per TensorRT version and GPU, shared by every model's builds."""
    gpu = re.sub(r"[^A-Za-z0-9]+", "-", key.gpu).strip("-").lower() or "gpu"
    return (cache_dir / ENGINE_DIR /
            f"timing-{key.tensorrt}-{gpu}-sm{key.compute_capability.replace('.', '')}.cache")


def read_engine(files: EngineFiles, key: EngineKey) -> bytes | None:
    """The engine's bytes if they are exactly what the sidecar vouches for under `key`; else
    None, with the reason logged and the files removed when they exist but are wrong."""
    if not files.engine.exists() and not files.sidecar.exists():
        return None
    try:
        sidecar = json.loads(files.sidecar.read_text())
        plan = files.engine.read_bytes()
    except (OSError, ValueError) as exc:
        return _reject(files, f"unreadable ({exc})")
    if not isinstance(sidecar, dict) or sidecar.get("format") != SIDECAR_FORMAT:
        return _reject(files, "the sidecar is not one this edged writes")
    if sidecar.get("key") != key.digest or sidecar.get("fields") != key.fields():
        return _reject(files, "built for another key")
    if sidecar.get("engine_bytes") != len(plan):
        return _reject(files, f"{len(plan)} bytes, the sidecar says {sidecar.get('engine_bytes')}")
    if sidecar.get("engine_sha256") != hashlib.sha256(plan).hexdigest():
        return _reject(files, "its sha256 differs from the sidecar's")
    return plan


def write_engine(files: EngineFiles, key: EngineKey, plan: bytes, *, label: str,
                 build_seconds: float, note: str | None = None) -> None:
    """Store an engine and then its sidecar, each atomically: a sidecar is only ever beside
    the complete engine it describes."""
    files.engine.parent.mkdir(parents=True, exist_ok=True)
    sidecar = {"format": SIDECAR_FORMAT, "model": label, "key": key.digest,
               "fields": key.fields(), "engine_bytes": len(plan),
               "engine_sha256": hashlib.sha256(plan).hexdigest(),
               "build_seconds": round(build_seconds, 3), "note": note,
               "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    write_atomically(files.engine, plan)
    write_atomically(files.sidecar, (json.dumps(sidecar, indent=2) + "\n").encode())
    for other in files.engine.parent.iterdir():  # older keys of this version: never loaded again
        if other.stem != key.digest and other.suffix in (".engine", ".json"):
            other.unlink(missing_ok=True)


def discard(files: EngineFiles) -> None:
    for path in (files.sidecar, files.engine):
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            logger.warning("cannot remove %s: %s", path, exc)


def _reject(files: EngineFiles, why: str) -> bytes | None:
    """Log why an engine on disk is unusable, remove it, and read it as absent."""
    logger.warning("engine %s is stale or damaged (%s); it will be rebuilt", files.engine, why)
    discard(files)
    return None


