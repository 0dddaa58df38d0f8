"""edged's HTTP/1.1 layer (`edged/api/http/connection.py`) on its own, over real sockets: what a
client of any make relies on (keep-alive, pipelining, HEAD, 100-continue, HTTP/1.0) and the bounds a
hostile one meets (head size, body buffering, answers before the body, broken chunks, idle
connections). The API's own cases run through it in tests/integration/test_api_*.py."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.polling import wait_until

from edged.api.http import connection as http
from edged.api.http import messages
from edged.api.http.connection import HttpServer
from edged.api.http.messages import HttpError, Request, Response, json_response
from edged.api.http.routing import Router


@dataclass
class Running:
    server: HttpServer
    loop: asyncio.AbstractEventLoop
    path: str
    port: int
    gate: threading.Event = field(default_factory=threading.Event)
    largest_buffer: list[int] = field(default_factory=lambda: [0])
    longest_queue: list[int] = field(default_factory=lambda: [0])

    def unix(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(10)
        sock.connect(self.path)
        return sock

    def tcp(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        return sock


def make_router(running: list[Running]) -> Router:
    router = Router()

    async def echo(request: Request) -> Response:
        body = b""
        try:
            while chunk := await request.content.readany():
                body += chunk
        except messages.BrokenBody as exc:
            return json_response({"error": str(exc)}, status=400)
        return json_response({"path": request.path, "method": request.method,
                              "match": request.match_info, "body": body.decode()})

    async def ignore_body(request: Request) -> Response:
        return json_response({"refused": True}, status=413)

    async def slow_reader(request: Request) -> Response:
        await asyncio.to_thread(running[0].gate.wait, 10)
        size = 0
        while chunk := await request.content.readany():
            running[0].largest_buffer[0] = max(running[0].largest_buffer[0],
                                               request.content.buffered + len(chunk))
            size += len(chunk)
        return json_response({"size": size})

    async def wait_gate(request: Request) -> Response:
        await asyncio.to_thread(running[0].gate.wait, 10)
        return json_response({"waited": True})

    async def large(request: Request) -> Response:
        parts: list[bytes | memoryview] = [b"{", memoryview(b"x" * (3 << 20)), b"}"]
        return Response(parts=parts, headers={"X-Parts": "3"})

    async def queued(request: Request) -> Response:
        depth = max((len(c.queue) for c in running[0].server.connections), default=0)
        running[0].longest_queue[0] = max(running[0].longest_queue[0], depth)
        return json_response({})

    async def handling(request: Request) -> Response:
        return json_response({"handling": running[0].server.handling})

    router.add("GET", "/handling", handling)
    router.add("GET", "/q", queued)
    router.add("GET", "/large", large)
    router.add("POST", "/echo/{name}", echo)
    router.add("GET", "/echo/{name}", echo)
    router.add("POST", "/ignore", ignore_body)
    router.add("POST", "/slow", slow_reader)
    router.add("GET", "/gate", wait_gate)
    return router


def uvloop_loop() -> asyncio.AbstractEventLoop:
    uvloop = pytest.importorskip("uvloop")
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


# The daemon runs on uvloop where it is installed, on asyncio's own loop where it is not.
@pytest.fixture(params=["asyncio", "uvloop"])
def running(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Running]:
    holder: list[Running] = []
    router = make_router(holder)

    async def handle(request: Request) -> Response:
        try:
            return await router.resolve(request)(request)
        except HttpError as exc:
            response = messages.error_response(exc.status, str(exc))
            if exc.allow:
                response.headers = {"Allow": exc.allow}
            return response

    loop = asyncio.new_event_loop() if request.param == "asyncio" else uvloop_loop()
    server = HttpServer(handle, max_connections=16, header_timeout_s=1, keepalive_s=0.5,
                        body_timeout_s=1, linger_s=0.5)
    path = str(tmp_path / "h.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(path)
    unix.listen()
    tcp = socket.create_server(("127.0.0.1", 0))
    for sock in (unix, tcp):
        sock.setblocking(False)
        loop.run_until_complete(server.listen(sock))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    holder.append(Running(server, loop, path, tcp.getsockname()[1]))
    try:
        yield holder[0]
    finally:
        holder[0].gate.set()
        asyncio.run_coroutine_threadsafe(server.stop(2), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        unix.close()
        tcp.close()


def read_answer(sock: socket.socket, pending: bytearray | None = None, *, no_body: bool = False
                ) -> tuple[int, dict[str, str], bytes]:
    """One answer off the socket: status, headers (names lowercased), body (none to a
    HEAD request, whatever its Content-Length says)."""
    buf = pending if pending is not None else bytearray()
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {bytes(buf)!r}"
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = 0 if no_body else int(headers.get("content-length", "0"))
    body = bytearray(rest)
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    buf[:] = body[length:]
    return status, headers, bytes(body[:length])


def closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_keep_alive_serves_requests_in_turn_and_http10_closes(running: Running) -> None:
    with running.unix() as sock:
        for name in ("a", "b%20c"):
            sock.sendall(f"GET /echo/{name} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            status, headers, body = read_answer(sock)
            assert status == 200 and "connection" not in headers
            assert headers["content-type"].startswith("application/json")
        assert json.loads(body)["match"] == {"name": "b c"}  # percent-decoded
    with running.unix() as sock:
        sock.sendall(b"GET /echo/a HTTP/1.0\r\n\r\n")
        status, headers, _ = read_answer(sock)
        assert status == 200 and headers["connection"] == "close" and closed(sock)


def test_pipelined_requests_are_answered_in_order(running: Running) -> None:
    names = [f"n{i}" for i in range(12)]  # more than MAX_QUEUED: reading pauses, then resumes
    requests = b"".join(f"POST /echo/{n} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(n)}\r\n\r\n"
                        f"{n}".encode() for n in names)
    with running.unix() as sock:
        sock.sendall(requests)
        pending = bytearray()
        answers = [json.loads(read_answer(sock, pending)[2]) for _ in names]
    assert [a["match"]["name"] for a in answers] == names
    assert [a["body"] for a in answers] == names


def test_head_unknown_paths_and_wrong_methods_get_their_answers(running: Running) -> None:
    with running.unix() as sock:
        sock.sendall(b"HEAD /echo/a HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = read_answer(sock, no_body=True)
        assert status == 200 and int(headers["content-length"]) > 0
        sock.sendall(b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n")  # no HEAD body was sent
        status, _, body = read_answer(sock)
        assert status == 404 and json.loads(body)["code"] == "http"
        sock.sendall(b"DELETE /echo/a HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body = read_answer(sock)
        assert status == 405 and headers["allow"] == "GET, POST"


def test_a_head_past_its_limit_is_refused_with_431_and_closed(running: Running) -> None:
    with running.unix() as sock:
        sock.sendall(b"GET /echo/a HTTP/1.1\r\nHost: x\r\n")
        filler = b"X-Filler: " + b"y" * 8000 + b"\r\n"
        try:
            for _ in range(http.MAX_HEAD_BYTES // len(filler) + 2):
                sock.sendall(filler)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed while still sending: the answer is still there to read
        status, headers, body = read_answer(sock)
        assert status == 431 and headers["connection"] == "close"
        assert "exceed" in json.loads(body)["error"] and closed(sock)


def test_a_malformed_request_gets_a_json_400_and_the_connection_closes(
        running: Running) -> None:
    with running.unix() as sock:
        sock.sendall(b"GET /echo/a HTTP/1.1\r\nHost: x\r\n\r\nGET /echo/b HTTP/1.1\r\nBad\x01: "
                     b"y\r\n\r\n")
        pending = bytearray()
        assert read_answer(sock, pending)[0] == 200  # the one before it is answered first
        status, _, body = read_answer(sock, pending)
        assert status == 400 and json.loads(body)["code"] == "http" and closed(sock)


def test_a_broken_chunk_mid_body_fails_the_read_and_the_handler_answers(
        running: Running) -> None:
    with running.unix() as sock:
        sock.sendall(b"POST /echo/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"3\r\nabc\r\n")
        sock.sendall(b"zz\r\n")  # not a chunk size
        status, headers, body = read_answer(sock)
        assert status == 400 and headers["connection"] == "close" and closed(sock)
        assert "chunk" in json.loads(body)["error"].lower()


def test_chunked_bodies_are_read_whole(running: Running) -> None:
    with running.unix() as sock:
        sock.sendall(b"POST /echo/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
        status, _, body = read_answer(sock)
        assert status == 200 and json.loads(body)["body"] == "abcde"


def test_expect_100_continue_gets_the_interim_answer_before_the_body(running: Running) -> None:
    with running.unix() as sock:
        sock.sendall(b"POST /echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                     b"Expect: 100-continue\r\n\r\n")
        interim = sock.recv(1024)
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(b"hello")
        status, _, body = read_answer(sock)
        assert status == 200 and json.loads(body)["body"] == "hello"


def test_an_answer_before_the_body_has_come_still_reaches_a_tcp_client(
        running: Running) -> None:
    """The rest of the body is read and dropped before the close: closing with unread bytes
    would reset the connection and could discard the answer before the client reads it."""
    size = 4 << 20
    with running.tcp() as sock:
        sock.sendall(f"POST /ignore HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n"
                     .encode())
        sock.sendall(b"\0" * size)
        status, headers, body = read_answer(sock)
        assert status == 413 and headers["connection"] == "close" and closed(sock)
        assert json.loads(body) == {"refused": True}


def test_a_slow_handler_does_not_make_a_body_buffer_grow(running: Running) -> None:
    size = 16 << 20
    with running.unix() as sock:
        sock.sendall(f"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n"
                     .encode())
        sent = 0
        sock.settimeout(0.5)
        try:
            while sent < size:  # the server stops reading: the kernel's buffers fill
                sent += sock.send(b"\0" * min(1 << 20, size - sent))
        except TimeoutError:
            pass
        assert sent < size
        running.gate.set()
        sock.settimeout(10)
        sock.sendall(b"\0" * (size - sent))
        status, _, body = read_answer(sock)
    assert status == 200 and json.loads(body)["size"] == size
    assert running.largest_buffer[0] <= messages.BODY_BUFFER_BYTES + (1 << 20)


def test_an_idle_kept_alive_connection_is_closed_after_the_keepalive(running: Running) -> None:
    with running.unix() as sock:
        sock.sendall(b"GET /echo/a HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_answer(sock)[0] == 200
        assert closed(sock)  # keepalive_s 0.5, well under the 10 s socket timeout


def test_each_request_moves_the_keepalive_bound_on(running: Running) -> None:
    """The idle bound re-armed by a later request is the one in force: the connection's timer,
    set for the first bound, sleeps on to the later one instead of closing (keepalive_s 0.5:
    the third request comes 0.6 s after the first answer, 0.3 s after the second)."""
    with running.unix() as sock:
        for _ in range(3):
            sock.sendall(b"GET /echo/a HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_answer(sock)[0] == 200
            threading.Event().wait(0.3)
        assert closed(sock)  # and idle past its last bound, it is closed


def test_stop_answers_what_is_in_flight_and_closes_idle_connections(running: Running) -> None:
    with running.unix() as busy, running.unix() as idle:
        busy.sendall(b"GET /gate HTTP/1.1\r\nHost: x\r\n\r\n")
        idle.sendall(b"GET /echo/a HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_answer(idle)[0] == 200
        stopping = asyncio.run_coroutine_threadsafe(running.server.stop(5), running.loop)
        assert closed(idle)
        running.gate.set()
        status, headers, _ = read_answer(busy)
        assert status == 200 and headers["connection"] == "close"
        stopping.result(10)


def test_http_date_header_is_an_rfc_7231_date(running: Running) -> None:
    with running.unix() as sock:
        sock.sendall(b"GET /echo/a HTTP/1.1\r\nHost: x\r\n\r\n")
        _, headers, _ = read_answer(sock)
    assert re.fullmatch(r"\w{3}, \d{2} \w{3} \d{4} \d{2}:\d{2}:\d{2} GMT", headers["date"])


def test_a_large_answer_goes_out_part_by_part_to_a_slow_reader(running: Running) -> None:
    with running.unix() as sock:
        sock.sendall(b"GET /large HTTP/1.1\r\nHost: x\r\n\r\nGET /echo/a HTTP/1.1\r\nHost: x"
                     b"\r\n\r\n")
        pending = bytearray()
        status, headers, body = read_answer(sock, pending)
        assert status == 200 and headers["x-parts"] == "3"
        assert body == b"{" + b"x" * (3 << 20) + b"}"
        assert read_answer(sock, pending)[0] == 200  # and the next answer after it


def test_handling_counts_the_requests_being_answered_so_one_can_tell_it_is_alone(
        running: Running) -> None:
    """What the API's inline rule reads: 1 for a request alone, more while others are."""
    with running.unix() as sock, running.unix() as waiting:
        sock.sendall(b"GET /handling HTTP/1.1\r\nHost: x\r\n\r\n")
        assert json.loads(read_answer(sock)[2]) == {"handling": 1}
        waiting.sendall(b"GET /gate HTTP/1.1\r\nHost: x\r\n\r\n")  # held until the gate
        wait_until(lambda: running.server.handling == 1, what="the held request handled")
        sock.sendall(b"GET /handling HTTP/1.1\r\nHost: x\r\n\r\n")
        assert json.loads(read_answer(sock)[2]) == {"handling": 2}
        running.gate.set()
        assert read_answer(waiting)[0] == 200
    assert running.server.handling == 0


def test_an_endless_header_line_is_refused_at_the_head_cap_not_buffered(running: Running) -> None:
    """httptools keeps a header line until it ends: the cap counts the bytes fed, not the
    header callbacks (which never come for a line that never ends)."""
    with running.unix() as sock:
        sock.sendall(b"GET /echo/a HTTP/1.1\r\nX: ")
        try:
            for _ in range(64):
                sock.sendall(b"a" * 16384)  # 1 MiB, no CRLF
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, _, body = read_answer(sock)
    assert status == 431 and "exceed" in json.loads(body)["error"]


def test_a_client_that_will_not_take_its_answer_is_cut_off_after_the_send_timeout(
        running: Running) -> None:
    with running.unix() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"GET /large HTTP/1.1\r\nHost: x\r\n\r\n")  # 3 MiB, never read
        wait_until(lambda: running.server.timed_out, timeout=5,  # body_timeout_s is 1
                   what="the reader cut off")
        assert running.server.timed_out == 1
        wait_until(lambda: running.server.live == 0, what="its slot free for another")


def test_a_flood_of_pipelined_requests_is_parsed_no_further_ahead_than_the_queue_allows(
        running: Running) -> None:
    flood = b"GET /q HTTP/1.1\r\nHost: x\r\n\r\n" * 2000  # one send, ~60 KB
    with running.unix() as sock:
        sock.sendall(flood)
        pending = bytearray()
        for _ in range(2000):
            assert read_answer(sock, pending)[0] == 200
    slice_holds = http.PIPELINED_FEED_BYTES // len(b"GET /q HTTP/1.1\r\nHost: x\r\n\r\n")
    assert running.longest_queue[0] <= http.MAX_QUEUED + slice_holds + 1  # not 2000


def test_a_partial_next_head_does_not_cut_off_a_slow_answer(running: Running) -> None:
    """The head timer waits while an answer is pending; it applies to the next head after."""
    with running.unix() as sock:
        sock.sendall(b"GET /gate HTTP/1.1\r\nHost: x\r\n\r\nGET /echo/b HTTP/1.1\r\n")
        threading.Event().wait(1.5)  # longer than header_timeout_s
        running.gate.set()
        assert read_answer(sock)[0] == 200  # the slow answer came
        assert closed(sock)  # then the unfinished head ran out of time
    assert running.server.timed_out == 1


def test_stop_lets_a_large_answer_being_written_finish(running: Running) -> None:
    with running.unix() as sock:
        sock.sendall(b"GET /large HTTP/1.1\r\nHost: x\r\n\r\n")
        threading.Event().wait(0.2)  # the answer is in the socket's buffers, most unsent
        stopping = asyncio.run_coroutine_threadsafe(running.server.stop(5), running.loop)
        status, _, body = read_answer(sock)
        assert status == 200 and len(body) == (3 << 20) + 2
        stopping.result(10)


def test_an_upgrade_request_gets_one_400_and_runs_no_handler(running: Running) -> None:
    with running.unix() as sock:
        sock.sendall(b"GET /gate HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                     b"Upgrade: h2c\r\n\r\n")
        pending = bytearray()
        status, _, body = read_answer(sock, pending)
        assert status == 400 and "upgrade" in json.loads(body)["error"]
        assert closed(sock) and not pending
    assert running.server.handling == 0


def test_bytes_after_a_connection_close_request_are_not_taken_for_a_request(
        running: Running) -> None:
    with running.unix() as sock:
        sock.sendall(b"GET /echo/a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                     b"garbage that is not HTTP\r\n\r\n")
        pending = bytearray()
        status, headers, _ = read_answer(sock, pending)
        assert status == 200 and headers["connection"] == "close"
        assert closed(sock) and not pending  # no second answer, no 400


def test_100_continue_is_not_sent_to_a_request_refused_before_its_body(
        running: Running) -> None:
    with running.unix() as sock:
        sock.sendall(b"POST /ignore HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                     b"Expect: 100-continue\r\n\r\n")
        status, _, _ = read_answer(sock)  # the final answer first, no interim one
        assert status == 413


def test_a_client_that_half_closes_after_its_request_still_gets_the_answer(
        running: Running) -> None:
    with running.unix() as sock:
        sock.sendall(b"GET /gate HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.shutdown(socket.SHUT_WR)
        threading.Event().wait(0.2)
        running.gate.set()
        status, headers, _ = read_answer(sock)
        assert status == 200 and headers["connection"] == "close" and closed(sock)
