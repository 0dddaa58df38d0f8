"""What a web browser on the device must not do through the loopback TCP listener: a page
from anywhere can make the browser POST to 127.0.0.1 (a "simple" cross-site request needs no
permission when its Content-Type is text/plain or a form's), and a DNS-rebinding page reaches
it under its own host name. Such requests are refused; API clients (tritonclient, curl,
edged's own) send JSON or binary tensors to a loopback name and never look like that."""

from __future__ import annotations

import ipaddress
from functools import lru_cache

# The Content-Types a browser sends cross-site without asking the server first (CORS).
SIMPLE_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded",
                          "multipart/form-data"})
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


@lru_cache(maxsize=256)  # a client sends the same few each time: checked once, not per request
def refusal(method: str, host: str | None, content_type: str) -> str | None:
    """Why a request on the TCP listener looks like a browser's, or None when it does not."""
    name = _host_name(host or "")
    if not _is_loopback(name):
        return (f"Host {host!r} is not a loopback name: the TCP listener answers only "
                "requests addressed to 127.0.0.1, ::1 or localhost")
    if method == "POST" and content_type.lower() in SIMPLE_TYPES:
        return (f"a POST with Content-Type {content_type} is what a web page makes a browser "
                "send; API clients send application/json or binary tensors")
    return None


def _host_name(host: str) -> str:
    """The host part of a Host header: `[::1]:8000` → `::1`, `localhost:80` → `localhost`."""
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _is_loopback(name: str) -> bool:
    if name.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
