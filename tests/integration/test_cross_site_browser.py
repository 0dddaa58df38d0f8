"""Another site's page in a real browser, aimed at the daemon's loopback TCP listener: Debian's
headless Chromium opens a page served on another origin (a tiny HTTP server of the test's, as
`http://evil.example:PORT` through Chromium's resolver rules, and as `http://127.0.0.1:PORT`,
another port of the device: same-site) whose script does what the issue's probe did:
`fetch(url, {method: "POST", mode: "no-cors", body: <typeless Blob>})` to turn on verbose
logging, run an inference and unload a model. The daemon refuses each (403, as DevTools sees
it) and nothing changes. Its own page, opened as 127.0.0.1 or localhost, still POSTs to its
API, and a link from another site still opens it."""

from __future__ import annotations

import http.server
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support.browser import Browser, Page, running_browser
from support.daemon import Served
from support.polling import wait_until

OTHER_SITE = "evil.example"
ATTACK = """<!doctype html><title>another site</title>
<script>
// What any page on the web can do: no-cors POSTs need no permission, and a Blob without a
// type sends no Content-Type at all. The answers are opaque; the requests are not.
window.attack = async (target, infer) => {
  const post = (path, body) => fetch(target + path, {method: "POST", mode: "no-cors", body})
    .then(() => "sent", (e) => "failed: " + e);
  return [await post("/v2/logging", new Blob(['{"log_verbose_level": 1}'])),
          await post("/v2/models/tiny_cls/infer", new Blob([infer])),
          await post("/v2/repository/models/tiny_cls/unload")];
};
</script>"""
INFER = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3, 8, 8],
                                "data": [0.5] * 192}]})
POSTED = ("/v2/logging", "/v2/models/tiny_cls/infer", "/v2/repository/models/tiny_cls/unload")


class _Site(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = ATTACK.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def other_site() -> Iterator[int]:
    """The other site's server on a free loopback port (its port)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    thread = threading.Thread(target=server.serve_forever, name="other-site", daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def chromium() -> Iterator[Browser]:
    with running_browser([f"--host-resolver-rules=MAP {OTHER_SITE} 127.0.0.1"]) as browser:
        yield browser


pytestmark = pytest.mark.usefixtures("restore_log_level")


def statuses(page: Page, target: str) -> dict[str, int]:
    """The daemon's answers to the page by path, as DevTools saw them (opaque to the page)."""
    return {r["response"]["url"][len(target):]: r["response"]["status"]
            for r in list(page.responses) if r["response"]["url"].startswith(target)}


@pytest.mark.parametrize("site", [OTHER_SITE, "127.0.0.1"], ids=["cross-site", "same-site"])
def test_another_sites_page_when_it_posts_no_cors_at_the_daemon_changes_nothing(
        served: Served, chromium: Browser, other_site: int, site: str) -> None:
    target = f"http://{served.http}"
    page = chromium.page(f"http://{site}:{other_site}/")
    assert page.evaluate("location.origin") == f"http://{site}:{other_site}"
    sent = page.evaluate(f"attack({json.dumps(target)}, {json.dumps(INFER)})")
    assert sent == ["sent"] * 3  # the browser sent each one: the page cannot tell more
    got = wait_until(lambda: (s := statuses(page, target)) and len(s) == 3 and s,
                     timeout=30, what="the daemon's three answers, as DevTools saw them")
    assert got == dict.fromkeys(POSTED, 403), got
    with served.client() as client:
        assert client.model_ready("tiny_cls"), "the page unloaded the model"
        stats = json.loads(client.request("GET", "/v2/models/tiny_cls/stats")[2])
    assert stats["model_stats"][0]["inference_count"] == 0, "the page ran an inference"
    assert logging.getLogger().getEffectiveLevel() > logging.DEBUG, "it turned on verbose"

    # A link from that page to the status page still opens it (a navigation, in the tab).
    page.evaluate(f"location.href = {json.dumps(target + '/')}; true")
    wait_until(lambda: statuses(page, target).get("/") == 200, timeout=30,
               what="the status page, opened from the other site's link")


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost"])
def test_the_daemons_own_page_when_it_posts_to_its_api_is_answered(
        served: Served, chromium: Browser, name: str) -> None:
    port = served.http.rsplit(":", 1)[1]
    page = chromium.page(f"http://{name}:{port}/")
    status = page.evaluate("fetch('/v2/logging', {method: 'POST', headers: "
                           "{'Content-Type': 'application/json'}, body: '{\"log_info\": true}'})"
                           ".then(r => r.status)")
    assert status == 200
