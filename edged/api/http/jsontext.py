"""A request's JSON text, decoded as the one encoding JSON between systems may use (RFC 8259
§8.1: UTF-8). UTF-16 and UTF-32, which Python's `json.loads` would sniff and take from bytes,
are refused with a message that says so: a body the server read in an encoding its byte-level
checks do not look at would pass them unseen (issue 49, item 2: a UTF-16 header naming a
shared memory region was taken for one that names none). A UTF-8 byte order mark is skipped,
as RFC 8259 lets a parser do."""

from __future__ import annotations

import json
from typing import Any

from edged.api.http.jsondepth import check_depth
from edged.core.errors import InvalidInput

_DECODER = json.JSONDecoder()
# Byte order marks of the encodings refused, longest first (UTF-32's begin as UTF-16's do).
_FOREIGN_BOMS = ((b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe\x00\x00", "UTF-32"),
                 (b"\xfe\xff", "UTF-16"), (b"\xff\xfe", "UTF-16"))


def loads(raw: bytes) -> Any:
    """The JSON value of `raw` (UTF-8, nested at most jsondepth.MAX_DEPTH deep), or an
    InvalidInput saying what is wrong."""
    check_depth(raw)  # before the parser meets it
    try:
        # "utf-8" needs no codec looked up: a client that dropped its privileges may no
        # longer import one.
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"the JSON is not UTF-8 ({_foreign(raw) or exc.reason} at byte "
                           f"{exc.start}); JSON between systems is UTF-8 (RFC 8259 §8.1)"
                           ) from None
    if "\x00" in text[:4]:  # UTF-16 or UTF-32 without a byte order mark
        raise InvalidInput(f"the JSON is not UTF-8 ({_foreign(raw) or 'NUL bytes'}); JSON "
                           "between systems is UTF-8 (RFC 8259 §8.1)")
    try:
        return _DECODER.decode(text[1:] if text.startswith("\ufeff") else text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"malformed JSON: {exc}") from exc
    except RecursionError as exc:  # a hostile body nested deeper than the parser can go
        raise InvalidInput("malformed JSON: nested too deeply") from exc


def _foreign(raw: bytes) -> str | None:
    """The encoding `raw` looks like, where it is one JSON may not be sent in."""
    for bom, name in _FOREIGN_BOMS:
        if raw.startswith(bom):
            return f"{name} with a byte order mark"
    head = raw[:4]
    if len(head) == 4 and head.count(0) == 3:
        return "UTF-32"
    if head[:2].count(0) == 1:
        return "UTF-16"
    return None
