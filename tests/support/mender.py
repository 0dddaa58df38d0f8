"""The real Debian `mender` client in standalone mode, run against a test's daemon without
changing the host.

mender reads its update modules from /usr/share/mender/modules/v3 and its rootfs state scripts
and fallback artifact name from /etc/mender: fixed paths. Everything else goes where the test
says: its state (`--data`: the database, the module's work tree, device_type) in a private
0700 folder, its config (`-c`, with ArtifactVerifyKey) in the test's folder. The two fixed
folders are replaced, for mender alone, by bind mounts in a private mount namespace (`unshare
-m`), holding deploy/mender's module and guard script, the module's settings (the test's
socket) and an artifact_info. Where no namespace can be made (not root, or no CAP_SYS_ADMIN),
the same files go into the real folders (a host's own artifact_info is kept, not replaced)
and every file placed there is put back as it was at the end of the test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

DEPLOY = Path(__file__).parents[2] / "deploy" / "mender"
MODULES = Path("/usr/share/mender/modules/v3")
ETC = Path("/etc/mender")
DEVICE_TYPE = "edged-test"
BASE_NAME = "edged-test-base"  # the artifact name mender reports before any install


def missing() -> str | None:
    for tool in ("mender", "mender-artifact", "openssl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install mender-client mender-artifact)"
    if os.geteuid() != 0:
        return "mender's standalone mode runs as root (its modules folder is the system's)"
    return None


def can_unshare() -> bool:
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                           capture_output=True, check=False)
    return probe.returncode == 0


@dataclass
class Mender:
    root: Path  # the test's folder: data/, etc/, modules/, mender.conf
    confined: bool  # a private mount namespace (else the real folders, restored after)
    base_name: str = BASE_NAME  # the artifact name mender reports before any install

    @property
    def data(self) -> Path:
        return self.root / "data"

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        command = ["mender", "--no-syslog", "-c", str(self.root / "mender.conf"),
                   "-b", str(self.root / "fallback.conf"), "-d", str(self.data), *args]
        if self.confined:
            mounts = (f"mount --bind {self.root / 'modules'} {MODULES} && "
                      f"mount --bind {self.root / 'etc'} {ETC} && exec \"$@\"")
            command = ["unshare", "-m", "--propagation", "private", "sh", "-c", mounts,
                       "mender", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              check=False)

    def install(self, artifact: Path) -> subprocess.CompletedProcess[str]:
        return self.run("install", str(artifact))

    def commit(self) -> subprocess.CompletedProcess[str]:
        return self.run("commit")

    def rollback(self) -> subprocess.CompletedProcess[str]:
        return self.run("rollback")

    def artifact_name(self) -> str:
        return self.run("show-artifact").stdout.strip()

    def provides(self) -> dict[str, str]:
        lines = self.run("show-provides").stdout.splitlines()
        return dict(line.split("=", 1) for line in lines if "=" in line)


def _populate(root: Path, socket: Path, verify_key: Path | None) -> None:
    data = root / "data"
    data.mkdir(mode=0o700)
    (data / "device_type").write_text(f"device_type={DEVICE_TYPE}\n")
    config = {"DeviceTypeFile": str(data / "device_type")}
    if verify_key is not None:
        config["ArtifactVerifyKey"] = str(verify_key)
    (root / "mender.conf").write_text(json.dumps(config))
    modules, etc = root / "modules", root / "etc"
    (etc / "scripts").mkdir(parents=True)
    modules.mkdir()
    shutil.copy2(DEPLOY / "edged-model", modules / "edged-model")
    shutil.copy2(DEPLOY / "Download_Enter_50_edged-model",
                 etc / "scripts" / "Download_Enter_50_edged-model")
    (etc / "scripts" / "version").write_text("3\n")
    (etc / "artifact_info").write_text(f"artifact_name={BASE_NAME}\n")
    (etc / "edged-model.conf").write_text(f"socket = {socket}\n")


class _Restorer:
    """Files copied into real folders, and how to put each back as it was."""

    def __init__(self) -> None:
        self.saved: list[tuple[Path, bytes | None, int | None]] = []
        self.made: list[Path] = []

    def place(self, source: Path, target: Path) -> None:
        for folder in reversed(target.parents):
            if not folder.exists():
                folder.mkdir()
                self.made.append(folder)
        before = target.read_bytes() if target.exists() else None
        mode = target.stat().st_mode if target.exists() else None
        self.saved.append((target, before, mode))
        shutil.copy2(source, target)

    def restore(self) -> None:
        for target, before, mode in reversed(self.saved):
            if before is None:
                target.unlink(missing_ok=True)
            else:
                target.write_bytes(before)
                if mode is not None:
                    target.chmod(mode)
        for folder in reversed(self.made):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()


@pytest.fixture
def make_mender(tmp_path: Path) -> Iterator:
    """`make_mender(socket, verify_key)`: a standalone mender for the daemon on `socket`,
    checking artifacts against `verify_key` (None: any, signed or not)."""
    reason = missing()
    if reason is not None:
        pytest.skip(reason)
    confined = can_unshare()
    restorers: list[_Restorer] = []

    def make(socket: Path, verify_key: Path | None) -> Mender:
        root = tmp_path / f"mender-{len(restorers)}"
        root.mkdir()
        _populate(root, socket, verify_key)
        if not confined:
            restorer = _Restorer()
            restorers.append(restorer)
            for name in ("edged-model",):
                restorer.place(root / "modules" / name, MODULES / name)
            for relative in ("scripts/Download_Enter_50_edged-model", "scripts/version",
                             "edged-model.conf"):
                restorer.place(root / "etc" / relative, ETC / relative)
            # Read when an artifact has depends (all do: the device type); a host's own
            # artifact_info is kept as it is.
            info = ETC / "artifact_info"
            if not info.exists():
                restorer.place(root / "etc" / "artifact_info", info)
            base = info.read_text().partition("artifact_name=")[2].splitlines()[0].strip()
            return Mender(root, confined, base)
        restorers.append(_Restorer())
        return Mender(root, confined)

    try:
        yield make
    finally:
        for restorer in restorers:
            restorer.restore()


def mender_keys(folder: Path) -> tuple[Path, Path]:
    """An ECDSA P-256 key pair in the traditional PEM forms mender-artifact signs with and
    mender verifies with: (private, public)."""
    private, public = folder / "mender.key", folder / "mender.pub"
    subprocess.run(["openssl", "ecparam", "-genkey", "-name", "prime256v1", "-noout", "-out",
                    str(private)], check=True, capture_output=True)
    subprocess.run(["openssl", "ec", "-in", str(private), "-pubout", "-out", str(public)],
                   check=True, capture_output=True)
    return private, public
