"""The loopback TCP listener's guard against web pages: loopback Host names pass in every
spelling, anything else is refused, and so are the Content-Types a browser sends cross-site
without asking."""

from __future__ import annotations

import pytest

from edged.api.http.browsers import refusal


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
