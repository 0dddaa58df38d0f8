"""What a web browser on the device must not do through the API's listeners on another
site's behalf. A page from anywhere can make the browser send requests to 127.0.0.1: a
`fetch(url, {method: "POST", mode: "no-cors"})` with a typeless body (no Content-Type at all)
or a "simple" one (text/plain, a form's) needs no permission, the answer is opaque to the page
but the request has done its work; a DNS-rebinding page reaches the port under its own host
name. API clients (tritonclient, perf_analyzer, curl, edged's own) send none of a browser's
marks, so they pass whatever their Content-Type, or none.

What is refused, with 403 `forbidden`:
- on the TCP listener, a Host that is not a loopback name (DNS rebinding);
- a request whose `Sec-Fetch-Site` (set by the browser; a page's script cannot) is
  `cross-site` or `same-site` (another port of the device is another site's page too), but for
  a top-level GET navigation (a link to the status page: its answer goes to the tab, never to
  the page that linked it);
- on the TCP listener, an `Origin` that is not the listener's own: `http://` a loopback name
  and the port the request came in on (the daemon's own page, opened as 127.0.0.1, [::1] or
  localhost); `null` (a sandboxed frame, a file:// page) is never its own;
- on the TCP listener, a POST with a Content-Type a browser sends cross-site without asking
  first (for browsers that send neither Origin nor Sec-Fetch-*).

On the Unix socket no browser connects, but a reverse proxy may pass a browser's requests on:
there the `Sec-Fetch-Site` rule holds as on TCP, `Origin: null` is refused on a method that
changes something, and any other Origin passes (a proxy's public name is not the socket's to
know). Every value is checked in the request's own header bytes, so a connection's replay of a
request (`edged.api.http.replays`: the same head, byte for byte) was checked when it came first."""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from edged.core.numbers import ascii_int

# The Content-Types a browser sends cross-site without asking the server first (CORS).
SIMPLE_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded",
                          "multipart/form-data"})
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
OTHER_SITES = frozenset({"cross-site", "same-site"})  # Sec-Fetch-Site: same-origin, none pass
READS = frozenset({"GET", "HEAD"})


@lru_cache(maxsize=256)  # a client sends the same few each time: checked once, not per request
def refusal(method: str, host: str | None, content_type: str, origin: str | None = None,
            site: str | None = None, mode: str | None = None, dest: str | None = None,
            port: int | None = None) -> str | None:
    """Why a request on the TCP listener (`port`: the one it came in on) is a browser's on
    another site's behalf, or None when it is not. `origin`, `site`, `mode` and `dest` are
    the Origin and Sec-Fetch-Site/-Mode/-Dest headers (None: absent)."""
    name = _host_name(host or "")
    if not _is_loopback(name):
        return (f"Host {host!r} is not a loopback name: the TCP listener answers only "
                "requests addressed to 127.0.0.1, ::1 or localhost")
    why = _from_another_site(method, site, mode, dest)
    if why is not None:
        return why
    if origin is not None and not own_origin(origin, port):
        return (f"Origin {origin[:80]!r} is not this listener's own (http://127.0.0.1, [::1] "
                f"or localhost on port {port}): a page of another site made the browser "
                "send this")
    if method == "POST" and content_type.lower() in SIMPLE_TYPES:
        return (f"a POST with Content-Type {content_type} is what a web page makes a browser "
                "send; API clients send application/json or binary tensors")
    return None


@lru_cache(maxsize=64)
def unix_refusal(method: str, origin: str | None, site: str | None, mode: str | None,
                 dest: str | None) -> str | None:
    """The same on the Unix socket, for a browser's request a reverse proxy passed on."""
    why = _from_another_site(method, site, mode, dest)
    if why is None and origin == "null" and method not in READS:
        why = ("Origin 'null' (a sandboxed frame or a file:// page) may not change "
               "anything")
    return why


def own_origin(origin: str, port: int | None) -> bool:
    """Whether `origin` is `http://` a loopback name on `port` (80 when it names none)."""
    scheme, sep, authority = origin.partition("://")
    if not sep or scheme.lower() != "http" or port is None:
        return False
    name = _host_name(authority)
    if ":" in name and not authority.startswith("["):
        return False  # an IPv6 address is bracketed in an origin
    given = authority[len(name) + (2 if authority.startswith("[") else 0):]
    number = ascii_int(given[1:]) if given.startswith(":") else None
    if given and number is None:
        return False  # a path, user info, a port in other digits: no origin has them
    return _is_loopback(name) and (80 if number is None else number) == port


def _from_another_site(method: str, site: str | None, mode: str | None,
                       dest: str | None) -> str | None:
    if site is None or site.lower() not in OTHER_SITES:
        return None
    if method in READS and mode == "navigate" and dest in (None, "document"):
        return None  # a link followed in a tab: the page that linked it sees nothing
    return (f"Sec-Fetch-Site: {site}: a page of another site made the browser send this; "
            "the API answers the daemon's own page and API clients")


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
