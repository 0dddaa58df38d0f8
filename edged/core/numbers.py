"""Numbers in text from outside the daemon (HTTP headers and query strings, MQTT user
properties and topic levels) are ASCII digits and nothing else. Python's int() also takes
other scripts' digits ("٣"), a sign, spaces and underscores, and str.isdigit() is true of
characters that int() refuses ("²"): neither is a parser for what a remote sends."""

from __future__ import annotations

MAX_DIGITS = 18  # any count or length edged reads fits; and an int64 still holds it


def ascii_int(text: str | None, max_digits: int = MAX_DIGITS) -> int | None:
    """`text` as a non-negative integer when it is 1 to `max_digits` ASCII digits (leading
    zeros allowed), else None: the caller says what it wanted."""
    if text is None or not 0 < len(text) <= max_digits or not text.isascii() \
            or not text.isdigit():
        return None
    return int(text)
