"""edged's TensorRT calls against the real bindings (tensorrt-cu13-bindings 10.13 and 11,
tensorrt-cu12-bindings 10.3 as on JetPack 6), imported over stub libraries: every `trt.X`
the code names exists; every attribute edged read, wrote or called on the double while it
built and ran engines (doubles.surface) exists on the real class, is writable where written,
takes that many arguments and returns that kind; the double's enums are the real ones;
edged's logger and progress monitor subclass the real classes; the builder flags edged can
ask for exist in that version."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from callsites import TOOLS, TRT_FILES, chains
from doubles import fake_cudart, fake_tensorrt, surface
from doubles.fake_cudart import DISCRETE, JETSON, FakeCudart
from realmods import TARGETS, build_stubs, install, probe

from edged.backends import BackendOptions, EngineBuilding, LoadSpec
from edged.backends.tensorrt import TensorRTBackend
from edged.backends.trt_build import plan_precision
from edged.hardware.memory import DeviceBufferPool
from edged.inference.loadspec import engine_hints
from edged.model.repository import ModelRepository

TRT = [t for t in TARGETS if t.library == "tensorrt"]
_dumps: dict[str, dict[str, Any]] = {}


def real(target: Any, stub_dir: Path) -> dict[str, Any]:
    if target.name not in _dumps:
        folder = install(target)
        stubs = build_stubs(stub_dir, target.so_version)
        _dumps[target.name] = probe(target, folder, stubs, {})
    return _dumps[target.name]


def exercise(monkeypatch: pytest.MonkeyPatch, repo: ModelRepository, tmp_path: Path,
             weak: bool) -> None:
    """edged's TensorRT backend on the doubles: builds (fp32, fp16, int8-less, DLA, dynamic
    and static), sessions of two instances fed from plain arrays and from every pool kind."""
    surface.SURFACE.clear()
    for props in (DISCRETE, JETSON):
        fake_cudart.install(monkeypatch, FakeCudart(props))
        fake_tensorrt.install(monkeypatch, fake_tensorrt.Knobs(  # DLA builds: a core to see
            weak_typing=weak, host_tensors={"b"}, dla_cores=2 if props is JETSON else 0))
        backend = TensorRTBackend()
        for name, precision, dla in (("tiny_cls", "fp32", None), ("tiny_nobatch", "fp16", None),
                                     ("tiny_two_input", "fp16", 0)):
            model = repo.resolve(name)
            spec = LoadSpec(name, model.version, model.onnx_path, model.inputs, model.outputs,
                            model.max_batch_size, precision,
                            **{**engine_hints(model), "instances": 2})
            options = BackendOptions(providers=("cpu",), cache_dir=tmp_path / props.name.decode(),
                                     dla_core=dla)
            try:
                session = backend.load(spec, options)
            except EngineBuilding as building:
                assert building.upgrade is not None
                building.upgrade.result(timeout=30)
                session = backend.load(spec, options)
            inputs = {t.name: np.ones([2 if i == 0 and model.max_batch_size else d
                                       for i, d in enumerate(t.shape)], t.dtype)
                      for t in model.inputs}
            session.infer(inputs)
            for kind in ("mapped", "managed", "pinned"):
                pool = DeviceBufferPool(4, kind)
                session.infer({k: pool.concatenate(k, [v]) for k, v in inputs.items()})
                pool.close()
            session.close()


def member(dump: dict[str, Any], cls: str, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = dump["classes"].get(cls, {}).get(name)
    return found


def fits(signatures: list[dict[str, Any]], detail: str) -> str | None:
    """Why a call of `detail` (positional count:keywords:result kind) fits no overload."""
    count, keywords, result = detail.split(":")
    names = [k for k in keywords.split(",") if k]
    for sig in signatures:
        given = int(count) + len(names)
        if not sig["variadic"] and not (sig["params"] - sig["optional"] <= given
                                        <= sig["params"]):
            continue
        if any(k not in sig["names"] for k in names):
            continue
        returns = sig["returns"]
        if returns in ("bool", "None", "int", "str") and result not in (returns, "None"):
            return f"returns {returns}, the double {result}"
        return None
    return f"no overload takes {detail.rsplit(':', 1)[0]} ({signatures})"


@pytest.mark.parametrize("target", TRT, ids=[t.name for t in TRT])
def test_every_tensorrt_call_edged_makes_fits_the_real_bindings(
        target: Any, stub_dir: Path, monkeypatch: pytest.MonkeyPatch, repo: ModelRepository,
        tmp_path: Path) -> None:
    dump = real(target, stub_dir)
    major = int(dump["version"].split(".")[0])
    exercise(monkeypatch, repo, tmp_path, weak=major < 11)
    problems = []
    for dotted, where in {**chains(TRT_FILES, {"trt"}, False),
                          **chains(TOOLS, {"trt"}, False)}.items():
        head, *rest = dotted.split(".")
        if head in dump["enums"]:
            ok = not rest or rest[0] in dump["enums"][head]
        elif head in dump["classes"]:
            ok = not rest or member(dump, head, rest[0]) is not None
        else:
            ok = head in dump["values"] and not rest
        if not ok:
            problems.append(f"trt.{dotted} ({where[0]})")
    for cls, name, how, detail in sorted(surface.SURFACE):
        found = member(dump, cls, name)
        if found is None:
            problems.append(f"{cls}.{name}: not in the real class")
        elif how == "set" and not found.get("writable"):
            problems.append(f"{cls}.{name}: written, but read-only in the real class")
        elif how == "call":
            why = (fits(found["signatures"], detail) if found["kind"] == "method"
                   else "called, but not a method")
            if why:
                problems.append(f"{cls}.{name}: {why}")
        elif how == "get" and found["kind"] == "method":
            problems.append(f"{cls}.{name}: read as a property, but a method in the real one")
    assert not problems, f"TensorRT {dump['version']}:\n" + "\n".join(problems)
    assert {row[:2] for row in surface.SURFACE} >= {
        ("IExecutionContext", "execute_async_v3"), ("IExecutionContext", "set_tensor_address"),
        ("ICudaEngine", "get_tensor_location"), ("IBuilderConfig", "set_flag")}


@pytest.mark.parametrize("target", TRT, ids=[t.name for t in TRT])
def test_the_doubles_enums_and_edgeds_subclasses_match_the_real_bindings(
        target: Any, stub_dir: Path) -> None:
    dump = real(target, stub_dir)
    major = int(dump["version"].split(".")[0])
    module = fake_tensorrt.make_module(fake_tensorrt.Knobs(weak_typing=major < 11))
    for name in ("DataType", "TensorIOMode", "TensorLocation", "MemoryPoolType", "DeviceType",
                 "BuilderFlag"):
        ours = set(getattr(module, name).__members__)
        assert ours <= set(dump["enums"][name]), (name, ours - set(dump["enums"][name]))
    severity = dump["classes"]["ILogger"]["Severity"]["members"]
    assert set(fake_tensorrt.ILogger.Severity.__members__) <= set(severity)
    edged = dump["edged"]
    assert (edged["logger"], edged["monitor"]) == ("ok", "ok")
    assert edged["weakly_typed"] is (major < 11)
    assert edged["nptype"]["HALF"] == str(np.float16) and edged["nptype"]["INT8"] == str(np.int8)
    flags = set(dump["enums"]["BuilderFlag"])
    for asked, qdq, dla in itertools.product(("fp32", "fp16", "int8"), (False, True),
                                             (False, True)):
        plan = plan_precision(asked, has_qdq=qdq, weak_typing=major < 11, dla=dla)
        assert set(plan.flags) | set(plan.cleared) <= flags, (asked, qdq, dla, plan)
    monitor = dump["classes"]["IProgressMonitor"]
    assert {"phase_start", "step_complete", "phase_finish"} <= set(monitor)


def test_a_call_outside_the_real_surface_fails_the_check() -> None:
    """The check itself: an overload mismatch and a wrong result kind are both caught."""
    signature = [{"params": 2, "optional": 0, "names": ["name", "memory"], "variadic": False,
                  "returns": "bool"}]
    assert fits(signature, "2::bool") is None
    assert "no overload" in (fits(signature, "1::bool") or "")
    assert "returns bool" in (fits(signature, "2::NoneType") or fits(signature, "2::int") or "")
