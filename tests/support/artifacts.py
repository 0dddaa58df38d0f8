"""Artifact servers on 127.0.0.1 for OTA tests: one serves files with HTTP Range support and can
cut a response after a number of bytes, as a flaky uplink does; one trickles a byte at a
time, as a server that holds a download open without ever failing it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest


class ArtifactServer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.cut_after: int | None = None  # the next response stops after this many bytes
        self.ranges: list[str | None] = []  # the Range header of each request
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def url(self, name: str) -> str:
        return f"{self.base}/{name}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = server.root / self.path.lstrip("/")
                if not path.is_file():
                    self.send_error(404)
                    return
                data = path.read_bytes()
                header = self.headers.get("Range")
                server.ranges.append(header)
                start = 0
                if header and header.startswith("bytes="):
                    start = int(header[6:].split("-")[0])
                    if start >= len(data):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if server.cut_after is not None:
                    body, server.cut_after = body[:server.cut_after], None
                    self.wfile.write(body)
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler


class TricklingServer:
    """An HTTP server on 127.0.0.1 that promises `size` bytes and sends one every 50 ms, as a
    server that holds a download open without ever failing it."""

    def __init__(self, size: int) -> None:
        self.stop = threading.Event()
        self.requests = 0
        self.sent = 0  # bytes written, all requests together
        trickle = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                trickle.requests += 1
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                try:
                    for _ in range(size):
                        if trickle.stop.wait(0.05):
                            return
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        trickle.sent += 1
                except OSError:  # the client gave up: what the test wants
                    return

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/model.onnx"

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def artifacts(tmp_path: Path) -> Iterator[ArtifactServer]:
    root = tmp_path / "artifacts"
    root.mkdir()
    server = ArtifactServer(root)
    try:
        yield server
    finally:
        server.close()
