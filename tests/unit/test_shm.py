"""System shared memory regions: real POSIX shm objects, mapped once, bounds-checked, unmapped
on unregister (later if a request still views them), and hostile keys refused."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest

from edged.api.protocol import ShmRef
from edged.api.shm import ShmRegistry
from edged.errors import InvalidInput


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


def test_shm_unregister_when_a_view_is_still_held_unmaps_after_it_is_gone(
        registry: ShmRegistry, segment: shared_memory.SharedMemory) -> None:
    region = registry.register("r", segment.name, 0, 64)
    view = np.frombuffer(registry.read(ShmRef("r", 0, 16)), np.float32)  # a request in flight
    registry.unregister("r")
    assert registry.status() == [] and not region.mapping.closed
    with pytest.raises(InvalidInput, match="not registered"):
        registry.read(ShmRef("r", 0, 16))
    del view
    gc.collect()
    registry.unregister(None)  # any later call retries the deferred unmap
    assert region.mapping.closed


def test_shm_unregister_all_when_several_registered_unmaps_them(
        registry: ShmRegistry, segment: shared_memory.SharedMemory) -> None:
    regions = [registry.register(f"r{i}", segment.name, i * 64, 64) for i in range(3)]
    registry.unregister()
    assert registry.status() == [] and all(r.mapping.closed for r in regions)
    with pytest.raises(InvalidInput, match="not registered"):
        registry.unregister("r0")
