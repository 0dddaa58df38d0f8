"""Replays in the HTTP layer (`_Connection.data_received`, `Request.replay`): a read that is the
whole of a request repeating, byte for byte but its tail, one a handler left a Replayer on is
offered to that Replayer while the connection has nothing else in hand; anything else, or a
Replayer that declines, is parsed and handled as ever, and answers keep their order."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.polling import wait_until
from test_http import closed, read_answer, uvloop_loop

from edged.api.http.connection import HttpServer
from edged.api.http.messages import Request, Response, json_response

TAIL = 4


@dataclass
class Replays:
    """A Replayer that answers with what it was handed (or declines, or answers large)."""

    tail: int = TAIL
    declining: bool = False
    large: bool = False
    later: bool = False  # answer with an awaitable
    handling: list[int] = field(default_factory=list)  # HttpServer.handling while it waits
    server: HttpServer | None = None
    seen: list[bytes] = field(default_factory=list)

    def __call__(self, data: bytes) -> Response | Awaitable[Response] | None:
        if self.declining:
            return None
        self.seen.append(data)
        if self.later:
            return self._later(data)
        if self.large:
            return Response(parts=[b'{"r": "', memoryview(b"x" * (4 << 20)), b'"}'])
        return json_response({"replayed": data[-self.tail:].decode()})

    async def _later(self, data: bytes) -> Response:
        await asyncio.sleep(0)
        assert self.server is not None
        self.handling.append(self.server.handling)
        return json_response({"later": data[-self.tail:].decode()})


@dataclass
class Server:
    path: str
    replays: Replays
    handled: list[bytes]
    http: HttpServer

    def holding(self) -> bool:
        """Whether a connection holds the first reads of what may be a repeat."""
        return any(c._held for c in list(self.http.connections))

    def unix(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(10)
        sock.connect(self.path)
        return sock


@pytest.fixture(params=["asyncio", "uvloop"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    replays = Replays()
    handled: list[bytes] = []

    async def handle(http_request: Request) -> Response:
        body = b""
        while chunk := await http_request.content.readany():
            body += chunk
        handled.append(body)
        if http_request.path == "/replayable":
            http_request.replay = replays
        return json_response({"handled": body.decode()})

    loop = asyncio.new_event_loop() if request.param == "asyncio" else uvloop_loop()
    http = HttpServer(handle, max_connections=8, header_timeout_s=2, keepalive_s=2,
                      body_timeout_s=2)
    path = str(tmp_path / "r.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(path)
    unix.listen()
    unix.setblocking(False)
    loop.run_until_complete(http.listen(unix))
    replays.server = http
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield Server(path, replays, handled, http)
    finally:
        asyncio.run_coroutine_threadsafe(http.stop(2), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        unix.close()


def post(body: str, path: str = "/replayable", extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
            f"{body}").encode()


def ask(sock: socket.socket, data: bytes) -> dict[str, str]:
    sock.sendall(data)
    status, _, body = read_answer(sock)
    assert status == 200
    answer: dict[str, str] = json.loads(body)
    return answer


def test_connection_when_a_read_repeats_a_replayable_request_its_replayer_answers(
        server: Server) -> None:
    with server.unix() as sock:
        assert ask(sock, post("head0001")) == {"handled": "head0001"}
        assert ask(sock, post("head0002")) == {"replayed": "0002"}  # other tail bytes
        assert ask(sock, post("head0003")) == {"replayed": "0003"}  # still served after
        assert ask(sock, post("Head0003")) == {"handled": "Head0003"}  # a byte before the tail
        assert ask(sock, post("head00030")) == {"handled": "head00030"}  # another length
    assert server.replays.seen == [post("head0002"), post("head0003")]
    with server.unix() as other:  # a replay is its connection's own
        assert ask(other, post("head0004")) == {"handled": "head0004"}


def test_connection_when_the_replayer_declines_parses_the_read_as_any_other(
        server: Server) -> None:
    server.replays.declining = True
    with server.unix() as sock:
        for body in ("head0001", "head0002"):
            assert ask(sock, post(body)) == {"handled": body}


def test_connection_when_repeats_come_pipelined_answers_them_in_order_by_parsing(
        server: Server) -> None:
    with server.unix() as sock:
        ask(sock, post("head0001"))
        sock.sendall(post("head0002") + post("head0003"))  # one read, two messages
        pending = bytearray()
        answers = [json.loads(read_answer(sock, pending)[2]) for _ in range(2)]
    assert answers == [{"handled": "head0002"}, {"handled": "head0003"}]
    assert server.replays.seen == []


def test_connection_when_the_request_closes_its_connection_leaves_nothing_to_replay(
        server: Server) -> None:
    with server.unix() as sock:
        sock.sendall(post("head0001", extra="Connection: close\r\n"))
        assert read_answer(sock)[0] == 200 and closed(sock)
    assert server.replays.seen == []


def test_connection_when_a_replayed_answer_is_taken_slowly_waits_then_serves_on(
        server: Server) -> None:
    server.replays.large = True  # more than the transport buffers: writing pauses
    with server.unix() as sock:
        ask(sock, post("head0001"))
        sock.sendall(post("head0002"))
        wait_until(lambda: server.replays.seen)  # answered, not yet all taken
        sock.sendall(post("later", path="/other"))  # read meanwhile: it waits its turn
        pending = bytearray()
        status, _, body = read_answer(sock, pending)
        assert status == 200 and len(body) > 4 << 20
        status, _, body = read_answer(sock, pending)
        assert status == 200 and json.loads(body) == {"handled": "later"}
        assert ask(sock, post("head0003"))["r"]  # replayed again once it was all taken


def test_connection_when_a_repeat_comes_in_pieces_holds_them_then_replays_it(
        server: Server) -> None:
    with server.unix() as sock:
        ask(sock, post("head0001"))
        data = post("head0002")
        sock.sendall(data[:20])  # part of the head: it may yet be a repeat
        wait_until(server.holding)
        sock.sendall(data[20:-2])
        sock.sendall(data[-2:])
        assert json.loads(read_answer(sock)[2]) == {"replayed": "0002"}
    assert server.handled == [b"head0001"]


def test_connection_when_the_rest_of_a_repeat_is_late_parses_what_came_as_any_other(
        server: Server) -> None:
    with server.unix() as sock:
        ask(sock, post("head0001"))
        data = post("head0002")
        sock.sendall(data[:-4])  # the head, the tail still to come
        wait_until(server.holding)
        wait_until(lambda: not server.holding())  # HOLD_S went by: parsed, its body awaited
        sock.sendall(data[-4:])
        assert json.loads(read_answer(sock)[2]) == {"handled": "head0002"}
    assert server.replays.seen == []


def test_connection_when_a_client_waits_for_100_continue_never_replays_it(
        server: Server) -> None:
    expect = "Expect: 100-continue\r\n"
    with server.unix() as sock:
        for body in ("head0001", "head0002"):
            assert ask(sock, post(body, extra=expect)) == {"handled": body}
    assert server.replays.seen == []


def test_connection_when_the_replayer_answers_later_keeps_the_order_and_counts_it(
        server: Server) -> None:
    server.replays.later = True
    with server.unix() as sock:
        ask(sock, post("head0001"))
        sock.sendall(post("head0002"))
        wait_until(lambda: server.replays.seen)  # replayed, its answer not given yet
        sock.sendall(post("after", path="/other"))
        pending = bytearray()
        answers = [json.loads(read_answer(sock, pending)[2]) for _ in range(2)]
    assert answers == [{"later": "0002"}, {"handled": "after"}]
    assert server.replays.handling == [1]  # a handler in progress while it waited


def test_connection_when_a_repeat_comes_in_many_small_pieces_replays_it(
        server: Server) -> None:
    with server.unix() as sock:
        ask(sock, post("head0001"))
        data = post("head0002")
        for i in range(0, len(data), 7):  # each held until the whole has come
            sock.sendall(data[i:i + 7])
        assert json.loads(read_answer(sock)[2]) == {"replayed": "0002"}
        assert ask(sock, post("head0003")) == {"replayed": "0003"}
