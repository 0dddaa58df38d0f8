"""Telling a JSON document's nesting before it is parsed (issue 41 #3): Triton's limit of 100,
brackets in strings not counted, and a large flat body not walked bracket by bracket."""

from __future__ import annotations

import json

import pytest

from edged.api.http.jsondepth import MAX_DEPTH, check_depth
from edged.core.errors import InvalidInput


def nested(depth: int, inner: str = "1") -> bytes:
    return ("[" * depth + inner + "]" * depth).encode()


@pytest.mark.parametrize("depth", [1, 50, MAX_DEPTH])
def test_check_depth_when_within_the_limit_passes(depth: int) -> None:
    check_depth(nested(depth))
    check_depth(b'{"a": ' + nested(depth - 1) + b"}")


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 120, 250_000])
def test_check_depth_when_deeper_than_the_limit_refuses_it(depth: int) -> None:
    with pytest.raises(InvalidInput, match=r"nesting depth exceeds maximum allowed limit \(100\)"):
        check_depth(nested(depth))


def test_check_depth_when_brackets_are_inside_strings_does_not_count_them() -> None:
    text = json.dumps({"s": "[" * 500 + "{" * 500, "t": ['\\"[[[[', "\"" + "]" * 300],
                       "u": [[["x"]]]}).encode()
    check_depth(text)
    with pytest.raises(InvalidInput):
        check_depth(json.dumps({"s": "[" * 500, "d": json.loads(nested(101))}).encode())


def test_check_depth_when_many_shallow_lists_follow_each_other_passes() -> None:
    rows = json.dumps([[[i, i + 1] for i in range(50_000)]]).encode()  # 100 k brackets, depth 3
    check_depth(rows)
    check_depth(memoryview(rows))


def test_check_depth_when_closers_are_stray_counts_what_follows_them() -> None:
    """Stray closers make the text malformed, and the parser stops at the first of them, so
    depth that follows cannot reach it; what comes before is counted as it is."""
    check_depth(b"]" * 200 + nested(50))
    with pytest.raises(InvalidInput):
        check_depth(b"[" * 60 + b"]" * 10 + b"[" * 60)
