"""The differential test of the shortcuts (issue 49): a fixed seed's request sequences played
against a daemon with every shortcut on and one with `api.shortcuts: []`, every answer
compared (tools/differential). The shortcuts must also have been taken, or the test would
prove nothing: plans hit, replays run, cached answers given, shm views lent."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from support.daemon import Served, ServeFactory

from edged.inference import batcher
from tools.differential.models import write_repository
from tools.differential.peer import LocalPeer, RemotePeer
from tools.differential.play import Daemon, Player, close_peers, object_prefix, ota_installer
from tools.differential.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]
SEED = 49
STEPS = 1000
NOBODY = 65534


@pytest.fixture(autouse=True)
def cheap_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The models' rows count as cheap and their batches as quick whatever this box's load,
    so that replays run (they take only such models' requests) on a slow, shared VM too."""
    monkeypatch.setattr(batcher, "TOGETHER_MAX_NS", 1 << 60)
    monkeypatch.setattr(batcher, "INLINE_MAX_NS", 1 << 60)


def daemon(make_served: ServeFactory, tmp_path: Path, label: str, public: Path,
           api: str) -> tuple[Served, Daemon]:
    models = write_repository(tmp_path / f"models-{label}")
    served = make_served(models_dir=models, device_id=label,
                         api=f'socket_mode: "0666", {api}',
                         cache="preload: [scale, queued, pair, ints, strings]",
                         ota=f"trusted_keys: [{public}]")
    port = int(served.http.rsplit(":", 1)[1])
    return served, Daemon(label, served.socket, port, object_prefix(label[1]),
                          folders=(str(models), str(tmp_path)))


@pytest.fixture
def peers(short_dir: Path) -> Iterator[dict[str, LocalPeer | RemotePeer]]:
    found: dict[str, LocalPeer | RemotePeer] = {"root": LocalPeer()}
    if os.geteuid() == 0:  # requests and regions of another uid, from a process of its own
        short_dir.chmod(0o711)  # its sockets' folder: others may reach the sockets in it
        found["nobody"] = RemotePeer(NOBODY, NOBODY, ROOT)
    yield found
    close_peers(found.values())


def test_shortcuts_when_a_seeded_sequence_is_played_answer_as_the_full_path(
        make_served: ServeFactory, tmp_path: Path, peers: dict[str, LocalPeer | RemotePeer],
        key: tuple[Ed25519PrivateKey, Path]) -> None:
    on_served, on = daemon(make_served, tmp_path, "son", key[1], "")
    off_served, off = daemon(make_served, tmp_path, "sff", key[1], "shortcuts: []")
    player = Player(on, off, peers, ota_installer(key[0]))  # type: ignore[arg-type]
    report = player.play(Scenario(SEED, tuple(peers)), steps=STEPS)
    assert report.mismatches == 0, report.examples
    # What was compared: answers of every kind, writes into shared memory, swaps.
    assert report.requests > 2500 and report.read_backs > 15 and report.swaps >= 20
    assert report.statuses.get(200, 0) > 1200 and report.statuses.get(400, 0) > 500
    # The shortcuts were taken on one daemon, and none on the other.
    plans = on_served.daemon.api.kserve.plans
    print(f"plans hit {plans.hits}, replayed {plans.replays()}, cached answers "
          f"{hits(on_served)}: {report}")
    assert plans.hits > 50 and plans.replays() > 50 and hits(on_served) > 50
    off_plans = off_served.daemon.api.kserve.plans
    assert len(off_plans) == 0 and off_plans.hits == 0
    assert hits(off_served) == 0


def hits(served: Served) -> int:
    return sum(s.cache_hits for s in served.daemon.scheduler.statistics().values())
