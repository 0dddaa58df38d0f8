"""An answer's head: its status line and headers, with the Date value formatted once a second
(the connection reuses a whole head while an answer says the same; the streams' heads take the
Date from here too)."""

from __future__ import annotations

import time
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

from edged.api.http.messages import Response

_REASONS = {s.value: s.phrase for s in HTTPStatus}
_date: list[Any] = ["", 0]


def http_date() -> str:
    """The Date header's value, formatted once a second."""
    now = int(time.time())
    if now != _date[1]:
        _date[0], _date[1] = formatdate(now, usegmt=True), now
    return str(_date[0])


def answer_head(response: Response, length: int, keep: bool, version: str, date: str) -> bytes:
    """An answer's status line and headers."""
    head = [f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Unknown')}\r\n"
            f"Content-Type: {response.content_type}\r\nContent-Length: {length}\r\n"
            f"Date: {date}\r\n"]
    if response.headers:
        head += [f"{k}: {v}\r\n" for k, v in response.headers.items()]
    if not keep:
        head.append("Connection: close\r\n")
    elif version == "1.0":
        head.append("Connection: keep-alive\r\n")
    head.append("\r\n")
    return "".join(head).encode("latin-1")
