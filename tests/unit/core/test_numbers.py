"""ascii_int: a remote's number is ASCII digits, whatever else int() or str.isdigit() takes."""

from __future__ import annotations

import pytest

from edged.core.numbers import MAX_DIGITS, ascii_int


@pytest.mark.parametrize("text, value", [("0", 0), ("7", 7), ("007", 7), ("1234", 1234),
                                         ("9" * MAX_DIGITS, 10 ** MAX_DIGITS - 1)])
def test_ascii_int_when_ascii_digits_reads_them(text: str, value: int) -> None:
    assert ascii_int(text) == value


@pytest.mark.parametrize("text", [
    None, "", "\u00b2",            # isdigit() but not int()
    "\u0663", "\uff13", "\u0967",  # int() takes them: Arabic-Indic, fullwidth, Devanagari
    "+3", "-3", " 3", "3 ", "3\n", "1_000", "0x10", "1e3", "3.0", "9" * (MAX_DIGITS + 1)])
def test_ascii_int_when_anything_else_is_none(text: str | None) -> None:
    assert ascii_int(text) is None


def test_ascii_int_when_given_a_smaller_bound_holds_it() -> None:
    assert ascii_int("123456789", 9) == 123456789 and ascii_int("1234567890", 9) is None
