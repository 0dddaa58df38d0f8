"""YAML → typed dataclasses, with every error naming its key path and line.

The daemon config and each model's `model.yaml` are both read through `parse()`. A field is
declared with `setting(default, "one-line help", check=...)`; unknown keys, wrong types and
values that fail a check all become `ConfigIssue`s, collected (not stopping at the first) and
raised together as one `ConfigError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from edged.core.errors import ConfigError, ConfigIssue

T = TypeVar("T")
Check = Callable[[Any], "str | None"]  # returns an error message, or None when the value is fine


def setting(default: Any = dataclasses.MISSING, help: str = "", *, check: Check | None = None,
            factory: Callable[[], Any] | None = None, key: str | None = None) -> Any:
    """Declare a config field with its default, its one-line help and an optional value check.
    `key`: the YAML key when it cannot be the field's name (a Python keyword such as `as`)."""
    metadata = {"help": help, "check": check, "key": key}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class Parsed(typing.Generic[T]):
    value: T
    lines: dict[str, int]  # key path -> 1-based line, for cross-field checks
    # Top-level lists whose items did not all convert: the file's index of each item kept.
    positions: dict[str, list[int]] = field(default_factory=dict)

    def issue(self, path: str, message: str) -> ConfigIssue:
        return ConfigIssue(path, message, self.lines.get(path))

    def at(self, key: str, i: int) -> str:
        """The key path of item `i` of the top-level list `key` as the file has it (items
        that did not convert are left out of a partial value, so the two may differ)."""
        kept = self.positions.get(key)
        return f"{key}[{kept[i] if kept is not None else i}]"


class _Invalid:
    """Marks a value that failed conversion (its issue is already recorded)."""


INVALID: Any = _Invalid()


@dataclass
class _Context:
    loader: yaml.SafeLoader
    issues: list[ConfigIssue] = field(default_factory=list)
    lines: dict[str, int] = field(default_factory=dict)
    # The top-level keys that did convert, kept when others did not: cross-field checks still
    # run on them, so one bad section does not hide the errors of the others.
    converted: dict[str, Any] = field(default_factory=dict)
    positions: dict[str, list[int]] = field(default_factory=dict)  # see Parsed.positions

    def fail(self, path: str, node: yaml.Node, message: str) -> Any:
        self.issues.append(ConfigIssue(path, message, node.start_mark.line + 1))
        return INVALID


def parse(cls: type[T], text: str, *, file: str | None = None,
          checks: Sequence[Callable[[Parsed[T]], list[ConfigIssue]]] = ()) -> Parsed[T]:
    """Parse YAML text into `cls` (a dataclass) and run the cross-field `checks` on it, or
    raise ConfigError with every issue. When some keys do not convert, the checks run on the
    rest (those keys at their defaults, a list's items that did not convert left out), so
    every error is reported at once; the error's `partial` is that value, for checks of
    what it names (`edged check-config` looks at the models too)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([ConfigIssue("", f"invalid YAML: {problem}", line, file)]) from exc
    try:
        if node is None:  # an empty document: every default
            origin = yaml.Mark("<document>", 0, 0, 0, "", 0)
            node = yaml.MappingNode("tag:yaml.org,2002:map", [], origin, origin)
        ctx = _Context(loader)
        value = _convert(cls, node, "", ctx)
    finally:
        loader.dispose()
    issues = list(ctx.issues)
    if issues:  # the value may hold INVALID items: check only what converted
        try:
            value = cls(**ctx.converted)
        except TypeError:  # a required key is missing: no partial value to check
            value = INVALID
    parsed = None if value is INVALID else Parsed(value, ctx.lines, ctx.positions)
    if parsed is not None:
        issues += [issue for check in checks for issue in check(parsed)]
    if issues:
        error = ConfigError([dataclasses.replace(i, file=file) for i in issues])
        error.partial = parsed
        raise error
    return Parsed(value, ctx.lines)


def parse_file(cls: type[T], path: Path,
               checks: Sequence[Callable[[Parsed[T]], list[ConfigIssue]]] = ()) -> Parsed[T]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([ConfigIssue("", f"cannot read: {exc}", None, str(path))]) from exc
    return parse(cls, text, file=str(path), checks=checks)


def _join(path: str, key: str) -> str:
    if not _encodable(key):  # (a lone surrogate: the path is printed, and must print)
        key = key.encode("utf-8", "backslashreplace").decode("utf-8")
    return f"{path}.{key}" if path else key


def _describe(tp: Any) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
             Path: "a path"}
    if tp in names:
        return names[tp]
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    origin = get_origin(tp)
    if origin in (list, tuple):
        return "a list"
    if origin is dict:
        return "a mapping"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(tp) if a is not type(None))
    return getattr(tp, "__name__", str(tp))


def _convert(tp: Any, node: yaml.Node, path: str, ctx: _Context) -> Any:
    ctx.lines.setdefault(path, node.start_mark.line + 1)
    origin = get_origin(tp)
    if tp is Any:
        return ctx.loader.construct_object(node, deep=True)
    if origin in (Union, types.UnionType):
        return _convert_union(tp, node, path, ctx)
    if dataclasses.is_dataclass(tp):
        return _convert_dataclass(tp, node, path, ctx)
    if origin in (list, tuple):
        if not isinstance(node, yaml.SequenceNode):
            return ctx.fail(path, node, f"expected a list, got {_kind(node)}")
        (item_tp, *_rest) = get_args(tp)
        items = [_convert(item_tp, n, f"{path}[{i}]", ctx) for i, n in enumerate(node.value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(node, yaml.MappingNode):
            return ctx.fail(path, node, f"expected a mapping, got {_kind(node)}")
        _key_tp, value_tp = get_args(tp)
        out = {}
        for key_node, value_node in node.value:
            key = ctx.loader.construct_object(key_node)
            if not isinstance(key, str):
                ctx.fail(path, key_node, f"keys must be strings, got {key!r}")
                continue
            if not _encodable(key):
                ctx.fail(path, key_node, f"the key {key!r} is not text UTF-8 can write (a "
                                         "lone surrogate, from an escape like \\ud800)")
                continue
            out[key] = _convert(value_tp, value_node, _join(path, key), ctx)
        return out
    return _convert_scalar(tp, node, path, ctx)


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return repr(node.value) if node.value != "" else "nothing"


def _convert_scalar(tp: Any, node: yaml.Node, path: str, ctx: _Context) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        return ctx.fail(path, node, f"expected {_describe(tp)}, got {_kind(node)}")
    value = ctx.loader.construct_object(node)
    if get_origin(tp) is Literal:
        if value in get_args(tp):
            return value
        return ctx.fail(path, node, f"expected {_describe(tp)}, got {value!r}")
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
        Path: isinstance(value, str) and value != "",
    }.get(tp)
    if ok is None:
        raise TypeError(f"schema: unsupported field type {tp!r} at {path}")
    if not ok:
        return ctx.fail(path, node, f"expected {_describe(tp)}, got {value!r}")
    if isinstance(value, str) and not _encodable(value):
        # YAML's "\ud800" escapes make strs no file, topic or JSON consumer can take
        return ctx.fail(path, node, f"{value!r} is not text UTF-8 can write (a lone "
                                    "surrogate, from an escape like \\ud800)")
    return tp(value) if tp in (float, Path) else value


def _checkable(value: Any) -> Any:
    """What a field's check may see: the value when all of it converted; of a mapping, the
    entries that did (their siblings' errors are still reported in the same run); None when
    nothing can be checked (the value, or an item of a list, did not convert: a check of a
    list's length or order would judge a list that is not the one written)."""
    if value is None or value is INVALID:
        return None
    if isinstance(value, dict) and not _whole(value):
        return {k: v for k, v in value.items() if _whole(v)}
    return value if _whole(value) else None


def _whole(value: Any) -> bool:
    """No part of `value` failed to convert (lists, tuples and mappings looked into)."""
    if value is INVALID:
        return False
    if isinstance(value, (list, tuple)):
        return all(_whole(v) for v in value)
    if isinstance(value, dict):
        return all(_whole(v) for v in value.values())
    return True


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _convert_union(tp: Any, node: yaml.Node, path: str, ctx: _Context) -> Any:
    arms = [a for a in get_args(tp) if a is not type(None)]
    optional = len(arms) < len(get_args(tp))
    if optional and isinstance(node, yaml.ScalarNode) and ctx.loader.construct_object(node) is None:
        return None
    # The node's shape (mapping, list, scalar) picks the arm; only scalars can need a trial.
    matching = [a for a in arms if _shape_of(a) == _node_shape(node)]
    if len(matching) == 1:
        return _convert(matching[0], node, path, ctx)
    for arm in matching:
        trial = _Context(ctx.loader)
        value = _convert(arm, node, path, trial)
        if not trial.issues:
            return value
    return ctx.fail(path, node, f"expected {_describe(tp)}, got {_kind(node)}")


def _shape_of(tp: Any) -> str:
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp) or origin is dict:
        return "mapping"
    if origin in (list, tuple):
        return "sequence"
    return "scalar"


def _node_shape(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "mapping"
    if isinstance(node, yaml.SequenceNode):
        return "sequence"
    return "scalar"


def _convert_dataclass(cls: Any, node: yaml.Node, path: str, ctx: _Context) -> Any:
    if not isinstance(node, yaml.MappingNode):
        return ctx.fail(path, node, f"expected a mapping, got {_kind(node)}")
    hints = typing.get_type_hints(cls)
    # YAML key -> field (a field's YAML key is its name unless setting(key=...) says otherwise)
    fields = {f.metadata.get("key") or f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    ok = True
    for key_node, value_node in node.value:
        key = ctx.loader.construct_object(key_node)
        key_path = _join(path, str(key))
        if not isinstance(key, str) or key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            ctx.fail(key_path, key_node, f"unknown key{hint}")
            ok = False
            continue
        name = fields[key].name
        if name in kwargs:
            ctx.fail(key_path, key_node, "duplicate key")
            ok = False
            continue
        value = _convert(hints[name], value_node, key_path, ctx)
        check = fields[key].metadata.get("check")
        checked = _checkable(value)
        if checked is not None and check is not None:
            message = check(checked)
            if message:
                value = ctx.fail(key_path, value_node, message)
        # A list or mapping with an item that did not convert leaves its dataclass unconverted
        # too, so no check ever meets a half-made value (the top level keeps the items that
        # converted).
        ok = ok and _whole(value)
        kwargs[name] = value
        if not path and value is not INVALID:  # items that did not convert are left out
            if isinstance(value, list) and INVALID in value:
                ctx.positions[name] = [i for i, v in enumerate(value) if v is not INVALID]
                value = [value[i] for i in ctx.positions[name]]
            ctx.converted[name] = value
    for key, f in fields.items():
        no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.name not in kwargs and no_default:
            ctx.fail(_join(path, key), node, "missing required key")
            ok = False
    if not ok:
        return INVALID
    return cls(**kwargs)


# Reusable checks ---------------------------------------------------------------------------

def at_least(low: float) -> Check:
    return lambda v: None if v >= low else f"must be >= {low}, got {v}"


def between(low: float, high: float) -> Check:
    return lambda v: None if low <= v <= high else f"must be between {low} and {high}, got {v}"


def each(check: Check) -> Check:
    def run(values: Any) -> str | None:
        for i, v in enumerate(values):
            message = check(v)
            if message:
                return f"item {i}: {message}"
        return None
    return run


NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # models, streams, zones, groups


def check_name(value: str) -> str | None:
    return None if NAME.match(value) else f"{value!r} is not a valid name ([A-Za-z0-9_.-])"


def check_names(values: list[str]) -> str | None:
    bad = [v for v in values if not NAME.match(v)]
    return f"{bad[0]!r} is not a valid name ([A-Za-z0-9_.-])" if bad else None
