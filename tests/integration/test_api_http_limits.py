"""What the daemon's HTTP layer bounds in a request besides its body (issue 41 #1, #3), driven
by raw HTTP on the daemon's socket as the second probe sent it: header fields and lines
(431, as nginx answers), a request target (414), and chunked bodies: accepted within the
same bounds and budget as any body, in chunks as small as a byte, up to Triton's count."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import numpy as np
import pytest
from support.daemon import Served, ServeFactory

from edged.api.http import framing
from tools.assets import models as test_models


def exchange(served: Served, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `request` whole on a fresh connection, then say so (a half-close, as `nc -N`
    does); the answer (the daemon closes it). Without the half-close a refused request's
    connection stays open while the daemon reads and drops what might still come (LINGER_S)."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(str(served.socket))
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(1 << 16):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    match = re.match(r"HTTP/1\.[01] (\d{3}) ", lines[0])
    assert match, answer[:200]
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return int(match.group(1)), headers, body


def get_ready(extra: bytes = b"", target: bytes = b"/v2/health/ready") -> bytes:
    return b"GET " + target + b" HTTP/1.1\r\nHost: edged\r\n" + extra + \
        b"Connection: close\r\n\r\n"


def test_api_when_a_request_has_200_header_fields_answers_431_and_keeps_serving(
        served: Served) -> None:
    fields = b"".join(b"X-Field-%d: v\r\n" % i for i in range(200))
    status, headers, body = exchange(served, get_ready(fields))
    assert status == 431, body
    assert headers["content-type"].startswith("application/json")
    assert "more than 100 header fields" in json.loads(body)["error"]
    ok = b"".join(b"X-Field-%d: v\r\n" % i for i in range(90))  # within the bound
    assert exchange(served, get_ready(ok))[0] == 200


def test_api_when_a_header_line_is_64_kb_answers_431(served: Served) -> None:
    status, _, body = exchange(served, get_ready(b"X-Long: " + b"a" * 60_000 + b"\r\n"))
    assert status == 431, body
    assert "exceeds 8192 bytes" in json.loads(body)["error"]
    assert exchange(served, get_ready(b"X-Long: " + b"a" * 8000 + b"\r\n"))[0] == 200


def test_api_when_a_request_target_is_longer_than_a_line_answers_414(served: Served) -> None:
    status, _, body = exchange(served, get_ready(target=b"/v2/health/ready?" + b"q" * 9000))
    assert status == 414, body


def test_api_when_head_bounds_are_configured_applies_them(make_served: ServeFactory) -> None:
    served = make_served(api="max_header_fields: 20, max_header_line_bytes: 2048")
    twenty_five = b"".join(b"X-F%d: v\r\n" % i for i in range(25))
    assert exchange(served, get_ready(twenty_five))[0] == 431
    assert exchange(served, get_ready(b"X-Long: " + b"a" * 3000 + b"\r\n"))[0] == 431
    assert exchange(served, get_ready(b"X-Long: " + b"a" * 1000 + b"\r\n"))[0] == 200


def chunked_infer(body: bytes, size: int, *, headers: bytes = b"") -> bytes:
    """A raw binary infer request (Triton's L0_http many-chunks test) with `body` sent in
    chunks of `size` bytes."""
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size])
                      for i in range(0, len(body), size))
    return (b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: edged\r\n"
            b"Inference-Header-Content-Length: 0\r\nContent-Type: application/octet-stream\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n" + headers + b"\r\n"
            + chunks + b"0\r\n\r\n")


@pytest.fixture
def identities(make_served: ServeFactory, repo_dir: Path) -> Served:
    test_models.write_repository(repo_dir, names=["identity_fp32"])
    return make_served(cache="preload: [tiny_cls, identity_fp32]")


@pytest.mark.parametrize("size", [1, 7, 65536])
def test_api_when_a_body_comes_chunked_answers_it_as_any_body(identities: Served,
                                                              size: int) -> None:
    """A byte a chunk was a 431 once 16 K chunks had come (their framing counted as head)."""
    values = np.arange(framing.MAX_CHUNKS // 4, dtype=np.float32)  # MAX_CHUNKS bytes
    status, headers, body = exchange(identities, chunked_infer(values.tobytes(), size))
    assert status == 200, body[:300]
    length = int(headers["inference-header-content-length"])
    out = json.loads(body[:length])["outputs"][0]
    assert out["shape"] == [1, values.size]
    np.testing.assert_array_equal(np.frombuffer(body[length:], np.float32), values)
    assert identities.daemon.api.bodies.held == 0


def test_api_when_a_chunked_body_has_more_chunks_than_triton_allows_answers_400(
        identities: Served) -> None:
    values = np.zeros(framing.MAX_CHUNKS // 4 + 1, np.float32)  # a chunk a byte: 4 too many
    status, _, body = exchange(identities, chunked_infer(values.tobytes(), 1))
    assert status == 400, body[:300]
    assert f"more than {framing.MAX_CHUNKS} chunks" in json.loads(body)["error"]
    assert identities.daemon.api.bodies.held == 0


def test_api_when_a_chunked_body_exceeds_max_request_mb_answers_413(
        make_served: ServeFactory, repo_dir: Path) -> None:
    test_models.write_repository(repo_dir, names=["identity_fp32"])
    served = make_served(api="max_request_mb: 1", cache="preload: [identity_fp32]")
    values = np.zeros((1 << 20) // 4 + 1024, np.float32)
    status, _, body = exchange(served, chunked_infer(values.tobytes(), 1 << 16))
    assert status == 413, body[:300]
    assert served.daemon.api.bodies.held == 0
