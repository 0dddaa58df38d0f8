"""One memory budget for the request bodies in flight, and reading a body within it.

A body is charged from its first byte until its request is answered (its tensors are views of
the body, held by the batch); past `api.max_bodies_mb` in all, a request gets 503 `overloaded`
before more of it is read, and one that could never fit gets 413. A JSON tensor body costs far
more than its bytes once parsed (a Python object per number), so it is charged at
JSON_WEIGHT times its length before it is parsed. Compressed bodies are read compressed and
inflated on a thread, never past `api.max_request_mb`: a small gzip bomb neither stalls the
event loop nor fills memory before it is refused (issue 20 #6). The whole body must arrive
within `api.body_timeout_s` of its headers (else 408, and the connection is closed): a body
is charged before its bytes come, and a client that stalls must not hold that for good."""

from __future__ import annotations

import asyncio
import threading
import zlib

import numpy as np

from edged.api.http.messages import BrokenBody, Request
from edged.core.errors import BodyTimeout, InvalidInput, Overloaded, TooLarge

ALIGN = 64
SMALL_BODY = 4096  # bytes; a body this small is not placed (_aligned)
# Parsed JSON tensors weigh up to ~7x their text (measured: `[0,0,...]` 7.0x, random floats
# 3.6x, on numpy's array plus json's lists); a margin above that.
JSON_WEIGHT = 10
INFLATE_CHUNK = 1 << 20
# Bodies are inflated here, bounded and off the loop (the HTTP layer passes them as they come).
GZIP_MAGIC = b"\x1f\x8b"
ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "identity": 0}


class BodyBudget:
    """Bytes held by request bodies in flight, against a limit shared by every connection."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.held = 0
        self.refused = 0  # requests answered 503 for want of budget
        self._lock = threading.Lock()

    def charge(self) -> Charge:
        return Charge(self)

    def take(self, n: int) -> None:
        """Hold `n` more bytes (a Charge's add; or a caller that gives them back itself
        within the same call): 413 or 503 when they cannot be held, and nothing taken."""
        if n > self.limit:
            raise TooLarge(f"the request needs {_mb(n)} of the {_mb(self.limit)} that request "
                           "bodies may hold at once (api.max_bodies_mb); send tensors as "
                           "binary data or shared memory")
        with self._lock:
            if self.held + n > self.limit:
                self.refused += 1
                held = self.held
            else:
                self.held += n
                return
        raise Overloaded(f"request bodies in flight hold {_mb(held)} of {_mb(self.limit)} "
                         f"(api.max_bodies_mb), {_mb(n)} more do not fit: retry later")

    def give(self, n: int) -> None:
        with self._lock:
            self.held -= n


class Charge:
    """What one request holds of the budget; `release()` (once answered) gives it all back."""

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.bytes = 0

    def add(self, n: int) -> None:
        self.budget.take(n)
        self.bytes += n

    def give(self, n: int) -> None:
        """Give back `n` of what this request holds: a transient copy that has gone."""
        n = min(n, self.bytes)
        self.bytes -= n
        self.budget.give(n)

    def release(self) -> None:
        held, self.bytes = self.bytes, 0
        self.budget.give(held)


def encoded(request: Request) -> bool:
    """Whether the request's body comes compressed (a Content-Encoding other than identity)."""
    encoding = request.headers.get("Content-Encoding")
    return encoding is not None and encoding.strip().lower() != "identity"


async def read_body(request: Request, limit: int, charge: Charge | None = None,
                    json_length: int | None = None) -> memoryview:
    """The whole body, charged as it arrives, in a buffer of its own placed so the tensor
    bytes after the first `json_length` start 64-byte aligned."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ENCODINGS:
        raise InvalidInput(f"Content-Encoding {encoding[:32]!r} is not supported "
                           "(gzip, deflate or none)")
    length = request.content_length
    if length is not None and length > limit:
        raise TooLarge(f"the body's {length} bytes exceed the {_mb(limit)} allowed here")
    charge = charge or BodyBudget(limit).charge()  # uncharged: the size limit alone
    if length is not None and not ENCODINGS[encoding]:
        charge.add(length)
        whole = request.content.whole(length)  # it came with its headers: no wait, no timer
        if whole is not None:
            return copy_body(whole, length, json_length)
        return await _read_exactly(_Chunks(request), length, json_length)
    wbits = ENCODINGS[encoding]
    # Chunked, or compressed (whose bytes are inflated into a buffer of their own).
    raw = await _read_chunks(_Chunks(request), limit, charge, None if wbits else json_length)
    if not wbits:
        return raw
    # Inflating runs on a thread: a hostile body is seconds of CPU.
    inflated = await asyncio.to_thread(_inflate, raw, wbits, limit, charge, json_length)
    charge.give(len(raw))  # the compressed bytes go now
    return inflated


class _Chunks:
    """A request's body as it arrives, all of it within the body timeout of the headers (a
    timer only while a read waits: a body that came with its headers costs none); a
    connection lost mid-body is the client's doing (400: it hears nothing), not a 500."""

    def __init__(self, request: Request) -> None:
        self.content = request.content
        self.timeout_s = request.body_timeout_s
        self._loop = asyncio.get_running_loop()
        self._deadline = self._loop.time() + self.timeout_s

    def _expire(self) -> None:
        self.content.set_exception(_Expired())  # wakes a read waiting for more

    async def next(self) -> bytes | bytearray:
        timer = None if self.content.ready else self._loop.call_at(self._deadline,
                                                                   self._expire)
        try:
            return await self.content.readany()
        except _Expired:
            raise BodyTimeout(f"the body did not arrive within {self.timeout_s:g} s "
                              "(api.body_timeout_s)") from None
        except (ConnectionError, BrokenBody) as exc:  # a hang-up, a broken chunk
            raise InvalidInput(f"the body cannot be read: {exc}") from exc
        finally:
            if timer is not None:
                timer.cancel()


class _Expired(Exception):
    """The body timeout, as the body's stream raises it to a waiting read."""


async def _read_exactly(chunks: _Chunks, length: int, json_length: int | None) -> memoryview:
    view = _aligned(length, json_length)
    filled = 0
    while filled < length:
        chunk = await chunks.next()
        if not chunk or filled + len(chunk) > length:
            raise InvalidInput(f"the body does not match its Content-Length of {length}")
        view[filled:filled + len(chunk)] = chunk
        filled += len(chunk)
    return view


async def _read_chunks(chunks: _Chunks, limit: int, charge: Charge,
                       json_length: int | None) -> memoryview:
    """A body of unknown length (chunked, or compressed), charged as it arrives and within
    `limit`, placed as `_read_exactly` places one."""
    parts: list[bytes | bytearray] = []
    size = 0
    while chunk := await chunks.next():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"the body exceeds the {_mb(limit)} allowed here")
        charge.add(len(chunk))
        parts.append(chunk)
    return _join(parts, size, json_length, charge)


def _inflate(raw: memoryview, wbits: int, limit: int, charge: Charge,
             json_length: int | None) -> memoryview:
    """Inflate at most `limit` bytes (charged as they come); more is a 413, corrupt a 400.
    What is held for a while beside them is charged too: zlib's copy of the input it has not
    consumed yet, and the parts and their joined copy at once."""
    inflater = zlib.decompressobj(wbits)
    parts: list[bytes | bytearray] = []
    size = 0
    pending: bytes | memoryview = raw
    charge.add(len(raw))  # unconsumed_tail: a copy of the rest of the input, each round
    try:
        while pending:
            part = inflater.decompress(pending, INFLATE_CHUNK)
            pending = inflater.unconsumed_tail
            size += len(part)
            if size > limit:
                raise TooLarge(f"the body inflates past the {_mb(limit)} allowed here")
            charge.add(len(part))
            parts.append(part)
            if inflater.eof:
                # gzip may hold several members (RFC 1952 §2.2): the next one inflates in
                # turn; anything else after the end is no part of the body.
                pending = inflater.unused_data
                if pending and not (wbits > zlib.MAX_WBITS and pending[:2] == GZIP_MAGIC):
                    raise InvalidInput(f"{len(pending)} bytes follow the end of the "
                                       "compressed body")
                if pending:
                    inflater = zlib.decompressobj(wbits)
            elif not part and not pending:
                break
    except zlib.error as exc:
        raise InvalidInput(f"the compressed body is corrupt: {exc}") from exc
    if not inflater.eof:
        raise InvalidInput("the compressed body ends early")
    pending = b""
    charge.give(len(raw))  # zlib's copy of the input: gone with the inflater
    return _join(parts, size, json_length, charge)


def _join(parts: list[bytes | bytearray], size: int, json_length: int | None,
          charge: Charge) -> memoryview:
    """The parts (charged) in one placed buffer (charged before it is made); each part goes
    as it is copied, and its share of the charge with it."""
    charge.add(size)
    view = _aligned(size, json_length)
    filled = 0
    parts.reverse()
    while parts:
        part = parts.pop()
        n = len(part)
        view[filled:filled + n] = part
        filled += n
        del part
        charge.give(n)
    return view


def copy_body(data: bytes | bytearray, length: int, json_length: int | None) -> memoryview:
    """The last `length` bytes of `data` (a body that came whole) in a buffer of their own,
    placed as read_body places a body."""
    if length <= SMALL_BODY:
        return memoryview(bytearray(memoryview(data)[len(data) - length:]))
    view = _aligned(length, json_length)
    view[:] = memoryview(data)[len(data) - length:]
    return view


def _aligned(length: int, json_length: int | None) -> memoryview:
    """An uninitialised buffer of `length` bytes whose byte `json_length` is 64-byte aligned.
    A body under a page is left as malloc places it (8-byte aligned): no copy of its tensors
    gains from more, and placing it (numpy's array and its address) cost ~5 µs a request, a
    few % of a tiny request's server CPU (py-spy, tiny_cls under perf_analyzer)."""
    if length <= SMALL_BODY:
        return memoryview(bytearray(length))
    raw = np.empty(length + ALIGN, np.uint8)
    start = -(raw.ctypes.data + (json_length or 0)) % ALIGN
    return raw.data[start:start + length]


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
