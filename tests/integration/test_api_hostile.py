"""A hostile look at the socket API's bounds (the body budget, shared memory leases, decoding
off the loop): what a buggy client or another user on the device can make edged do."""

from __future__ import annotations

import socket

import numpy as np
import pytest
from support.daemon import ServeFactory
from support.polling import wait_until

INFER = "/v2/models/tiny_cls/infer"
X = np.zeros((1, 3, 8, 8), np.float32)


def test_api_when_a_body_stalls_after_its_headers_gives_its_charge_back(
        make_served: ServeFactory) -> None:
    """Content-Length is charged before a byte of the body comes: a client that then sends
    nothing must not hold that share of the budget for good (two such connections would
    leave every other client 503 for as long as they stay open)."""
    served = make_served(api="max_bodies_mb: 1, body_timeout_s: 0.5")
    budget = served.daemon.api.bodies
    stalled = socket.socket(socket.AF_UNIX)
    try:
        stalled.connect(str(served.socket))
        stalled.sendall(b"POST " + INFER.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{")
        wait_until(lambda: budget.held >= 1_000_000, what="the stalled body charged")
        wait_until(lambda: budget.held == 0, timeout=10, what="the stalled body's charge back")
        stalled.settimeout(10)
        answer = stalled.recv(65536)
        assert b" 408 " in answer.split(b"\r\n")[0], answer[:200]
        assert b'"error"' in answer
    finally:
        stalled.close()
    with served.client() as client:
        assert client.infer("tiny_cls", {"x": X}).outputs["prob"].shape == (1, 4)


def test_api_when_a_client_hangs_up_mid_body_answers_no_500(
        make_served: ServeFactory, caplog: pytest.LogCaptureFixture) -> None:
    """A client that disconnects halfway through its body is not an internal error: no 500
    logged with a traceback, and its charge is given back."""
    served = make_served()
    budget = served.daemon.api.bodies
    api_errors = served.daemon.metrics.api_errors
    for _ in range(3):
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(served.socket))
            sock.sendall(b"POST " + INFER.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: 100000\r\n\r\n" + b"{" * 5000)
            wait_until(lambda: budget.held > 0, what="its body charged")
    wait_until(lambda: budget.held == 0, what="every charge given back")
    assert api_errors.labels("internal")._value.get() == 0
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")], \
        [r.getMessage() for r in caplog.records]
