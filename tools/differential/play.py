"""Playing the differential test's steps against two daemons, the one with every shortcut on
and the reference with `api.shortcuts: []`, and comparing what each answers: every request's
status, the headers that are the answer's (not Date), its body, and what it wrote into shared
memory. Each daemon gets the same step in turn; what is daemon-specific (the names of its
shared memory objects, its folders) is written the same way in both before comparing."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tools.differential.peer import Answer, Target
from tools.differential.scenario import (
    KEYSLOT,
    REGION_BYTES,
    Burst,
    Close,
    Scenario,
    Shm,
    Step,
    Swap,
    Together,
    object_name,
)

MAX_REPORTED = 20  # mismatches kept in full


class Peer(Protocol):
    def burst(self, conn: str, target: Target, requests: list[tuple[bytes, int | None]],
              pipelined: bool) -> list[Answer]: ...
    def close(self, conn: str) -> None: ...
    def shm_create(self, key: str, size: int) -> None: ...
    def shm_write(self, key: str, offset: int, data: bytes) -> None: ...
    def shm_read(self, key: str, offset: int, size: int) -> bytes: ...
    def shm_unlink(self, key: str) -> None: ...


@dataclass(frozen=True)
class Daemon:
    """One daemon under test: its listeners, the prefix of its shared memory objects' names
    (KEYSLOT's length), and folders of its own that an answer may name."""

    label: str
    socket: Path
    port: int
    prefix: str
    folders: tuple[str, ...] = ()

    def target(self, transport: str) -> Target:
        return Target(unix=str(self.socket)) if transport == "unix" else Target(port=self.port)

    def own(self, raw: bytes) -> bytes:
        return raw.replace(KEYSLOT.encode(), self.prefix.encode())

    def neutral(self, data: bytes) -> bytes:
        """`data` with what names this daemon written as the other daemon's is."""
        data = data.replace(self.prefix.encode(), KEYSLOT.encode())
        data = data.replace(f"port {self.port}".encode(), b"port <port>")
        for i, folder in enumerate(self.folders):
            data = data.replace(folder.encode(), f"<folder{i}>".encode())
        return data


@dataclass
class Report:
    steps: int = 0
    requests: int = 0  # answers compared (each sent to both daemons)
    read_backs: int = 0  # shared memory outputs compared
    swaps: int = 0
    mismatches: int = 0
    uncompared: int = 0  # sent after a pipelined request whose answer closed the connection
    statuses: dict[int, int] = field(default_factory=dict)  # of the compared answers
    examples: list[dict[str, Any]] = field(default_factory=list)

    def mismatch(self, step: int, what: str, request: bytes, on: Any, off: Any) -> None:
        self.mismatches += 1
        if len(self.examples) < MAX_REPORTED:
            self.examples.append({"step": step, "what": what, "request": request[:600],
                                  "shortcuts": _short(on), "full_path": _short(off)})


def _kept_open(answer: Answer) -> bool:
    return answer[0] > 0 and ("connection", "close") not in answer[1]


def _without_close(answer: Answer) -> Answer:
    """An error answer as compared: whether it closed the connection aside (see _compare)."""
    status, headers, body = answer
    if status < 400:
        return answer
    return status, tuple(h for h in headers if h != ("connection", "close")), body


def _short(value: Any) -> Any:
    if isinstance(value, tuple) and len(value) == 3 and isinstance(value[2], bytes):
        return (value[0], value[1], value[2][:400])
    return value


Installer = Any  # (daemon, model, version, artifact, allow_io_change) -> final state


class Player:
    """Plays steps on `on` and `off` (the reference) and compares their answers."""

    def __init__(self, on: Daemon, off: Daemon, peers: dict[str, Peer],
                 install: Installer) -> None:
        self.daemons = (on, off)
        self.peers = peers
        self.install = install
        self.report = Report()

    def play(self, scenario: Scenario, *, steps: int | None = None,
             until: float | None = None) -> Report:
        """Play `steps` steps, or until the monotonic clock passes `until`."""
        for step in scenario.steps():
            if steps is not None and self.report.steps >= steps:
                break
            if until is not None and time.monotonic() >= until:
                break
            self.step(step)
            self.report.steps += 1
        return self.report

    def step(self, step: Step) -> None:
        if isinstance(step, Burst):
            self._compare(step, [self._burst(step, d) for d in self.daemons])
        elif isinstance(step, Together):
            results: dict[int, list[Any]] = {i: [] for i in range(len(step.bursts))}

            def run(i: int, burst: Burst, daemon: Daemon) -> None:
                results[i].append(self._burst(burst, daemon))

            for d in self.daemons:  # each daemon's bursts at once; one daemon after the other
                threads = [threading.Thread(target=run, args=(i, b, d))
                           for i, b in enumerate(step.bursts)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(120)
            for i, burst in enumerate(step.bursts):
                self._compare(burst, results[i])
        elif isinstance(step, Shm):
            self._shm(step)
        elif isinstance(step, Swap):
            states = [self.install(d, step.model, step.version, step.artifact,
                                   step.allow_io_change) for d in self.daemons]
            self.report.swaps += 1
            if states[0] != states[1]:
                self.report.mismatch(self.report.steps, f"swap to {step.version}", b"", *states)
        elif isinstance(step, Close):
            for d in self.daemons:
                self.peers[step.peer].close(f"{d.label}/{step.conn}")

    def _burst(self, burst: Burst, daemon: Daemon) -> tuple[list[Answer], list[bytes]]:
        peer = self.peers[burst.peer]
        answers = peer.burst(f"{daemon.label}/{burst.conn}", daemon.target(burst.transport),
                             [(daemon.own(r.raw), r.split) for r in burst.requests],
                             burst.pipelined)
        answers = [(s, h, daemon.neutral(b)) for s, h, b in answers]
        read = []
        for region, offset, size in burst.read_back:
            try:
                read.append(peer.shm_read(daemon.prefix + object_name(burst.peer, region),
                                          offset, size))
            except (KeyError, RuntimeError, ValueError):
                read.append(b"<no object>")
        return answers, read

    def _compare(self, burst: Burst, results: list[tuple[list[Answer], list[bytes]]]) -> None:
        (on, on_read), (off, off_read) = results
        report = self.report
        for i, (request, a, b) in enumerate(zip(burst.requests, on, off, strict=True)):
            report.requests += 1
            report.statuses[b[0]] = report.statuses.get(b[0], 0) + 1
            a_kept, b_kept = _kept_open(a), _kept_open(b)
            if _without_close(a) != _without_close(b) or (a_kept != b_kept and a[0] < 400):
                report.mismatch(report.steps, f"{burst.conn} answer", request.raw, a, b)
            if burst.pipelined and not (a_kept and b_kept):
                # An error answered before its body was all in closes the connection (the
                # rest is read and dropped first): whether it was in is a matter of timing,
                # in both daemons alike. What was sent after it on the connection is not
                # compared.
                report.uncompared += len(burst.requests) - i - 1
                break
        for (region, offset, _), a_bytes, b_bytes in zip(burst.read_back, on_read, off_read,
                                                          strict=True):
            report.read_backs += 1
            if a_bytes != b_bytes:
                report.mismatch(report.steps, f"{burst.peer} {region}@{offset} written", b"",
                                a_bytes.hex()[:200], b_bytes.hex()[:200])

    def _shm(self, step: Shm) -> None:
        peer = self.peers[step.peer]
        for d in self.daemons:
            key = d.prefix + object_name(step.peer, step.region)
            if step.op == "create":
                peer.shm_create(key, REGION_BYTES)
            elif step.op == "write":
                peer.shm_write(key, step.offset, step.data)
            else:
                peer.shm_unlink(key)


def object_prefix(tag: str) -> str:
    """A daemon's shared memory object names: as long as KEYSLOT, unique to this run."""
    prefix = f"df{tag}{os.getpid() % 10**8:08d}-"
    assert len(prefix) == len(KEYSLOT)
    return prefix


def ota_installer(private_key: Any) -> Installer:
    """Swaps by a signed install on the daemon's socket (`POST /v2/edged/ota/install`, the
    Mender module's path): the final state, "active" when it went live."""
    from edged.ops.client import EdgedClient
    from edged.ota.manifest import sign_document

    def install(daemon: Daemon, model: str, version: int, artifact: bytes,
                allow_io_change: bool) -> str:
        doc = sign_document({"model": model, "version": version, "format": "onnx",
                             "artifact": {"size": len(artifact),
                                          "sha256": hashlib.sha256(artifact).hexdigest()},
                             "allow_io_change": allow_io_change, "target": "local",
                             "seq": time.time_ns() // 1000, "expires": int(time.time()) + 3600},
                            private_key)
        head = json.dumps(doc).encode()
        with EdgedClient(daemon.socket, timeout_s=60) as client:
            status, _, raw = client.request(
                "POST", "/v2/edged/ota/install", head + artifact,
                {"Content-Type": "application/octet-stream",
                 "Edged-Manifest-Length": str(len(head))})
            if status != 202:
                return f"refused {status}: {raw[:200]!r}"
            install_id = json.loads(raw)["id"]
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                _, _, body = client.request("GET", f"/v2/edged/ota/installs/{install_id}")
                state = str(json.loads(body)["state"])
                if state in ("active", "failed", "rolled_back"):
                    return state
                time.sleep(0.02)  # polling the daemon's own record: nothing to wait on
        return "timed out"

    return install


def summary(report: Report) -> dict[str, Any]:
    return {"steps": report.steps, "requests": report.requests,
            "read_backs": report.read_backs, "swaps": report.swaps,
            "mismatches": report.mismatches, "uncompared": report.uncompared,
            "statuses": {str(k): v for k, v in sorted(report.statuses.items())},
            "examples": [{k: (v.decode("latin-1") if isinstance(v, bytes) else repr(v))
                          for k, v in e.items()} for e in report.examples]}


def close_peers(peers: Iterable[Any]) -> None:
    for peer in peers:
        peer.close_all()
