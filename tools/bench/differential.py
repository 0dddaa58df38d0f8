"""`python -m tools.bench differential --minutes N`: the differential test of the shortcuts
(tools/differential) for N minutes on two `edged run` daemons, one with every shortcut on and
one with `api.shortcuts: []`: seeded request sequences (a new seed each run, printed) played
against both, every answer compared. Reports the steps, requests and shared memory outputs
compared, the answers by status, and the mismatches (0 is the only passing count), with the
first ones in full in the JSON."""

from __future__ import annotations

import os
import socket
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from tools.bench.api import run_edged
from tools.differential.models import MODELS, write_repository
from tools.differential.peer import LocalPeer, RemotePeer
from tools.differential.play import (
    Daemon,
    Player,
    close_peers,
    object_prefix,
    ota_installer,
    summary,
)
from tools.differential.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
DEFAULT_MINUTES = 30.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _config(workdir: Path, port: int, public: Path, shortcuts: str) -> str:
    return f"""device_id: {workdir.name}
models_dir: {workdir / 'models'}
cache: {{dir: {workdir / 'cache'}, preload: [{', '.join(MODELS)}]}}
backends: {{onnxruntime: {{providers: [cpu], intra_op_threads: 1}}}}
api: {{socket: {workdir / 's.sock'}, socket_mode: "0666", http: "127.0.0.1:{port}"{shortcuts}}}
mqtt: {{enabled: false}}
ota: {{trusted_keys: [{public}]}}
logging: {{level: warning}}
"""


def run_bench(workdir: Path, *, quick: bool, minutes: float | None = None,
              seed: int | None = None) -> dict[str, Any]:
    minutes = 0.5 if quick else (minutes or DEFAULT_MINUTES)
    seed = int(time.time()) if seed is None else seed
    private = Ed25519PrivateKey.generate()
    public = workdir / "fleet.pub"
    public.write_bytes(private.public_key().public_bytes(Encoding.PEM,
                                                         PublicFormat.SubjectPublicKeyInfo))
    workdir.chmod(0o711)  # another uid's peer reaches the sockets below it
    daemons = []
    with ExitStack() as stack:
        for label, shortcuts in (("son", ""), ("sff", ", shortcuts: []")):
            home = workdir / label
            home.mkdir(mode=0o711)
            write_repository(home / "models")
            port = _free_port()
            sock, _ = stack.enter_context(run_edged(home, _config(home, port, public,
                                                                  shortcuts)))
            daemons.append(Daemon(label, sock, port, object_prefix(label[1]),
                                  folders=(str(home),)))
        peers: dict[str, Any] = {"root": LocalPeer()}
        if os.geteuid() == 0:
            peers["nobody"] = RemotePeer(NOBODY, NOBODY, ROOT)
        stack.callback(close_peers, list(peers.values()))
        player = Player(daemons[0], daemons[1], peers, ota_installer(private))
        began = time.monotonic()
        report = player.play(Scenario(seed, tuple(peers)), until=began + minutes * 60)
        elapsed = time.monotonic() - began
    return {"seed": seed, "minutes": elapsed / 60, "peers": list(peers),
            "requests_per_s": report.requests / elapsed, **summary(report)}


def format_table(r: dict[str, Any]) -> str:
    statuses = ", ".join(f"{k}: {v}" for k, v in r["statuses"].items())
    lines = [
        "the shortcuts against the full path (api.shortcuts: [])",
        f"  seed {r['seed']}, {r['minutes']:.1f} minutes, peers {', '.join(r['peers'])}",
        f"  steps {r['steps']}, requests compared {r['requests']} "
        f"({r['requests_per_s']:.0f}/s, each answered by both daemons)",
        f"  shm outputs compared {r['read_backs']}, swaps {r['swaps']}",
        f"  answers by status: {statuses}",
        f"  MISMATCHES {r['mismatches']}",
    ]
    for example in r["examples"][:5]:
        lines.append(f"    step {example['step']} {example['what']}: "
                     f"{example['shortcuts'][:120]} != {example['full_path'][:120]}")
    return "\n".join(lines)
