"""A page of another site driving the browser at the daemon's loopback TCP listener: the daemon
served in-process, asked as a browser asks (an Origin, Sec-Fetch-* headers, no Content-Type:
a `fetch(url, {method: "POST", mode: "no-cors"})` with a typeless Blob) and as API clients
ask (none of those). What another site sends is refused with 403 `forbidden` and changes
nothing (the model stays loaded, the log level stays, no inference runs); what the daemon's
own page and API clients send is answered. Debian's headless Chromium then does it for real,
from pages served on other origins (tests/support/browser.py)."""

from __future__ import annotations

import http.client
import json
import logging
from typing import Any

import numpy as np
import pytest
from support.daemon import Served

from edged.api.plans import PlanTable
from edged.api.protocol import HEADER_LENGTH, RequestedOutput, encode_request
from edged.inference import batcher

UNLOAD = "/v2/repository/models/tiny_cls/unload"
INFER = "/v2/models/tiny_cls/infer"
LOGGING = "/v2/logging"
VERBOSE = json.dumps({"log_verbose_level": 1}).encode()
INFER_JSON = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3, 8, 8],
                                     "data": [0.5] * 192}]}).encode()
EVIL = "https://evil.example"
NO_CORS = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors",
           "Sec-Fetch-Dest": "empty"}


pytestmark = pytest.mark.usefixtures("restore_log_level")


def ask(address: str, method: str, path: str, headers: dict[str, str] | None = None,
        body: bytes | None = None) -> tuple[int, dict[str, Any]]:
    """One request on a fresh connection, with only the headers given (http.client adds Host,
    Accept-Encoding and Content-Length, and no Content-Type)."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        answer = conn.getresponse()
        raw = answer.read()
        kind = answer.getheader("Content-Type", "")
        return answer.status, json.loads(raw) if kind.startswith("application/json") else {}
    finally:
        conn.close()


def inferences(served: Served) -> int:
    with served.client() as client:
        status, _, raw = client.request("GET", "/v2/models/tiny_cls/stats")
    assert status == 200, raw
    return int(json.loads(raw)["model_stats"][0]["inference_count"])


def untouched(served: Served, count: int) -> None:
    """Nothing another site sent did anything: tiny_cls is loaded, the log level is as it
    was (not verbose), and no inference ran."""
    with served.client() as client:
        assert client.model_ready("tiny_cls"), "another site's POST unloaded the model"
    assert logging.getLogger().getEffectiveLevel() > logging.DEBUG, "it turned on verbose"
    assert inferences(served) == count, "another site's POST ran an inference"


@pytest.mark.parametrize(("path", "body"), [(UNLOAD, None), (LOGGING, VERBOSE),
                                            (INFER, INFER_JSON)])
@pytest.mark.parametrize("marks", [
    {"Origin": EVIL, **NO_CORS},  # what Chromium sends for the fetch
    {"Origin": EVIL},  # a browser that sends no Sec-Fetch-*
    {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors"},  # no Origin (a proxy ate it)
    {"Origin": "null"},  # a sandboxed frame, a file:// page
    {"Origin": "http://127.0.0.1:1"},  # another port of the device is another site
], ids=["chromium-no-cors", "origin-only", "same-site-only", "origin-null", "other-port"])
def test_tcp_listener_when_another_site_posts_with_no_content_type_refuses_it(
        served: Served, path: str, body: bytes | None, marks: dict[str, str]) -> None:
    count = inferences(served)
    status, answer = ask(served.http, "POST", path, marks, body)
    assert (status, answer.get("code")) == (403, "forbidden"), answer
    untouched(served, count)


def test_tcp_listener_when_its_own_page_or_an_api_client_posts_answers_it(
        served: Served) -> None:
    port = served.http.rsplit(":", 1)[1]
    own = {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"}
    for headers in ({},  # tritonclient, perf_analyzer, curl: no Origin, no Content-Type
                    {"Origin": f"http://127.0.0.1:{port}", **own},
                    {"Origin": f"http://localhost:{port}", "Host": f"localhost:{port}", **own},
                    {"Sec-Fetch-Site": "none"}):  # typed in the address bar
        status, answer = ask(served.http, "POST", INFER, headers, INFER_JSON)
        assert status == 200 and answer["outputs"][0]["name"] == "prob", (headers, answer)
    status, answer = ask(served.http, "POST", LOGGING, {"Origin": f"http://[::1]:{port}"},
                         json.dumps({"log_info": True}).encode())
    assert status == 200 and answer["log_info"] is True


def test_tcp_listener_when_another_site_asks_for_a_picture_refuses_but_a_link_opens(
        served: Served) -> None:
    """A GET from another site's page is refused too (an <img> of live.mjpeg or latest.jpg
    costs the daemon drawings; nothing on the listener is for other sites), but a link
    followed in a tab opens (its answer goes to the tab, never to the page that linked)."""
    image = {**NO_CORS, "Sec-Fetch-Dest": "image"}
    assert ask(served.http, "GET", "/v2/health/ready", image)[0] == 403
    assert ask(served.http, "GET", "/metrics", {"Origin": EVIL})[0] == 403
    link = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate",
            "Sec-Fetch-Dest": "document"}
    assert ask(served.http, "GET", "/v2/health/ready", link)[0] == 200
    assert ask(served.http, "POST", UNLOAD, link)[0] == 403  # a form's POST navigation


def test_unix_socket_when_a_proxy_passes_another_sites_post_refuses_it(served: Served) -> None:
    count = inferences(served)
    with served.client() as client:
        for marks in ({"Origin": EVIL, **NO_CORS}, {"Origin": "null"}):
            status, _, raw = client.request("POST", UNLOAD, b"", marks)
            assert (status, json.loads(raw)["code"]) == (403, "forbidden"), raw
        # The proxied page's own request: its origin is the proxy's, not the socket's to know.
        status, _, raw = client.request("POST", INFER, INFER_JSON, {
            "Origin": "https://edge.example", "Sec-Fetch-Site": "same-origin"})
        assert status == 200, raw
    untouched(served, count + 1)


def test_replays_when_a_repeat_comes_from_another_site_take_the_full_path_and_refuse_it(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection answers a repeat of a request without parsing it again (edged.api.replays)
    only when its head is the same bytes: an Origin in it was checked the first time, and a
    repeat with another is parsed, checked and refused."""
    monkeypatch.setattr(batcher, "TOGETHER_MAX_NS", 1 << 60)  # replays run only cheap rows
    monkeypatch.setattr(batcher, "INLINE_MAX_NS", 1 << 60)
    plans: PlanTable = served.daemon.api.kserve.plans
    port = served.http.rsplit(":", 1)[1]
    parts, json_length = encode_request({"x": np.zeros((1, 3, 8, 8), np.float32)},
                                        [RequestedOutput("prob", binary=True)])
    body = b"".join(parts)
    host = served.http.rsplit(":", 1)[0]
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    count = inferences(served)
    try:
        statuses = []
        for origin in (f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}",
                       f"http://evil.test:{port}"):  # the same length: other bytes
            conn.request("POST", INFER, body=body, headers={
                "Origin": origin, "Content-Type": "application/octet-stream",
                HEADER_LENGTH: str(json_length)})
            answer = conn.getresponse()
            answer.read()
            statuses.append(answer.status)
    finally:
        conn.close()
    assert statuses == [200, 200, 403]
    assert plans.replays() == 1  # the second was replayed, the third was not
    assert inferences(served) == count + 2
