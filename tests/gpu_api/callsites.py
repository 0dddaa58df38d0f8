"""Where edged reaches into cuda-python and TensorRT, read from its source: every attribute
chain rooted at the module (`cudart.cudaMemcpyKind.cudaMemcpyHostToDevice`, `gpu.runtime()
.cudaStreamSynchronize`, `trt.BuilderFlag`), so the conformance tests check what the code
really names rather than a list someone keeps."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CUDA_FILES = ["edged/hardware/gpu.py", "edged/hardware/memory.py", "edged/backends/*.py"]
TRT_FILES = ["edged/backends/*.py"]
TOOLS = ["tools/gpu_selftest.py", "tools/gpu_check/*.py", "tools/bench/gpu_copies.py"]


def files(patterns: list[str]) -> list[Path]:
    return sorted(p for pattern in patterns for p in ROOT.glob(pattern))


def _chain(node: ast.expr) -> tuple[ast.expr, list[str]]:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.insert(0, node.attr)
        node = node.value
    return node, parts


def _is_runtime_call(node: ast.expr) -> bool:
    """`gpu.runtime()` or `runtime()`: edged's accessor for cuda.bindings.runtime."""
    if not isinstance(node, ast.Call):
        return False
    fn = node.func
    return (isinstance(fn, ast.Name) and fn.id == "runtime") or (
        isinstance(fn, ast.Attribute) and fn.attr == "runtime" and
        isinstance(fn.value, ast.Name) and fn.value.id == "gpu")


def chains(patterns: list[str], module_names: set[str], runtime_calls: bool
           ) -> dict[str, list[str]]:
    """Dotted names used on the module (bound to one of `module_names`, or returned by
    gpu.runtime() when `runtime_calls`), each with where it is used."""
    found: dict[str, list[str]] = {}
    for path in files(patterns):
        tree = ast.parse(path.read_text(), str(path))
        inner: set[int] = set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or id(node) in inner:
                continue
            root, parts = _chain(node)
            sub = node.value
            while isinstance(sub, ast.Attribute):  # only the longest chain counts
                inner.add(id(sub))
                sub = sub.value
            if (isinstance(root, ast.Name) and root.id in module_names) or (
                    runtime_calls and _is_runtime_call(root)):
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                found.setdefault(".".join(parts), []).append(where)
    return found
