"""A hostile look at the socket API's bounds (the body budget, shared memory leases, decoding
off the loop): what a buggy client or another user on the device can make edged do."""

from __future__ import annotations

import json
import os
import socket

import numpy as np
import pytest
from support.backends import GateBackend
from support.daemon import LOOP_THREAD, ServeFactory, decode_threads
from support.polling import wait_until

from edged.api.protocol import HEADER_LENGTH, ShmRef, ShmTensor, encode_request
from edged.ops.client import SharedRegion

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


def shm_request(region: str, extra_bytes: int) -> tuple[bytes, int | None]:
    """tiny_cls's input from a region, and one more input naming `extra_bytes` of it."""
    parts, json_length = encode_request(
        {"x": ShmTensor(ShmRef(region, 0, X.nbytes), "FP32", X.shape),
         "pad": ShmTensor(ShmRef(region, 0, extra_bytes), "UINT8", (extra_bytes,))}, [])
    return b"".join(bytes(p) for p in parts), json_length


def test_shm_when_inputs_are_copied_the_copies_are_charged_to_the_body_budget(
        make_served: ServeFactory) -> None:
    """A few hundred bytes of JSON that name a large region: copying it in is request memory
    like a body, within api.max_bodies_mb; else a client of another uid fills the daemon's
    memory with one small request naming its region many times."""
    served = make_served(api="max_bodies_mb: 1, shm_copy_inputs: always")
    size = 4 << 20
    with SharedRegion(f"edged-rv-{os.getpid()}", size) as region, served.client() as client:
        client.register_shm("big", region.key, size)
        body, _ = shm_request("big", size)
        status, _, raw = client.request("POST", INFER, body)
        answer = json.loads(raw)
        assert status == 413 and answer["code"] == "too_large", answer
        assert served.daemon.api.bodies.held == 0
        client.unregister_shm("big")
        assert client.shm_status() == []


def test_shm_when_inputs_are_copied_a_large_copy_is_made_off_the_loop(
        make_served: ServeFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    served = make_served(api="shm_copy_inputs: always")
    threads = decode_threads(monkeypatch)
    size = 4 << 20
    with SharedRegion(f"edged-rv-{os.getpid()}", size) as region, served.client() as client:
        client.register_shm("big", region.key, size)
        body, _ = shm_request("big", size)
        status, _, raw = client.request("POST", INFER, body)
        assert status == 400, raw  # no input "pad": refused after the copy
    assert threads and threads[0] != LOOP_THREAD


def test_api_when_binary_bytes_hold_many_elements_decodes_them_off_the_loop(
        served: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A short JSON head and a binary BYTES tensor of a million elements: unpacking is a
    Python loop per element, seconds of the event loop if it ran there."""
    threads = decode_threads(monkeypatch)
    count = 1 << 20
    head = json.dumps({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [count],
                                   "parameters": {"binary_data_size": 4 * count}}]}).encode()
    body = head + b"\0" * (4 * count)
    with served.client() as client:  # type: ignore[attr-defined]
        status, _, raw = client.request("POST", INFER, body, {HEADER_LENGTH: str(len(head))})
        assert status == 400, raw  # tiny_cls has no input s
    assert threads and threads[0] != LOOP_THREAD


@pytest.mark.parametrize("binary", [True, False])
def test_api_when_a_client_hangs_up_mid_inference_logs_no_500_and_gives_all_back(
        gate: GateBackend, make_served: ServeFactory, caplog: pytest.LogCaptureFixture,
        binary: bool) -> None:
    """A client gone before its answer is written: nothing to answer, nothing to log as an
    internal error, and its body's charge given back."""
    served = make_served()
    budget = served.daemon.api.bodies
    parts, json_length = encode_request({"x": X}, [], binary=binary)
    body = b"".join(bytes(p) for p in parts)
    headers = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    if json_length is not None:
        headers += f"{HEADER_LENGTH}: {json_length}\r\n"
    gate.reset()
    gate.gate.clear()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(served.socket))
        sock.sendall(headers.encode() + b"\r\n" + body)
        gate.wait_calls(1)
    gate.gate.set()
    wait_until(lambda: budget.held == 0, what="its charge given back")
    with served.client() as client:
        assert client.ready()
    assert served.daemon.metrics.api_errors.labels("internal")._value.get() == 0
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")], \
        [r.getMessage() for r in caplog.records]


def test_api_when_binary_bytes_hold_many_tiny_elements_charges_what_unpacking_takes(
        make_served: ServeFactory) -> None:
    """4 bytes on the wire per empty element, ~50 once each is a Python object in the batch:
    binary BYTES are charged per element, not only per byte (2-byte elements held 7.2x their
    body when charged 1x)."""
    served = make_served(api="max_bodies_mb: 16")
    count = 1 << 20  # 4 MiB on the wire
    head = json.dumps({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [count],
                                   "parameters": {"binary_data_size": 4 * count}}]}).encode()
    with served.client() as client:
        status, _, raw = client.request("POST", INFER, head + b"\0" * (4 * count),
                                        {HEADER_LENGTH: str(len(head))})
        answer = json.loads(raw)
        assert status == 413 and answer["code"] == "too_large", answer
        assert client.infer("tiny_cls", {"x": X}).outputs["prob"].shape == (1, 4)
    wait_until(lambda: served.daemon.api.bodies.held == 0, what="every charge given back")


def test_api_when_a_handler_ends_while_its_batch_runs_its_charge_and_regions_wait_for_it(
        gate: GateBackend, make_served: ServeFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler cancelled while its request is in the model (a shutdown whose drain timed
    out) gave its body's charge and its shm regions back at once, though the batch still
    viewed both (issue 41 #6): they now go when the batch does."""
    import asyncio

    from edged.inference import batcher as batcher_module

    # Neither on the event loop (which the gate would hold) nor batched there: a worker's.
    monkeypatch.setattr(batcher_module, "INLINE_MAX_NS", 0)
    monkeypatch.setattr(batcher_module, "TOGETHER_MAX_NS", 0)
    served = make_served()
    budget, daemon = served.daemon.api.bodies, served.daemon
    key = f"edged-wait-{os.getpid()}"
    with SharedRegion(key, 4096) as region, served.client() as client:
        client.register_shm("frames", key, 4096)
        parts, json_length = encode_request({"x": region.tensor("frames", X)}, [], binary=True)
        body = b"".join(bytes(p) for p in parts)
        request = (f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                   + (f"{HEADER_LENGTH}: {json_length}\r\n" if json_length else "")
                   + "\r\n").encode() + body
        gate.reset()
        gate.gate.clear()
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(served.socket))
            sock.sendall(request)
            gate.wait_calls(1)  # in the model, on a worker
            charged = budget.held
            assert charged > 0

            def cancel_handlers() -> None:
                for task in asyncio.all_tasks():
                    if task.get_coro().__qualname__.endswith("_serve"):  # type: ignore[union-attr]
                        task.cancel()

            assert daemon._loop is not None
            daemon._loop.call_soon_threadsafe(cancel_handlers)
            wait_until(lambda: daemon.api.connections.handling == 0, what="the handler gone")
            client.unregister_shm("frames")
            assert budget.held == charged  # still the running batch's
            assert [r["name"] for r in client.shm_status()] == ["frames"]
            gate.gate.set()
            wait_until(lambda: budget.held == 0, what="the charge back once it ran")
            wait_until(lambda: client.shm_status() == [], what="the region gone once it ran")
