"""The seeded generator of the differential test's steps: bursts of requests on connections
(a client's loop of one request with other tensors, or a mix; one at a time or pipelined;
several connections at once), with shared memory, model swaps, unloads and loads, registers
and unregisters between them, from each peer (uid). It keeps what it has done (regions, the
scale model's inputs) only to make requests that mostly make sense: a request that does not
is as welcome, since the two daemons must refuse it alike."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from tools.differential.models import MODELS, SCALE_VERSIONS, scale_version
from tools.differential.wire import TEXT_ENCODINGS, Call, Output, Tensor, render

REGION_BYTES = 256
INPUT_REGIONS = ("r0", "r1", "r2")
OUTPUT_REGION = "out"
KEYSLOT = "~" * 12  # in a register body: the daemon's own prefix for its objects' names


def object_name(peer: str, region: str) -> str:
    """The name of `peer`'s object for `region`, after the daemon's prefix (KEYSLOT)."""
    return f"{peer}-{region}"


@dataclass
class Request:
    raw: bytes
    split: int | None = None


@dataclass
class Burst:
    peer: str
    conn: str  # e.g. "root-tcp-1"
    requests: list[Request]
    pipelined: bool = False
    read_back: list[tuple[str, int, int]] = field(default_factory=list)  # region, offset, size

    @property
    def transport(self) -> str:
        return self.conn.split("-")[1]


@dataclass
class Together:
    """Bursts on several connections at once (their answers do not depend on the order)."""

    bursts: list[Burst]


@dataclass
class Shm:
    """A peer's shared memory object: create, write or unlink (mirrored for each daemon)."""

    peer: str
    op: str
    region: str
    data: bytes = b""
    offset: int = 0


@dataclass
class Swap:
    model: str
    version: int
    artifact: bytes
    allow_io_change: bool


@dataclass
class Close:
    peer: str
    conn: str


Step = Burst | Together | Shm | Swap | Close


@dataclass
class _Region:
    created: bool = False
    registered: bool = False


class Scenario:
    """Steps from `seed`; `peers` the uids taking part ("root" first)."""

    def __init__(self, seed: int, peers: tuple[str, ...] = ("root",)) -> None:
        self.rng = random.Random(seed)
        self.peers = peers
        # Each peer's regions: three that requests read inputs from, one they write outputs
        # into (never an input: what a request in flight reads must not be what another in
        # flight writes, whose order is no one's to say).
        self.regions: dict[tuple[str, str], _Region] = {
            (p, r): _Region() for p in peers for r in (*INPUT_REGIONS, OUTPUT_REGION)}
        self.scale_width = 4
        self.version = 1  # scale's latest
        self.swaps = 0
        self.calls: dict[str, Call] = {}  # each connection's last loop, to come back to

    def steps(self) -> Iterator[Step]:
        while True:
            yield from self.next_steps()

    def next_steps(self) -> list[Step]:
        r = self.rng.random()
        if r < 0.50:
            return [self._loop(self._peer())]
        if r < 0.68:
            return [self._mixed(self._peer())]
        if r < 0.76:
            return [Together([self._loop(p, conn=i, together=True) for i, p in
                              enumerate(self.rng.choices(self.peers, k=3))])]
        if r < 0.88:
            return self._shm_step(self._peer())
        if r < 0.91:
            return [self._swap()]
        if r < 0.95:
            return [self._admin(self._peer())]
        return [Close(self._peer(), self._conn(self._peer()))]

    # -- requests ----------------------------------------------------------------------------
    def _peer(self) -> str:
        return self.rng.choice(self.peers)

    def _conn(self, peer: str, index: int | None = None) -> str:
        transport = self.rng.choice(("unix", "tcp"))
        return f"{peer}-{transport}-{self.rng.randrange(3) if index is None else index}"

    def _loop(self, peer: str, conn: int | None = None, together: bool = False) -> Burst:
        """A client's loop: one request sent 2-6 times with other tensors, one at a time (what
        plans and replays are for), now and then pipelined. Requests in flight together
        (pipelined, or beside other connections' in a Together) write no shared memory."""
        name = self._conn(peer, conn)
        pipelined = self.rng.random() < 0.15
        concurrent = pipelined or together
        call = self.calls.get(name) if self.rng.random() < 0.4 else None
        if call is None or (concurrent and self._read_back(call)):
            call = self._call(peer, shm_out=not concurrent)
            self.calls[name] = call
        pool = self.rng.randrange(4)
        requests = [self._request(call.again(pool + self.rng.randrange(3)))
                    for _ in range(self.rng.randint(2, 6))]
        return Burst(peer, name, requests, pipelined=pipelined,
                     read_back=self._read_back(call))

    def _mixed(self, peer: str) -> Burst:
        pipelined = self.rng.random() < 0.4
        calls = [self._call(peer, shm_out=not pipelined)
                 for _ in range(self.rng.randint(2, 5))]
        read_back = [spot for call in calls for spot in self._read_back(call)]
        return Burst(peer, self._conn(peer), [self._request(c) for c in calls],
                     pipelined=pipelined, read_back=read_back)

    def _request(self, call: Call) -> Request:
        raw, head = render(call)
        return Request(raw, head if self.rng.random() < 0.3 else None)

    def _read_back(self, call: Call) -> list[tuple[str, int, int]]:
        return [(o.region, o.offset, o.byte_size) for o in call.outputs or ()
                if o.mode == "shm"]

    def _call(self, peer: str, shm_out: bool = True) -> Call:
        rng = self.rng
        name = rng.choice(list(MODELS)) if rng.random() > 0.02 else "missing"
        model = MODELS.get(name, MODELS["scale"])
        batch = rng.choice((1, 1, 2, 3))
        inputs = []
        mine = [r for (p, r), state in self.regions.items()
                if p == peer and state.registered and r in INPUT_REGIONS]
        outs = [r for (p, r), state in self.regions.items()
                if shm_out and p == peer and state.registered and r == OUTPUT_REGION]
        for spec in model.inputs:
            width = spec.width or rng.choice((1, 3, 5))
            if name == "scale":
                width = self.scale_width if rng.random() > 0.05 else 12 - self.scale_width
            shape: tuple[int, ...] = (batch, width)
            if rng.random() < 0.03:
                shape = (width,)  # no batch dim: refused
            datatype = spec.datatype if rng.random() > 0.03 else rng.choice(("FP32", "INT32",
                                                                            "FP16"))
            mode = rng.choices(("json", "binary", "shm"), (3, 5, 2 if mine else 0))[0]
            tensor = Tensor(spec.name, datatype, shape, mode)
            if mode == "shm":
                region = rng.choice(mine) if rng.random() > 0.05 else "nowhere"
                tensor = replace(tensor, region=region, offset=rng.choice((0, 0, 64, 128, 250)))
            if mode != "json" and rng.random() < 0.03:
                tensor = replace(tensor, byte_size=rng.choice((0, 3, 8, 1 << 20)))
            if rng.random() < 0.02:
                tensor = replace(tensor, name="nope")
            inputs.append(tensor)
        one = len(inputs) == 1 and inputs[0].mode == "binary" and inputs[0].byte_size is None
        call = Call(name, self._version(), tuple(inputs), self._outputs(model.outputs, outs),
                    params=self._params(), request_id=rng.choice((None, None, "r1", "é-2")),
                    raw_binary=one and rng.random() < 0.1, key_order=rng.randrange(1000),
                    compact=rng.random() < 0.7, escaped=rng.random() < 0.1,
                    text=rng.choices(TEXT_ENCODINGS, (90, 3, 3, 2, 2))[0],
                    content_type=rng.choice(("application/octet-stream", "application/json",
                                             None)))
        r = rng.random()
        if r < 0.07:
            call = replace(call, encoding="gzip", padded=rng.random() < 0.5)
        elif r < 0.11:
            call = replace(call, encoding="deflate", padded=rng.random() < 0.5)
        if rng.random() < 0.05:
            call = replace(call, chunked=True)
        if rng.random() < 0.08:
            call = replace(call, extra_headers=rng.choice((
                (("User-Agent", "diff/1"), ("Accept", "*/*")),
                (("Sec-Fetch-Site", "same-origin"), ("Sec-Fetch-Mode", "cors")),
                (("Origin", "https://evil.example"),),  # another site's page: refused
                (("Sec-Fetch-Site", "cross-site"), ("Sec-Fetch-Mode", "no-cors")))))
        return call

    def _version(self) -> int | None:
        r = self.rng.random()
        if r < 0.9:
            return None
        return self.rng.choice((1, self.version, 99))

    def _outputs(self, names: tuple[str, ...], regions: list[str]
                 ) -> tuple[Output, ...] | None:
        rng = self.rng
        if rng.random() < 0.5:
            return None
        chosen = [n for n in names if rng.random() < 0.7] or [names[0]]
        if rng.random() < 0.02:
            chosen.append("nope")
        outputs = []
        for name in chosen:
            mode = rng.choices(("default", "json", "binary", "shm"), (2, 2, 4, 1 if regions
                                                                      else 0))[0]
            out = Output(name, mode)
            if mode == "shm":
                out = replace(out, region=rng.choice(regions), offset=rng.choice((0, 128)),
                              byte_size=rng.choice((128, 64, 8)))
            outputs.append(out)
        return tuple(outputs)

    def _params(self) -> tuple[tuple[str, object], ...]:
        rng = self.rng
        params: list[tuple[str, object]] = []
        if rng.random() < 0.4:
            params.append(("binary_data_output", rng.random() < 0.7))
        if rng.random() < 0.2:
            params.append(("priority", rng.choice((0, 1, 2, 7))))
        if rng.random() < 0.1:
            params.append(("timeout", 60_000_000))
        return tuple(params)

    # -- between requests --------------------------------------------------------------------
    def _shm_step(self, peer: str) -> list[Step]:
        region = self.rng.choice([r for (p, r) in self.regions if p == peer])
        state = self.regions[(peer, region)]
        if not state.created:
            state.created = True
            return [Shm(peer, "create", region),
                    Shm(peer, "write", region, self.rng.randbytes(REGION_BYTES)),
                    self._register(peer, region)]
        r = self.rng.random()
        if r < 0.6:
            return [Shm(peer, "write", region, self.rng.randbytes(self.rng.choice((16, 64))),
                        self.rng.randrange(0, REGION_BYTES - 64))]
        if r < 0.8 or not state.registered:
            return [self._register(peer, region)]
        if r < 0.92:
            return [self._unregister(peer, region)]
        state.created = state.registered = False  # unlinked while registered: it stays mapped
        return [Shm(peer, "unlink", region), self._unregister(peer, region)]

    def _register(self, peer: str, region: str) -> Burst:
        self.regions[(peer, region)].registered = True
        body = json.dumps({"key": f"/{KEYSLOT}{object_name(peer, region)}",
                           "byte_size": REGION_BYTES,
                           "offset": 0}).encode()
        return self._admin_burst(peer, f"/v2/systemsharedmemory/region/{region}/register", body)

    def _unregister(self, peer: str, region: str) -> Burst:
        self.regions[(peer, region)].registered = False
        path = f"/v2/systemsharedmemory/region/{region}/unregister"
        if self.rng.random() < 0.2:
            for (p, _), state in self.regions.items():
                if p == peer:
                    state.registered = False
            path = "/v2/systemsharedmemory/unregister"
        return self._admin_burst(peer, path, b"")

    def _admin(self, peer: str) -> Burst:
        name = self.rng.choice(list(MODELS))
        action = self.rng.choice(("unload", "load", "status"))
        if action == "status":
            return Burst(peer, self._conn(peer), [Request(
                b"GET /v2/systemsharedmemory/status HTTP/1.1\r\nHost: localhost\r\n\r\n")])
        return self._admin_burst(peer, f"/v2/repository/models/{name}/{action}", b"")

    def _admin_burst(self, peer: str, path: str, body: bytes) -> Burst:
        head = (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json"
                f"\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        return Burst(peer, self._conn(peer), [Request(head + body)])

    def _swap(self) -> Swap:
        width, factor = SCALE_VERSIONS[self.swaps % len(SCALE_VERSIONS)]
        self.swaps += 1
        self.version += 1
        changed = width != self.scale_width
        self.scale_width = width
        return Swap("scale", self.version, scale_version(width, factor), changed)
