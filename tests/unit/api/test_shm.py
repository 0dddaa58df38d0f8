"""System shared memory regions: real POSIX shm objects, opened once, bounds-checked, closed on
unregister (after the use in flight), hostile keys, strangers and shrunk objects refused."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edged.api import shm as shm_module
from edged.api.protocol import ShmRef
from edged.api.shm import Peer, ShmRegistry
from edged.core.errors import Forbidden, InvalidInput


@pytest.fixture
def segment() -> Iterator[shared_memory.SharedMemory]:
    shm = shared_memory.SharedMemory(create=True, size=4096)
    try:
        yield shm
    finally:
        shm.close()
        shm.unlink()


@pytest.fixture
def registry() -> Iterator[ShmRegistry]:
    reg = ShmRegistry()
    yield reg
    reg.close()


def test_shm_when_registered_reads_and_writes_through_the_mapping(
        registry: ShmRegistry, segment: shared_memory.SharedMemory) -> None:
    np.ndarray((4,), np.float32, segment.buf, offset=1024)[:] = [1, 2, 3, 4]
    registry.register("frames", "/" + segment.name, 1024, 2048)
    assert registry.status() == [{"name": "frames", "key": "/" + segment.name,
                                  "offset": 1024, "byte_size": 2048}]
    view = registry.read(ShmRef("frames", 0, 16))
    np.testing.assert_array_equal(np.frombuffer(view, np.float32), [1, 2, 3, 4])
    del view
    registry.write(ShmRef("frames", 64, 8), np.array([7, 8], np.float32))
    np.testing.assert_array_equal(np.ndarray((2,), np.float32, segment.buf, offset=1088), [7, 8])


@pytest.mark.parametrize(("key", "message"), [
    ("/../etc/passwd", "not a plain shm name"),
    ("a/b", "not a plain shm name"),
    ("..", "not a plain shm name"),
    ("/edged-no-such-segment", "cannot be opened"),
])
def test_shm_register_when_key_is_hostile_or_missing_refuses(registry: ShmRegistry, key: str,
                                                             message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        registry.register("r", key, 0, 16)
    assert registry.status() == []


def test_shm_register_when_key_is_a_symlink_refuses_it(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"x" * 64)
    os.symlink(tmp_path / "secret", tmp_path / "planted")
    registry = ShmRegistry(shm_dir=tmp_path)
    with pytest.raises(InvalidInput, match="cannot be opened"):
        registry.register("r", "/planted", 0, 16)


def test_shm_register_when_region_exceeds_the_object_or_name_is_taken_refuses(
        registry: ShmRegistry, segment: shared_memory.SharedMemory) -> None:
    with pytest.raises(InvalidInput, match="exceeds the 4096 bytes"):
        registry.register("r", segment.name, 4000, 200)
    registry.register("r", segment.name, 0, 100)
    with pytest.raises(InvalidInput, match="already registered"):
        registry.register("r", segment.name, 0, 100)


def test_shm_use_when_out_of_bounds_or_unknown_refuses(
        registry: ShmRegistry, segment: shared_memory.SharedMemory) -> None:
    registry.register("r", segment.name, 100, 100)
    with pytest.raises(InvalidInput, match="outside region 'r'"):
        registry.read(ShmRef("r", 90, 20))
    with pytest.raises(InvalidInput, match="does not fit"):
        registry.write(ShmRef("r", 0, 8), np.zeros(4, np.float32))
    with pytest.raises(InvalidInput, match="'nope' is not registered"):
        registry.read(ShmRef("nope", 0, 1))


def fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_shm_unregister_when_a_request_holds_it_keeps_it_listed_and_usable_until_the_last_ends(
        registry: ShmRegistry, segment: shared_memory.SharedMemory) -> None:
    region = registry.register("r", segment.name, 0, 64)
    lease = registry.lease()  # a request: its input read, its output not written yet
    lease.read(ShmRef("r", 0, 16))
    registry.unregister("r")
    # As in Triton: still listed, still the request's, and another's while one holds it.
    assert [r["name"] for r in registry.status()] == ["r"] and fd_open(region.fd)
    late = registry.lease()
    assert bytes(late.read(ShmRef("r", 0, 16))) == bytes(segment.buf[:16])
    late.release()
    assert fd_open(region.fd)  # the first request still holds it
    with pytest.raises(InvalidInput, match="being unregistered"):
        registry.register("r", segment.name, 0, 64)
    assert lease.write(ShmRef("r", 16, 8), np.array([1.5, 2.5], np.float32)) == 8
    np.testing.assert_array_equal(np.frombuffer(segment.buf[16:24], np.float32), [1.5, 2.5])
    lease.release()
    assert registry.status() == [] and not fd_open(region.fd)
    with pytest.raises(InvalidInput, match="not registered"):
        registry.read(ShmRef("r", 0, 16))
    registry.register("r", segment.name, 0, 64)  # the name is free again


def test_shm_lease_when_two_requests_hold_a_region_closes_after_the_last(
        registry: ShmRegistry, segment: shared_memory.SharedMemory) -> None:
    region = registry.register("r", segment.name, 0, 64)
    first, second = registry.lease(), registry.lease()
    first.hold(ShmRef("r", 0, 8))
    second.hold(ShmRef("r", 8, 8))
    second.hold(ShmRef("r", 16, 8))  # held once per request, however often it is named
    registry.unregister()
    first.release()
    assert [r["name"] for r in registry.status()] == ["r"] and fd_open(region.fd)
    second.release()
    second.release()  # twice: nothing more to let go
    assert registry.status() == [] and not fd_open(region.fd)


def test_shm_write_when_output_is_bytes_writes_triton_length_prefixed_elements(
        registry: ShmRegistry, segment: shared_memory.SharedMemory) -> None:
    registry.register("r", segment.name, 0, 64)
    values = np.array([b"ab", b"", b"\xff\x00"], dtype=np.object_)
    assert registry.write(ShmRef("r", 4, 60), values) == 4 * 3 + 4
    assert bytes(segment.buf[4:20]) == b"\x02\x00\x00\x00ab\x00\x00\x00\x00" \
        b"\x02\x00\x00\x00\xff\x00"
    with pytest.raises(InvalidInput, match="16 bytes does not fit the 8"):
        registry.write(ShmRef("r", 0, 8), values)


def test_shm_unregister_all_when_several_registered_closes_them(
        registry: ShmRegistry, segment: shared_memory.SharedMemory) -> None:
    regions = [registry.register(f"r{i}", segment.name, i * 64, 64) for i in range(3)]
    registry.unregister()
    assert registry.status() == [] and not any(fd_open(r.fd) for r in regions)
    registry.unregister("r0")  # unknown now: nothing to do, no error (as Triton)


def test_shm_when_the_client_shrinks_its_object_fails_the_use_not_the_daemon(
        registry: ShmRegistry, segment: shared_memory.SharedMemory) -> None:
    registry.register("r", segment.name, 0, 4096)
    os.truncate(Path("/dev/shm") / segment.name, 0)  # what a hostile client can do any time
    with pytest.raises(InvalidInput, match="shrunk"):
        registry.read(ShmRef("r", 1024, 64))
    with pytest.raises(InvalidInput, match="shrunk"):
        registry.write(ShmRef("r", 1024, 64), np.zeros(4, np.float32))
    assert os.stat(Path("/dev/shm") / segment.name).st_size == 0  # not grown behind its back


def test_shm_register_when_peer_could_not_open_the_object_refuses(
        registry: ShmRegistry, segment: shared_memory.SharedMemory) -> None:
    path = Path("/dev/shm") / segment.name
    os.chmod(path, 0o600)
    owner = os.stat(path).st_uid
    stranger = Peer(owner + 1000, frozenset({12345}))
    with pytest.raises(Forbidden, match="may not use it"):
        registry.register("r", segment.name, 0, 64, stranger)
    os.chmod(path, 0o660)
    group_member = Peer(owner + 1000, frozenset({os.stat(path).st_gid}))
    registry.register("r", segment.name, 0, 64, group_member)
    registry.register("r2", segment.name, 0, 64, Peer(owner))


def test_shm_register_when_too_many_regions_refuses(
        segment: shared_memory.SharedMemory) -> None:
    registry = ShmRegistry(max_regions=2)
    for i in range(2):
        registry.register(f"r{i}", segment.name, 0, 64)
    with pytest.raises(InvalidInput, match="2 shared memory regions are registered"):
        registry.register("r2", segment.name, 0, 64)
    registry.close()


def _mapped(segment: shared_memory.SharedMemory) -> int:
    """How many mappings of this shm object the process holds."""
    return Path("/proc/self/maps").read_text().count(segment.name)


def test_shm_read_when_mapped_is_a_view_not_a_copy(
        registry: ShmRegistry, segment: shared_memory.SharedMemory) -> None:
    registry.register("r", segment.name, 4096 - 1024, 1024)  # offset not on a page
    view = registry.read(ShmRef("r", 64, 16))
    segment.buf[4096 - 1024 + 64] = 42  # the client writes after the read: the view sees it
    assert view[0] == 42 and view.readonly
    unaligned = registry.read(ShmRef("r", 65, 16))  # not 64-byte aligned: copied, aligned
    assert np.frombuffer(unaligned, np.uint8).ctypes.data % 64 == 0


def test_shm_read_when_copy_inputs_is_always_copies(segment: shared_memory.SharedMemory) -> None:
    registry = ShmRegistry(copy_inputs="always")
    try:
        registry.register("r", segment.name, 0, 1024)
        assert _mapped(segment) == 1  # only the fixture's own mapping
        view = registry.read(ShmRef("r", 0, 16))
        segment.buf[0] = 42
        assert view[0] == 0
    finally:
        registry.close()


@pytest.mark.parametrize(("uid", "mode", "viewed"), [
    (os.geteuid(), 0o660, True), (0, 0o660, True), (os.geteuid() + 4242, 0o660, False),
    (os.geteuid(), 0o666, False),  # edged's own uid, but every user may shrink the object
])
def test_shm_read_when_auto_lends_views_only_to_peers_that_may_signal_edged(
        segment: shared_memory.SharedMemory, uid: int, mode: int, viewed: bool) -> None:
    path = f"/dev/shm/{segment.name.lstrip('/')}"
    os.chmod(path, mode)
    group = frozenset({os.stat(path).st_gid})  # each peer may use it (by its group)
    registry = ShmRegistry()  # auto
    try:
        registry.register("r", segment.name, 0, 1024, Peer(uid, group))
        view = registry.read(ShmRef("r", 0, 16), Peer(uid, group))
        segment.buf[0] = 42  # after the read: only a view sees it
        assert (view[0] == 42) is viewed
        assert _mapped(segment) == (2 if viewed else 1)
    finally:
        registry.close()


def test_shm_unregister_when_a_view_is_in_flight_unmaps_after_it_goes(
        registry: ShmRegistry, segment: shared_memory.SharedMemory) -> None:
    before = _mapped(segment)
    registry.register("r", segment.name, 0, 1024)
    assert _mapped(segment) == before + 1
    array = np.frombuffer(registry.read(ShmRef("r", 0, 16)), np.float32)  # a request's input
    registry.unregister("r")
    segment.buf[:4] = np.float32(3).tobytes()
    assert array[0] == 3  # still readable: unmapping now would crash the request
    del array
    assert _mapped(segment) == before


def test_shm_register_when_registrations_race_for_the_last_slots_keeps_the_cap(
        segment: shared_memory.SharedMemory, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = ShmRegistry(max_regions=2)
    mapped_before = _mapped(segment)
    racers = 6
    # Every racer passes the first cap check, then waits in os.open until all have: the
    # interleaving that let 129-133 regions in under a cap of 128.
    all_checked = threading.Barrier(racers, timeout=10)
    real_open = shm_module.os.open

    def open_after_all_checked(*args: Any, **kwargs: Any) -> int:
        all_checked.wait()
        return real_open(*args, **kwargs)

    monkeypatch.setattr(shm_module.os, "open", open_after_all_checked)
    outcomes: list[str] = []

    def register(i: int) -> None:
        try:
            registry.register(f"r{i}", segment.name, 0, 64)
            outcomes.append("registered")
        except InvalidInput as exc:
            outcomes.append(str(exc))

    threads = [threading.Thread(target=register, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert outcomes.count("registered") == 2
    assert outcomes.count("2 shared memory regions are registered already; unregister some "
                          "first") == racers - 2
    assert len(registry.status()) == 2
    assert _mapped(segment) == mapped_before + 2  # the refused ones were closed
    registry.close()


def test_shm_regions_when_another_user_asks_are_invisible_unusable_and_kept(
        segment: shared_memory.SharedMemory) -> None:
    os.chmod(f"/dev/shm/{segment.name}", 0o666)  # both users may open the object itself
    registry = ShmRegistry()
    alice, mallory = Peer(1000), Peer(1001)
    registry.register("frames", segment.name, 0, 64, alice)
    ref = ShmRef("frames", 0, 16)
    assert registry.status(peer=mallory) == []
    with pytest.raises(InvalidInput, match="'frames' is not registered"):
        registry.status("frames", mallory)
    with pytest.raises(InvalidInput, match="not registered"):
        registry.read(ref, mallory)  # as a model input
    with pytest.raises(InvalidInput, match="not registered"):
        registry.write(ref, np.zeros(4, np.float32), mallory)  # as an output region
    registry.unregister("frames", mallory)
    registry.unregister(None, mallory)  # "unregister all" is all of one's own
    assert [r["name"] for r in registry.status(peer=alice)] == ["frames"]
    assert bytes(registry.read(ref, alice)) == bytes(segment.buf[:16])
    registry.register("frames", segment.name, 0, 64, mallory)  # names are per user
    assert len(registry.status(peer=alice)) == len(registry.status(peer=mallory)) == 1
    registry.close()


def test_shm_lease_copies_when_the_peer_cannot_be_told_says_so_without_raising() -> None:
    """The server asks before decoding whether a request may copy (to decode it off the loop
    if so); a request that names no region must not fail for want of a peer there."""
    def unknown() -> Peer:
        raise Forbidden("cannot tell which user is asking")

    registry = ShmRegistry()
    assert registry.lease(unknown).copies() is True
    assert registry.lease(lambda: Peer(os.geteuid())).copies() is False
    assert ShmRegistry(copy_inputs="always").lease(lambda: Peer(os.geteuid())).copies() is True
