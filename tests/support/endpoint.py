"""A small OpenAI-shaped HTTP endpoint on 127.0.0.1 for the describer's tests: it records what
it was sent and answers as told (a review summary, an error status, a body, or nothing for a
while: a slow model). Real HTTP (the standard library's server), a fake model."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANSWER = '{"title": "t", "scene": "s", "shortSummary": "s", "confidence": 1, ' \
         '"potential_threat_level": 0}'


class Endpoint:
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.status = 200
        self.delay_s = 0.0
        self.body: bytes | None = None
        self.released = threading.Event()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                endpoint.requests.append((self.path, dict(self.headers),
                                          json.loads(self.rfile.read(length))))
                if endpoint.delay_s:
                    endpoint.released.wait(endpoint.delay_s)  # a slow model
                body = endpoint.body if endpoint.body is not None else json.dumps(
                    {"choices": [{"index": 0, "message": {"role": "assistant",
                                                          "content": ANSWER}}]}).encode()
                try:
                    self.send_response(endpoint.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the asker gave up and closed
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
