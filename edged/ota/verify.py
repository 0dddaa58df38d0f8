"""The checks an update passes before and after it is installed: the artifact is the one the
manifest describes (size, sha256), the model's inputs and outputs are what the manifest and
the serving version promise, and the golden inputs a bundle carries give its golden outputs.
Each failure is a `Rejected` with the reason code the device reports."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from edged.core.errors import EdgedError
from edged.core.fsutil import file_sha256
from edged.model.repository import ModelVersion
from edged.ota.manifest import Manifest, Rejected, Tensor

Signature = tuple[tuple[Tensor, ...], tuple[Tensor, ...]]
Infer = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]
DEFAULT_TOLERANCE = {"rtol": 1e-3, "atol": 1e-5}


def verify_artifact(manifest: Manifest, path: Path) -> None:
    size = path.stat().st_size
    if size != manifest.artifact.size:
        raise Rejected("size_mismatch", f"the artifact is {size} bytes; the manifest says "
                                        f"{manifest.artifact.size}")
    digest = file_sha256(path)
    if digest != manifest.artifact.sha256:
        raise Rejected("sha256_mismatch", f"the artifact's sha256 is {digest[:16]}..., the "
                                          f"manifest says {manifest.artifact.sha256[:16]}...")


def check_io(manifest: Manifest, candidate: ModelVersion, serving: ModelVersion | None) -> None:
    """The candidate's I/O against the manifest's `io` (when given) and, unless the manifest
    allows a change, against the version serving now."""
    got = signature_of(candidate)
    if manifest.io is not None:
        batched = candidate.max_batch_size > 0
        inputs, outputs = (tuple(Tensor(t.name, t.dtype, ((-1,) if batched else ()) + t.shape)
                                 for t in side) for side in manifest.io)
        want = (inputs, outputs)
        if not compatible(want, got):
            raise Rejected("io_mismatch", f"the model's I/O {describe(got)} is not the "
                                          f"manifest's {describe(want)}")
    if serving is None or manifest.allow_io_change:
        return
    held = signature_of(serving)
    if not compatible(held, got):
        raise Rejected("io_mismatch", f"version {manifest.version} has I/O {describe(got)}; "
                                      f"version {serving.version} has {describe(held)} "
                                      "(set allow_io_change)")


def golden_check(folder: Path, infer: Infer) -> None:
    """Run a bundle's golden inputs (`inputs.npz`) and compare with `outputs.npz` within
    `tolerance.json` (rtol/atol); nothing to do when the version has no golden folder."""
    if not folder.is_dir():
        return
    try:
        tolerance = dict(DEFAULT_TOLERANCE)
        if (folder / "tolerance.json").is_file():
            tolerance.update(_tolerance(json.loads((folder / "tolerance.json").read_text())))
        with np.load(folder / "inputs.npz") as f:
            inputs = {k: f[k] for k in f.files}
        with np.load(folder / "outputs.npz") as f:
            expected = {k: f[k] for k in f.files}
    except (OSError, ValueError, TypeError) as exc:
        raise Rejected("golden_failed", f"unreadable golden check: {exc}") from None
    try:
        outputs = infer(inputs)
    except EdgedError as exc:
        raise Rejected("golden_failed", f"the golden inputs do not run: {exc}") from None
    for key, want in expected.items():
        got = outputs.get(key)
        if got is None or got.shape != want.shape or not np.allclose(
                got, want, rtol=tolerance["rtol"], atol=tolerance["atol"]):
            worst = float(np.max(np.abs(got - want))) if got is not None and \
                got.shape == want.shape else float("nan")
            raise Rejected("golden_failed", f"output {key!r} differs from the golden output "
                                            f"(max abs error {worst:.3g}, tolerance "
                                            f"{tolerance})")


def _tolerance(document: object) -> dict[str, float]:
    """`{"rtol": r, "atol": a}` (either may be left out): finite numbers >= 0. Anything else
    is a bundle that cannot say how close is close enough, so it fails (never fails open)."""
    if not isinstance(document, dict) or set(document) - set(DEFAULT_TOLERANCE):
        raise ValueError('tolerance.json must be an object with "rtol" and/or "atol"')
    for key, value in document.items():
        if not isinstance(value, int | float) or isinstance(value, bool) or \
                not math.isfinite(value) or value < 0:
            raise ValueError(f"tolerance.json: {key} must be a finite number >= 0, got "
                             f"{value!r:.40}")
    return {key: float(value) for key, value in document.items()}


def signature_of(model: ModelVersion) -> Signature:
    inputs, outputs = (tuple(Tensor(s.name, str(s.dtype), tuple(s.shape)) for s in side)
                       for side in (model.inputs, model.outputs))
    return inputs, outputs


def compatible(a: Signature, b: Signature) -> bool:
    """Same names and dtypes; shapes equal where both are fixed (-1 matches anything)."""
    for side_a, side_b in zip(a, b, strict=True):
        if sorted(t.name for t in side_a) != sorted(t.name for t in side_b):
            return False
        by_name = {t.name: t for t in side_b}
        for t in side_a:
            u = by_name[t.name]
            if t.dtype != u.dtype or len(t.shape) != len(u.shape) or any(
                    x != y and x != -1 and y != -1 for x, y in zip(t.shape, u.shape,
                                                                   strict=True)):
                return False
    return True


def describe(sig: Signature) -> str:
    inputs, outputs = (", ".join(f"{t.name}:{t.dtype}{list(t.shape)}" for t in side)
                       for side in sig)
    return f"({inputs}) -> ({outputs})"
