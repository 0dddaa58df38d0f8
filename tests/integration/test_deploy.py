"""deploy/: the systemd units pass `systemd-analyze verify`, and install.sh lays out, keeps,
re-runs without changes and removes a whole installation under a temporary root (--root).

install.sh runs from a copy of the source tree, so edits made while the tests run do not
look like changes. pip installs edged with --no-deps (its dependencies are the test
environment's business, not the layout's) but builds it with setuptools and wheel from the
configured index, as `make setup` does: a fresh venv's own setuptools cannot build a wheel
without the `wheel` package, so --no-build-isolation is not an option."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from edged.config import load_config

REPO = Path(__file__).resolve().parents[2]
PIP_ARGS = "--no-deps"
ANALYZE = shutil.which("systemd-analyze")
HOST_UNITS = next((Path(p) for p in ("/usr/lib/systemd/system", "/lib/systemd/system")
                   if Path(p, "sysinit.target").exists()), None)
KILL = next((Path(p) for p in ("/bin/kill", "/usr/bin/kill") if Path(p).exists()), None)

needs_analyze = pytest.mark.skipif(
    ANALYZE is None or HOST_UNITS is None or KILL is None,
    reason="systemd-analyze, the host's systemd units or /bin/kill are missing "
           "(Debian: apt-get install systemd procps)")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What install.sh installs: a copy of the tree it lives in."""
    tree = tmp_path_factory.mktemp("source")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, tree / name)
    for name in ("edged", "deploy", "tools"):
        shutil.copytree(REPO / name, tree / name, ignore=ignore)
    return tree


def install(source: Path, root: Path, *args: str, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(source / "deploy/install.sh"), "--root", str(root), "--flavor", "cpu",
         "--no-demo", "--pip-args", PIP_ARGS, *args],
        capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def pristine(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One first install (a venv and a pip build: the slow part), copied for each test."""
    root = tmp_path_factory.mktemp("pristine")
    started = time.monotonic()
    result = install(source, root)
    (root.parent / "first-run.txt").write_text(
        f"{time.monotonic() - started:.1f} s\n{result.stdout}{result.stderr}")
    return root


@pytest.fixture
def root(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "root"
    # cp -a keeps owners and modes, as they are after an install (shutil.copytree does not).
    subprocess.run(["cp", "-a", str(pristine), str(copy)], check=True)
    return copy


def snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """Every path under root: type, mode, owner, and content digest or link target. Nothing
    is left out: a run that finds edged up to date does not touch the venv."""
    entries: dict[str, tuple[object, ...]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            detail: object = os.readlink(path)
        elif stat.S_ISREG(info.st_mode):
            detail = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            detail = None
        entries[str(path.relative_to(root))] = (stat.filemode(info.st_mode), info.st_uid,
                                                info.st_gid, detail)
    return entries


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def verify(root: Path) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze verify --root=ROOT` on the units as installed in ROOT, with ROOT's
    venv as ExecStart. It resolves every unit and executable inside ROOT, so the host's own
    units (sysinit.target, modprobe@.service, ...) and /bin/kill (ExecReload) are copied in,
    as a real system has them. It needs no running systemd."""
    assert ANALYZE is not None and HOST_UNITS is not None and KILL is not None
    shutil.copytree(HOST_UNITS, root / HOST_UNITS.relative_to("/"), symlinks=True,
                    dirs_exist_ok=True)
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(KILL, root / "usr/bin/kill")
    if not (root / "bin").exists():
        (root / "bin").symlink_to("usr/bin")
    return subprocess.run([ANALYZE, "verify", f"--root={root}", "edged.service",
                           "edged.socket"], capture_output=True, text=True, timeout=60)


def about_edged(result: subprocess.CompletedProcess[str]) -> list[str]:
    """verify exits 0 on unknown keys and bad values and only prints them: any line about
    our units or drop-ins is a failure."""
    return [line for line in (result.stdout + result.stderr).splitlines() if "edged" in line]


def directives(path: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


@needs_analyze
def test_units_when_verified_under_installed_root_report_nothing(source: Path,
                                                                 root: Path) -> None:
    # With a credential, and both flavors' drop-ins at once: every file edged ships.
    secret = root.parent / "password"
    secret.write_text("s3cret\n")
    install(source, root, "--mqtt-password-file", str(secret))
    for flavor in ("dgpu", "jetson"):
        shutil.copy2(source / f"deploy/edged.service.d/{flavor}.conf",
                     root / f"etc/systemd/system/edged.service.d/{flavor}.conf")
    result = verify(root)
    assert result.returncode == 0 and not about_edged(result), result.stdout + result.stderr


@needs_analyze
def test_units_when_a_directive_is_wrong_verify_reports_it(root: Path) -> None:
    unit = root / "etc/systemd/system/edged.service"
    unit.write_text(unit.read_text().replace("DevicePolicy=closed",
                                             "DevicePolicy=closed\nDeviceAllow=nvidia rw"))
    assert any("Invalid device node path 'nvidia'" in line for line in about_edged(verify(root)))


@pytest.mark.slow
def test_install_when_fresh_root_lays_out_the_service(source: Path, pristine: Path) -> None:
    deploy = source / "deploy"
    venv = pristine / "opt/edged/venv"
    assert os.access(venv / "bin/edged", os.X_OK)
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    for installed, shipped in [("etc/edged/edged.yaml", "edged.yaml"),
                               ("etc/edged/edged.yaml.dist", "edged.yaml"),
                               ("etc/systemd/system/edged.service", "edged.service"),
                               ("etc/systemd/system/edged.socket", "edged.socket"),
                               ("usr/lib/sysusers.d/edged.conf", "edged.sysusers.conf")]:
        assert (pristine / installed).read_bytes() == (deploy / shipped).read_bytes(), installed
        assert mode(pristine / installed) == 0o644
    assert mode(pristine / "etc/edged/credentials") == 0o700
    for state in ("var/lib/edged", "var/lib/edged/models", "var/cache/edged"):
        assert mode(pristine / state) == 0o750
    # cpu, no credentials: no drop-in.
    assert not (pristine / "etc/systemd/system/edged.service.d").exists()
    if shutil.which("systemd-sysusers") and os.geteuid() == 0:  # else left to the target
        user = next(line.split(":") for line in (pristine / "etc/passwd").read_text().splitlines()
                    if line.startswith("edged:"))
        assert user[5] == "/var/lib/edged"
        groups = (pristine / "etc/group").read_text().splitlines()
        for group in ("video", "render"):
            assert any(line.startswith(f"{group}:") and "edged" in line.split(":")[3]
                       for line in groups), group
    print((pristine.parent / "first-run.txt").read_text().splitlines()[0], "for a first run")


@pytest.mark.slow
def test_install_when_run_again_changes_nothing(source: Path, root: Path) -> None:
    before = snapshot(root)
    started = time.monotonic()
    result = install(source, root)
    print(f"second run: {time.monotonic() - started:.1f} s")
    assert snapshot(root) == before
    assert "nothing changed" in result.stdout


@pytest.mark.slow
def test_install_when_config_was_edited_keeps_the_edit(source: Path, root: Path) -> None:
    config = root / "etc/edged/edged.yaml"
    edited = config.read_text().replace("device_id: edge-01", "device_id: door-cam")
    config.write_text(edited)
    (root / "etc/edged/edged.yaml.dist").write_text("# an older release's default\n")
    result = install(source, root)
    assert config.read_text() == edited
    assert (root / "etc/edged/edged.yaml.dist").read_bytes() == \
        (source / "deploy/edged.yaml").read_bytes()
    assert "kept /etc/edged/edged.yaml" in result.stdout


@pytest.mark.slow
def test_install_when_credentials_given_loads_each_as_a_credential(source: Path,
                                                                    root: Path) -> None:
    password, key = root.parent / "pw.txt", root.parent / "ota-release.pub"
    password.write_text("s3cret\n")
    key.write_text("-----BEGIN PUBLIC KEY-----\n")
    install(source, root, "--mqtt-password-file", str(password), "--ota-key", str(key))
    credentials = root / "etc/edged/credentials"
    assert (credentials / "mqtt-password").read_text() == "s3cret\n"
    assert (credentials / "ota-release.pub").read_bytes() == key.read_bytes()
    assert mode(credentials / "mqtt-password") == mode(credentials / "ota-release.pub") == 0o600
    dropin = root / "etc/systemd/system/edged.service.d/credentials.conf"
    assert directives(dropin)["LoadCredential"] == [
        "mqtt-password:/etc/edged/credentials/mqtt-password",
        "ota-release.pub:/etc/edged/credentials/ota-release.pub"]
    # A later run without the options keeps them.
    before = snapshot(root)
    assert "nothing changed" in install(source, root).stdout
    assert snapshot(root) == before


@pytest.mark.slow
def test_install_when_uninstalled_keeps_config_and_state(source: Path, root: Path) -> None:
    (root / "var/lib/edged/models/colors").mkdir()
    install(source, root, "--uninstall")
    for gone in ("etc/systemd/system/edged.service", "etc/systemd/system/edged.socket",
                 "opt/edged", "usr/lib/sysusers.d/edged.conf"):
        assert not (root / gone).exists(), gone
    for kept in ("etc/edged/edged.yaml", "var/lib/edged/models/colors", "var/cache/edged"):
        assert (root / kept).exists(), kept
    install(source, root, "--uninstall", "--purge")
    for gone in ("etc/edged", "var/lib/edged", "var/cache/edged"):
        assert not (root / gone).exists(), gone


@pytest.mark.slow
def test_install_when_mender_asked_adds_the_update_module_and_uninstall_removes_it(
        source: Path, root: Path) -> None:
    module = root / "usr/share/mender/modules/v3/edged-model"
    guard = root / "etc/mender/scripts/Download_Enter_50_edged-model"
    assert not module.exists()  # auto: no mender client under this root
    install(source, root, "--mender", "yes")
    assert module.read_bytes() == (source / "deploy/mender/edged-model").read_bytes()
    assert guard.read_bytes() == (source / "deploy/mender/Download_Enter_50_edged-model"
                                  ).read_bytes()
    assert mode(module) == mode(guard) == 0o755
    assert (guard.parent / "version").read_text() == "3\n"
    install(source, root, "--uninstall")
    assert not module.exists() and not guard.exists()


@pytest.mark.slow
def test_install_when_flavor_jetson_sees_jetpack_and_adds_its_devices(source: Path,
                                                                     root: Path) -> None:
    install(source, root, "--flavor", "jetson")
    # JetPack's TensorRT and OpenCV (with GStreamer) live in the system's site-packages.
    assert "include-system-site-packages = true" in \
        (root / "opt/edged/venv/pyvenv.cfg").read_text()
    dropins = root / "etc/systemd/system/edged.service.d"
    assert [p.name for p in dropins.iterdir()] == ["jetson.conf"]
    assert (dropins / "jetson.conf").read_bytes() == \
        (source / "deploy/edged.service.d/jetson.conf").read_bytes()


@pytest.mark.parametrize(("probes", "expected"), [
    ({"EDGED_TEGRA_RELEASE": "# R36 (release), REVISION: 4.0"}, "jetson"),
    ({"EDGED_DT_COMPATIBLE": "nvidia,p3768-0000+p3767-0005\0nvidia,tegra234\0"}, "jetson"),
    ({"EDGED_NVIDIA_DEVICE": ""}, "dgpu"),
    ({}, "cpu"),
], ids=["tegra-release", "device-tree", "nvidia0", "nothing"])
def test_install_when_flavor_auto_detects_the_hardware(source: Path, tmp_path: Path,
                                                       probes: dict[str, str],
                                                       expected: str) -> None:
    env = dict(os.environ, EDGED_NVIDIA_SMI="edged-test-no-such-command")
    for name in ("EDGED_TEGRA_RELEASE", "EDGED_DT_COMPATIBLE", "EDGED_NVIDIA_DEVICE"):
        env[name] = str(tmp_path / name)  # absent unless this case writes it
        if name in probes:
            Path(env[name]).write_text(probes[name])
    result = subprocess.run([str(source / "deploy/install.sh"), "--detect"],
                            capture_output=True, text=True, env=env, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"install.sh: flavor: {expected} (")


def test_default_config_when_loaded_agrees_with_the_units() -> None:
    deploy = REPO / "deploy"
    config = load_config(deploy / "edged.yaml")
    service = directives(deploy / "edged.service")
    socket = directives(deploy / "edged.socket")
    assert service["ExecStart"] == ["/opt/edged/venv/bin/edged run --config /etc/edged/edged.yaml"]
    assert service["ConfigurationDirectory"] == ["edged"]
    assert socket["ListenStream"] == [str(config.api.socket)]
    assert config.api.socket.parent == Path("/run") / service["RuntimeDirectory"][0]
    assert socket["FileDescriptorName"] == ["api"]  # the name the daemon looks for
    state = Path("/var/lib") / service["StateDirectory"][0]
    assert config.models_dir.is_relative_to(state)
    assert config.streams[0].source.startswith(f"file://{state}/")
    assert config.cache.dir == Path("/var/cache") / service["CacheDirectory"][0]


def test_install_script_when_shellchecked_is_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    result = subprocess.run([shellcheck, str(REPO / "deploy/install.sh"),
                             str(REPO / "deploy/mender/Download_Enter_50_edged-model")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout


def test_service_when_started_allows_more_descriptors_than_the_api_holds_connections() -> None:
    config = load_config(REPO / "deploy" / "edged.yaml")
    limit = int(directives(REPO / "deploy" / "edged.service")["LimitNOFILE"][0])
    # Connections are capped below the limit, with room for models, cameras and regions.
    assert config.api.max_connections + 1024 <= limit
