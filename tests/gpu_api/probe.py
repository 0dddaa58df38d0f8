"""Run in a subprocess by the API conformance suite, with a real module importable: reads a
JSON request on stdin, writes what the real module says on stdout. Never imported by tests.

    probe.py cuda      cuda.bindings.runtime: names, struct fields, and calls replayed
    probe.py tensorrt  tensorrt (the bindings over stub libraries): every class's members
                       with their signatures, the enums, and edged's own subclasses built
"""

from __future__ import annotations

import enum
import inspect
import json
import re
import sys
import threading
from typing import Any

SIGNATURE = re.compile(r"^(?:\d+\. )?(\w+)\((.*)\) -> (.+)$")


def split_params(text: str) -> list[str]:
    """Top-level comma split of a pybind signature's parameters."""
    params, depth, current = [], 0, ""
    for char in text:
        if char in "([{<":
            depth += 1
        elif char in ")]}>":
            depth -= 1
        if char == "," and depth == 0:
            params.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        params.append(current.strip())
    return params


def signatures(doc: str | None, name: str) -> list[dict[str, Any]]:
    """Each overload pybind documents: positional parameters (after self), how many are
    optional, their names, and the return type's last dotted part."""
    out = []
    for line in (doc or "").splitlines():
        match = SIGNATURE.match(line.strip())
        if not match or match.group(1) != name:
            continue
        params = split_params(match.group(2))
        if params and params[0].startswith("self"):
            params = params[1:]
        names = [p.split(":")[0].split("=")[0].strip() for p in params]
        out.append({"params": len(params), "optional": sum("=" in p for p in params),
                    "names": names, "variadic": any(p.startswith("*") for p in params),
                    "returns": match.group(3).strip().split(".")[-1]})
    return out


def is_enum(value: Any) -> bool:
    return isinstance(value, type) and (issubclass(value, enum.Enum) or
                                        hasattr(value, "__members__"))


def describe_class(cls: type) -> dict[str, Any]:
    members: dict[str, Any] = {}
    for name in dir(cls):
        if name.startswith("__") and name != "__init__":
            continue
        value = inspect.getattr_static(cls, name, None)
        for klass in cls.__mro__:  # the defining class's own entry
            if name in vars(klass):
                value = vars(klass)[name]
                break
        if isinstance(value, property):
            members[name] = {"kind": "property", "writable": value.fset is not None}
        elif is_enum(value):
            members[name] = {"kind": "enum", "members": sorted(value.__members__)}
        elif callable(value):
            members[name] = {"kind": "method",
                             "signatures": signatures(getattr(value, "__doc__", None), name)}
        else:
            members[name] = {"kind": "value"}
    return members


def tensorrt(request: dict[str, Any]) -> dict[str, Any]:
    import tensorrt_bindings

    sys.modules["tensorrt"] = tensorrt_bindings
    trt = tensorrt_bindings
    answer: dict[str, Any] = {"version": trt.__version__, "classes": {}, "enums": {},
                              "values": []}
    for name in dir(trt):
        value = getattr(trt, name)
        if is_enum(value):
            answer["enums"][name] = sorted(value.__members__)
        elif isinstance(value, type):
            answer["classes"][name] = describe_class(value)
        elif not name.startswith("_"):
            answer["values"].append(name)
    answer["values"].append("__version__")
    answer["edged"] = edged_subclasses(trt)
    return answer


def edged_subclasses(trt: Any) -> dict[str, Any]:
    """edged's ILogger and IProgressMonitor subclasses, made with the real module."""
    from edged.backends import trt_build

    out: dict[str, Any] = {"weakly_typed": trt_build.weakly_typed(trt)}
    try:
        log = trt_build.trt_logger(trt)
        log.log(trt.ILogger.Severity.WARNING, "probe")
        out["logger"] = "ok"
    except Exception as exc:  # reported, not raised: the test says which
        out["logger"] = f"{type(exc).__name__}: {exc}"
    try:
        cancelled = threading.Event()
        monitor = trt_build._progress_monitor(trt, "probe", cancelled)
        monitor.phase_start("Building", None, 2)
        keep = monitor.step_complete("Building", 0)
        cancelled.set()
        stop = monitor.step_complete("Building", 1)
        monitor.phase_finish("Building")
        out["monitor"] = "ok" if (keep, stop) == (True, False) else f"returned {keep}, {stop}"
    except Exception as exc:
        out["monitor"] = f"{type(exc).__name__}: {exc}"
    out["nptype"] = {name: str(trt.nptype(getattr(trt.DataType, name)))
                     for name in ("FLOAT", "HALF", "INT8", "INT32", "BOOL")}
    return out


def cuda(request: dict[str, Any]) -> dict[str, Any]:
    from cuda import bindings
    from cuda.bindings import runtime as rt

    answer: dict[str, Any] = {"version": bindings.__version__, "names": {}, "calls": [],
                              "structs": {}, "values": {}}
    for dotted in request["names"]:
        value: Any = rt
        for part in dotted.split("."):
            value = getattr(value, part, None)
        answer["names"][dotted] = None if value is None else (
            "function" if callable(value) and not isinstance(value, type) else
            "enum" if is_enum(value) else "type" if isinstance(value, type) else
            type(value).__name__)
        if isinstance(value, int):  # flags and enum members: the double must agree
            answer["values"][dotted] = int(value)
    for struct, fields in request["structs"].items():
        instance = getattr(rt, struct)()
        answer["structs"][struct] = [f for f in fields if not hasattr(instance, f)]
    for name, args in request["calls"]:
        try:
            result = getattr(rt, name)(*[decode(rt, a) for a in args])
            answer["calls"].append({"name": name, "len": len(result),
                                    "error": getattr(result[0], "name", str(result[0]))})
        except Exception as exc:
            answer["calls"].append({"name": name, "raised": f"{type(exc).__name__}: {exc}"})
    return answer


def decode(rt: Any, arg: Any) -> Any:
    """An argument as the double saw it, rebuilt with the real module's types."""
    if isinstance(arg, dict) and "enum" in arg:
        return getattr(getattr(rt, arg["enum"]), arg["member"])
    if isinstance(arg, dict) and "struct" in arg:
        value = getattr(rt, arg["struct"])()
        for field, item in arg["fields"].items():
            setattr(value, field, decode(rt, item))
        return value
    return arg


if __name__ == "__main__":
    kind = sys.argv[1]
    json.dump({"cuda": cuda, "tensorrt": tensorrt}[kind](json.load(sys.stdin)), sys.stdout)
