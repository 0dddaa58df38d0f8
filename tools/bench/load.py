"""A closed-loop HTTP load generator for benchmarks: N keep-alive connections (Unix socket or
TCP), each sending one prebuilt request and waiting for its answer before the next. It is
deliberately lean (asyncio streams, no client library) so that on a 2-core machine the client
takes as little CPU from the server under test as possible, and it is the same client for
every server compared."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Target:
    unix: str | None = None  # socket path, or
    host: str = "127.0.0.1"
    port: int = 0

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.unix is not None:
            return await asyncio.open_unix_connection(self.unix, limit=1 << 24)
        return await asyncio.open_connection(self.host, self.port, limit=1 << 24)


def http_request(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: localhost", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {"Content-Type": "application/json"}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class HttpFailed(RuntimeError):
    pass


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   request: bytes) -> bytes:
    """One request on a kept-alive connection; its answer's body (HttpFailed unless 200)."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    match = _CONTENT_LENGTH.search(head)
    if match is None:
        raise HttpFailed(f"response without Content-Length: {head[:200]!r}")
    body = await reader.readexactly(int(match.group(1)))
    if head[9:12] != b"200":
        raise HttpFailed(f"{head[:12].decode()} {body[:300]!r}")
    return body


def one(target: Target, request: bytes) -> bytes:
    """Send one request; return the response body (to check a server answers correctly)."""
    async def run() -> bytes:
        reader, writer = await target.connect()
        try:
            return await exchange(reader, writer, request)
        finally:
            writer.close()

    return asyncio.run(run())


@dataclass(frozen=True)
class LoadResult:
    requests: int
    seconds: float
    latencies_s: list[float]

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def closed_loop(target: Target, request: bytes, *, concurrency: int, seconds: float,
                warmup_s: float = 0.3) -> LoadResult:
    """Run `concurrency` connections for `seconds` (after a warm-up); count completions."""
    async def run() -> LoadResult:
        conns = [await target.connect() for _ in range(concurrency)]
        latencies: list[float] = []
        counting = False
        stop = False

        async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while not stop:
                started = time.perf_counter()
                await exchange(reader, writer, request)
                if counting:
                    latencies.append(time.perf_counter() - started)

        tasks = [asyncio.create_task(client(r, w)) for r, w in conns]
        try:
            await asyncio.sleep(warmup_s)
            counting = True
            begin = time.perf_counter()
            await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_EXCEPTION)
            elapsed = time.perf_counter() - begin
            counting = False
            for task in tasks:
                if task.done() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            done = len(latencies)
            stop = True
            await asyncio.wait(tasks, timeout=10)
            return LoadResult(done, elapsed, latencies)
        finally:
            stop = True
            for task in tasks:
                task.cancel()
            for _reader, writer in conns:
                writer.close()

    return asyncio.run(run())


@dataclass(frozen=True)
class Sample:
    end: float  # time.time() when the answer came
    latency_s: float
    body: bytes | None  # None: the request failed


def sampled_loop(target: Target, request: bytes, *, concurrency: int,
                 stop: Callable[[], bool]) -> list[Sample]:
    """Closed loop until `stop()` says so, keeping every answer with its time and body and
    counting failures instead of raising (an update under load must not fail any)."""
    async def run() -> list[Sample]:
        samples: list[Sample] = []

        async def client() -> None:
            reader, writer = await target.connect()
            try:
                while not stop():
                    started = time.perf_counter()
                    try:
                        body: bytes | None = await exchange(reader, writer, request)
                    except (HttpFailed, OSError, asyncio.IncompleteReadError):
                        body = None
                        writer.close()
                        reader, writer = await target.connect()
                    samples.append(Sample(time.time(), time.perf_counter() - started, body))
            finally:
                writer.close()

        await asyncio.gather(*(client() for _ in range(concurrency)))
        return samples

    return asyncio.run(run())
