"""HTTP Range for clips (RFC 9110): one byte range honoured, a start past the end is
unsatisfiable (416), several ranges or a malformed one ignored (the whole file)."""

from __future__ import annotations

import pytest

from edged.api.clips import byte_range


@pytest.mark.parametrize(("header", "expected"), [
    (None, None),
    ("bytes=0-99", (0, 99)),
    ("bytes=100-", (100, 999)),
    ("bytes=-100", (900, 999)),
    ("bytes=-5000", (0, 999)),
    ("bytes=990-5000", (990, 999)),
    ("bytes=1000-", ()),
    ("bytes=5000-6000", ()),
    ("bytes=-0", ()),
    ("bytes=0-1,5-9", None),
    ("bytes=9-1", None),
    ("items=0-1", None),
    ("bytes=-", None),
    ("bytes=٣-", None),
])
def test_byte_range_when_asked_answers_like_rfc_9110(header: str | None,
                                                     expected: object) -> None:
    assert byte_range(header, 1000) == expected
