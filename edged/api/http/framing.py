"""What one HTTP request may carry besides its body, counted as the parser meets it: the head
(request target, header fields and lines, all of it together) and a chunked body's framing.

llhttp bounds none of these itself, and httptools gathers a header line in memory until it
ends. The bounds are nginx's and Triton's: 8 KiB lines and ~100 fields (`api.max_header_line_bytes`,
`api.max_header_fields`, answered 431; a longer request target 414), 64 KiB of head in all,
and at most MAX_CHUNKS chunks in a chunked body, each with a short size line: a body sent a
byte a chunk costs a parser callback per byte, and a chunk extension is framing, not data."""

from __future__ import annotations

from edged.api.http.messages import HttpError

MAX_HEAD_BYTES = 64 * 1024  # request line and headers, together
MAX_CHUNKS = 65536  # non-empty chunks of one body (Triton's kMaxChunkedChunks)
CHUNK_FRAMING_BYTES = 32  # a chunk's size line and CRLFs, extensions included, on average


class MessageLimits:
    """The counts of the message being parsed; each `HttpError` says which bound it broke."""

    __slots__ = ("chunks", "fields", "max_fields", "max_line", "target")

    def __init__(self, max_fields: int, max_line: int) -> None:
        self.max_fields = max_fields
        self.max_line = max_line
        self.target = self.fields = self.chunks = 0

    def begin(self) -> None:
        self.target = self.fields = self.chunks = 0

    def url(self, size: int) -> None:
        """`size` more bytes of the request target."""
        self.target += size
        if self.target > self.max_line:
            raise HttpError(414, f"the request target exceeds {self.max_line} bytes "
                                 "(api.max_header_line_bytes)")

    def field(self, name: bytes, value: bytes) -> None:
        """One header field (or trailer), whole."""
        self.fields += 1
        if self.fields > self.max_fields:
            raise HttpError(431, f"the request has more than {self.max_fields} header fields "
                                 "(api.max_header_fields)")
        if len(name) + len(value) > self.max_line:
            raise HttpError(431, f"header field {name[:64].decode('latin-1')!r} exceeds "
                                 f"{self.max_line} bytes (api.max_header_line_bytes)")

    def chunk(self) -> None:
        """A chunk's size line was parsed (the last, empty chunk's too)."""
        self.chunks += 1
        if self.chunks > MAX_CHUNKS + 1:
            raise HttpError(400, f"the chunked body has more than {MAX_CHUNKS} chunks; send "
                                 "fewer, larger chunks")

    def check(self, framing: int, in_head: bool) -> None:
        """`framing`: the bytes of the message so far that are not its body."""
        if framing <= MAX_HEAD_BYTES + CHUNK_FRAMING_BYTES * self.chunks:
            return
        if in_head or not self.chunks:
            raise HttpError(431, f"the request line and headers exceed {MAX_HEAD_BYTES} bytes")
        raise HttpError(400, f"the chunked body's framing (chunk size lines, extensions, "
                             f"trailers) exceeds {MAX_HEAD_BYTES} bytes plus "
                             f"{CHUNK_FRAMING_BYTES} a chunk")
