"""The endpoint asker over real HTTP on 127.0.0.1: a small OpenAI-shaped server that records
what it was sent and answers as told (a summary, an error, nothing for a while), and a port
nobody listens on."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.endpoint import ANSWER, Endpoint
from support.ports import free_port

from edged.core.errors import EndpointFailed, Timeout
from edged.describer.askers import ANSWER_SCHEMA, EndpointAsker
from edged.describer.config import EndpointConfig
from edged.describer.prompt import Subject, messages


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    served = Endpoint()
    yield served
    served.close()


SUBJECT = Subject("1.000-door-1", "door", {"label": "car", "start_time": 1.0,
                                           "end_time": 2.0}, b"\xff\xd8jpeg")


def asker(url: str, **config: Any) -> EndpointAsker:
    return EndpointAsker(EndpointConfig(url=url, model="vlm", **config), max_tokens=300,
                         temperature=0.1)


def test_endpoint_asker_when_vision_posts_the_snapshot_and_schema_with_the_key(
        endpoint: Endpoint, tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-test\n")
    ask = asker(endpoint.url, vision=True, api_key_file=key)
    text = ask.ask(messages(SUBJECT, vision=True), time.monotonic() + 10)
    assert text == ANSWER
    [(path, headers, body)] = endpoint.requests
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer sk-test"
    assert body["model"] == "vlm" and body["max_tokens"] == 300 and not body["stream"]
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "review_summary", "schema": ANSWER_SCHEMA}}
    image = body["messages"][1]["content"][1]
    assert image["image_url"]["url"].startswith("data:image/jpeg;base64,")


def test_endpoint_asker_when_json_object_asked_sends_that_format(endpoint: Endpoint) -> None:
    asker(endpoint.url, response_format="json_object").ask(
        messages(SUBJECT, vision=False), time.monotonic() + 10)
    assert endpoint.requests[0][2]["response_format"] == {"type": "json_object"}
    assert "Authorization" not in endpoint.requests[0][1]


def test_endpoint_asker_when_the_endpoint_answers_an_error_raises_endpoint_failed(
        endpoint: Endpoint) -> None:
    endpoint.status = 500
    endpoint.body = b'{"error": {"message": "model not loaded"}}'
    with pytest.raises(EndpointFailed, match="HTTP 500: model not loaded"):
        asker(endpoint.url).ask(messages(SUBJECT, vision=False), time.monotonic() + 10)


@pytest.mark.parametrize("body", [b"<html>", b'{"choices": []}', b'{"choices": [{"message": '
                                  b'{"content": null}}]}'])
def test_endpoint_asker_when_the_answer_is_malformed_raises_endpoint_failed(
        endpoint: Endpoint, body: bytes) -> None:
    endpoint.body = body
    with pytest.raises(EndpointFailed):
        asker(endpoint.url).ask(messages(SUBJECT, vision=False), time.monotonic() + 10)


def test_endpoint_asker_when_nobody_listens_raises_endpoint_failed() -> None:
    with pytest.raises(EndpointFailed, match="Connection"):
        asker(f"http://127.0.0.1:{free_port()}/v1").ask(messages(SUBJECT, vision=False),
                                                        time.monotonic() + 10)


def test_endpoint_asker_when_slower_than_the_deadline_raises_timeout(endpoint: Endpoint
                                                                     ) -> None:
    endpoint.delay_s = 30.0
    with pytest.raises(Timeout):
        asker(endpoint.url).ask(messages(SUBJECT, vision=False), time.monotonic() + 0.3)


def test_endpoint_asker_when_a_closing_answer_trickles_past_the_deadline_raises_timeout(
        ) -> None:
    """`Connection: close`: http.client lets go of its socket, the reads go on: each is still
    held to the deadline (it was not, and a trickle kept the describer past its timeout)."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def trickle() -> None:
        peer, _ = server.accept()
        with peer:
            peer.recv(65536)
            peer.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Connection: close\r\n\r\n")
            for _ in range(40):  # a space every 0.1 s, then the answer: 4 s in all
                time.sleep(0.1)
                try:
                    peer.sendall(b" ")
                except OSError:
                    return  # the asker gave up
            peer.sendall(b'{"choices": [{"message": {"content": "late"}}]}')

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        with pytest.raises(Timeout):
            asker(f"http://127.0.0.1:{port}/v1").ask(messages(SUBJECT, vision=False),
                                                     time.monotonic() + 0.5)
    finally:
        thread.join(timeout=10)
        server.close()
