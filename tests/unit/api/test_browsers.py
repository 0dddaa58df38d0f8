"""The loopback TCP listener's guard against web pages: loopback Host names pass in every
spelling, anything else is refused, and so are the Content-Types a browser sends cross-site
without asking; and any request a page of another site sends (its Origin or
Sec-Fetch-Site says so), whatever its Content-Type."""

from __future__ import annotations

import pytest

from edged.api.http.browsers import own_origin, refusal, unix_refusal


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "127.0.0.1", "localhost:8000", "[::1]:8000",
                                  "::1", "127.5.6.7:80", "LOCALHOST"])
def test_refusal_when_the_host_is_a_loopback_name_lets_api_requests_through(host: str) -> None:
    assert refusal("POST", host, "application/json") is None
    assert refusal("POST", host, "application/octet-stream") is None
    assert refusal("GET", host, "text/plain") is None  # a GET changes nothing


@pytest.mark.parametrize("host", ["attacker.example:8000", "10.0.0.5:8000", "", None,
                                  "[2001:db8::1]:80", "127.0.0.1.nip.io"])
def test_refusal_when_the_host_is_not_loopback_names_it(host: str | None) -> None:
    assert "is not a loopback name" in (refusal("GET", host, "") or "")


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data", "TEXT/PLAIN"])
def test_refusal_when_a_post_has_a_browsers_simple_type_refuses_it(content_type: str) -> None:
    assert "what a web page makes a browser send" in (
        refusal("POST", "127.0.0.1:8000", content_type) or "")


# -- Origin and Sec-Fetch-Site: a page of another site, whatever its Content-Type -------------
OWN = "127.0.0.1:8000"


@pytest.mark.parametrize("content_type", ["application/octet-stream", "application/json"])
@pytest.mark.parametrize("origin", ["https://evil.example", "http://127.0.0.1:9000",
                                    "http://localhost", "https://127.0.0.1:8000", "null",
                                    "http://evil.example:8000", "http://127.0.0.1:8000/x",
                                    "http://::1:8000", "http://user@127.0.0.1:8000"])
def test_refusal_when_the_origin_is_not_the_listeners_own_refuses_any_content_type(
        origin: str, content_type: str) -> None:
    # No Content-Type (a typeless Blob) reads as octet-stream: not a licence.
    why = refusal("POST", OWN, content_type, origin, None, None, None, 8000)
    assert why is not None and "is not this listener's own" in why
    assert refusal("GET", OWN, "", origin, None, None, None, 8000) is not None


@pytest.mark.parametrize("origin", ["http://127.0.0.1:8000", "http://localhost:8000",
                                    "http://[::1]:8000", "HTTP://LOCALHOST:8000",
                                    "http://127.0.0.1"])
def test_refusal_when_the_origin_is_the_listeners_own_lets_its_page_post(origin: str) -> None:
    port = 80 if origin.endswith("127.0.0.1") else 8000
    assert refusal("POST", f"127.0.0.1:{port}", "application/json", origin, "same-origin",
                   "cors", "empty", port) is None


@pytest.mark.parametrize("site", ["cross-site", "same-site", "CROSS-SITE"])
@pytest.mark.parametrize(("method", "mode", "dest"), [
    ("POST", "no-cors", "empty"), ("POST", "navigate", "document"), ("GET", "no-cors", "image"),
    ("GET", "cors", "empty"), ("GET", "navigate", "iframe"), ("DELETE", "cors", "empty")])
def test_refusal_when_sec_fetch_site_is_another_sites_refuses_it(
        site: str, method: str, mode: str, dest: str) -> None:
    why = refusal(method, OWN, "application/json", None, site, mode, dest, None)
    assert why is not None and f"Sec-Fetch-Site: {site}" in why


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_refusal_when_another_site_links_the_page_lets_the_tab_open_it(method: str) -> None:
    assert refusal(method, OWN, "", None, "cross-site", "navigate", "document", None) is None


@pytest.mark.parametrize("site", ["same-origin", "none", None])
def test_refusal_when_sec_fetch_site_is_own_or_absent_lets_it_through(
        site: str | None) -> None:
    assert refusal("POST", OWN, "application/json", None, site, "cors", "empty", None) is None
    assert refusal("POST", OWN, "application/octet-stream") is None  # tritonclient, curl


def test_unix_refusal_when_a_proxy_passes_a_browsers_request_applies_what_it_can_tell() -> None:
    assert "Sec-Fetch-Site: cross-site" in (
        unix_refusal("POST", None, "cross-site", "no-cors", "empty") or "")
    assert unix_refusal("GET", None, "cross-site", "navigate", "document") is None
    assert "Origin 'null'" in (unix_refusal("POST", "null", None, None, None) or "")
    assert unix_refusal("GET", "null", None, None, None) is None
    # A proxy's public name is not the socket's to know: its own page's origin passes.
    assert unix_refusal("POST", "https://edge.example", "same-origin", "cors", "empty") is None
    assert unix_refusal("POST", None, None, None, None) is None


@pytest.mark.parametrize("origin", ["http://127.0.0.1:\u00b2", "http://127.0.0.1:\u0663",
                                    "http://127.0.0.1:+80", "http://127.0.0.1:8_0"])
def test_own_origin_when_the_port_is_not_ascii_digits_is_not_the_listeners(origin: str) -> None:
    assert not own_origin(origin, 80)
