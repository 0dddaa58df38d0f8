"""What code outside a double touches of it: `Recorded` classes log each attribute read, write
and call made from another module (the double's own code is not logged), as
(class, attribute, how, detail) rows in `SURFACE`. tests/gpu_api holds those rows against the
real library: the class has the attribute, a written one is writable, a call's argument
count fits one of the real overloads and its result is of the kind the real one returns."""

from __future__ import annotations

import sys
import threading
from typing import Any

SURFACE: set[tuple[str, str, str, str]] = set()
_lock = threading.Lock()


def _outside(depth: int = 2) -> bool:
    caller = sys._getframe(depth).f_globals.get("__name__", "")
    return not caller.startswith("doubles.")


def _kind(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return repr(value) if value is None else "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (tuple, list)):
        return "sequence"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "buffer"
    return type(value).__name__


def _note(row: tuple[str, str, str, str]) -> None:
    with _lock:
        SURFACE.add(row)


class Recorded:
    """Mixin: a double class whose public surface use is recorded."""

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if name.startswith("_") or not _outside():
            return value
        cls = _real_name(type(self))
        if callable(value) and not isinstance(value, type):
            def call(*args: Any, **kwargs: Any) -> Any:
                result = value(*args, **kwargs)
                detail = f"{len(args)}:{','.join(sorted(kwargs))}:{_kind(result)}"
                _note((cls, name, "call", detail))
                return result

            return call
        _note((cls, name, "get", _kind(value)))
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_") and _outside():
            _note((_real_name(type(self)), name, "set", _kind(value)))
        object.__setattr__(self, name, value)


def _real_name(cls: type) -> str:
    """The name of the real class a double (or a module's subclass of it) stands for."""
    for klass in cls.__mro__:
        if klass.__module__.startswith("doubles."):
            return klass.__name__
    return cls.__name__
