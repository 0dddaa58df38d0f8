"""How deep a JSON request nests, told before it is parsed: a document nested deeper than
MAX_DEPTH is refused as Triton refuses one (its limit, 100), so a hostile body neither runs
the parser's recursion down nor makes a list per bracket first. C-speed scans (bytes.count,
re, translate, numpy) on the text; a Python step per bracket would be the very cost refused."""

from __future__ import annotations

import numpy as np

from edged.core.errors import InvalidInput

MAX_DEPTH = 100
_DELETE = bytes(sorted(set(range(256)) - set(b'"[]{}')))  # all but quotes and brackets
_QUOTE, _OPENS, _CLOSES = ord('"'), (ord("["), ord("{")), (ord("]"), ord("}"))
_BLOCK = 1 << 14  # marks looked at a time: memory bounded whatever the body


def check_depth(text: bytes | memoryview, limit: int = MAX_DEPTH) -> None:
    """InvalidInput when `text` (JSON, well-formed or not) nests containers deeper than
    `limit`. Brackets inside strings do not count; a document with no more than `limit`
    brackets in all is not looked at further. Peaks at ~2x the text (tracemalloc), well
    under what parsing it would make."""
    raw = bytes(text) if isinstance(text, memoryview) else text
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return
    if b"\\" in raw:  # an escaped backslash, then an escaped quote, is no delimiter
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = np.frombuffer(raw.translate(None, _DELETE), np.uint8)
    del raw
    level, quoted = 0, 0
    for start in range(0, len(marks), _BLOCK):
        block = marks[start:start + _BLOCK]
        # Inside a string where an odd number of quotes came before (this mark included).
        inside = np.bitwise_xor.accumulate((block == _QUOTE).view(np.uint8)) ^ quoted
        quoted = int(inside[-1])
        steps = ((block == _OPENS[0]) | (block == _OPENS[1])).astype(np.int32)
        steps -= (block == _CLOSES[0]) | (block == _CLOSES[1])
        steps[inside.view(bool)] = 0
        levels = np.cumsum(steps, out=steps)
        if level + int(levels.max()) > limit:
            raise InvalidInput(f"JSON nesting depth exceeds maximum allowed limit ({limit})")
        level += int(levels[-1])
