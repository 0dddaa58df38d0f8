"""Buffer pools: which memory each machine gets (and the quiet fall back to host memory), the
take()/concatenate() contract over CUDA buffers, and what each kind does to reach the GPU, with
a double of cuda-python's runtime."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
from doubles import fake_cudart
from doubles.fake_cudart import DISCRETE, JETSON, FakeCudart

from edged.hardware import gpu, memory
from edged.hardware.memory import DeviceBufferPool, HostBufferPool, locate, new_pool, resolve


@pytest.fixture
def discrete(monkeypatch: pytest.MonkeyPatch) -> FakeCudart:
    return fake_cudart.install(monkeypatch, FakeCudart(DISCRETE))


@pytest.fixture
def jetson(monkeypatch: pytest.MonkeyPatch) -> FakeCudart:
    return fake_cudart.install(monkeypatch, FakeCudart(JETSON))


def test_resolve_when_driver_missing_falls_back_to_host_with_one_log_line(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    fake_cudart.install(monkeypatch, FakeCudart(driver=False))
    with caplog.at_level(logging.INFO, logger="edged"):
        pools = [new_pool(8, "auto") for _ in range(3)]
    assert all(isinstance(p, HostBufferPool) for p in pools)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "cudaErrorInsufficientDriver" in lines[0], lines


def test_resolve_when_cuda_python_missing_is_host(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cudart.uninstall(monkeypatch)
    assert resolve("auto") == "host"
    assert "cuda-python is not installed" in (gpu.unavailable_reason() or "")


def test_resolve_when_asked_for_cuda_memory_without_cuda_warns_and_uses_host(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    fake_cudart.install(monkeypatch, FakeCudart(props=None))  # a driver, but no device
    with caplog.at_level(logging.WARNING, logger="edged.hardware.memory"):
        assert resolve("mapped") == "host"
    assert "memory: mapped asked for, but there is no CUDA here" in caplog.text


def test_resolve_auto_picks_mapped_on_integrated_and_pinned_on_discrete(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cudart.install(monkeypatch, FakeCudart(JETSON))
    assert resolve("auto") == "mapped"
    fake_cudart.install(monkeypatch, FakeCudart(DISCRETE))
    assert resolve("auto") == "pinned"
    assert resolve("host") == "host" and resolve("managed") == "managed"


def test_resolve_when_device_cannot_map_or_manage_uses_pinned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cudart.install(monkeypatch, FakeCudart(dataclasses.replace(
        DISCRETE, canMapHostMemory=0, managedMemory=0)))
    assert resolve("mapped") == "pinned"
    assert resolve("managed") == "pinned"
    with pytest.raises(ValueError, match="unknown memory strategy"):
        resolve("unified")


@pytest.mark.parametrize("kind", ["mapped", "managed", "pinned"])
def test_device_pool_keeps_the_host_pool_contract(discrete: FakeCudart, kind: str) -> None:
    host, pool = HostBufferPool(4), DeviceBufferPool(4, kind)
    parts = [np.full((1, 3), i, np.float32) for i in range(3)] + [np.ones((2, 3), np.float32)]
    expected = host.concatenate("x", parts)
    batch = pool.concatenate("x", parts)
    np.testing.assert_array_equal(batch, expected)
    assert batch.flags.c_contiguous and batch.shape == (5, 3)
    again = pool.take("x", 2, (3,), np.dtype(np.float32))
    assert again.__array_interface__["data"][0] == batch.__array_interface__["data"][0]
    pool.close()
    host.close()


def test_device_pool_when_tail_or_dtype_changes_frees_the_old_buffer(
        discrete: FakeCudart) -> None:
    pool = DeviceBufferPool(2, "mapped")
    pool.take("x", 2, (3,), np.dtype(np.float32))
    pool.take("x", 2, (4,), np.dtype(np.float32))
    pool.take("x", 2, (4,), np.dtype(np.int64))
    assert discrete.live("mapped") == 1
    pool.close()
    assert discrete.live() == 0


def test_locate_finds_pool_views_and_not_plain_arrays(discrete: FakeCudart) -> None:
    pool = DeviceBufferPool(4, "mapped")
    batch = pool.take("x", 4, (2,), np.dtype(np.float32))
    buffer, offset = locate(batch[2:]) or (None, None)
    assert buffer is not None and buffer.kind == "mapped" and offset == 2 * 2 * 4
    assert buffer.address() == buffer.host_ptr  # mapped: the GPU reads the host pages
    assert locate(np.zeros((4, 2), np.float32)) is None
    assert locate(batch[:, 0]) is None  # not contiguous: cannot be one device range
    pool.close()
    assert locate(batch) is None


def test_pinned_buffer_copies_both_ways_on_the_given_stream(discrete: FakeCudart) -> None:
    buffer = memory.allocate("pinned", 16)
    assert discrete.live("device") == 0  # the device mirror waits for a GPU user
    buffer.view((4,), np.dtype(np.float32))[:] = [1, 2, 3, 4]
    stream = gpu.create_stream()
    buffer.to_device(stream, offset=4, nbytes=8)
    (dst, src, count, kind, on), = discrete.called("cudaMemcpyAsync")
    assert (dst - buffer.address(), src - buffer.host_ptr, count, on) == (4, 4, 8, stream)
    assert kind == fake_cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
    gpu.synchronize(stream)  # asynchronous: the bytes are on the device only after this
    buffer.view((4,), np.dtype(np.float32))[:] = 0
    buffer.to_host(stream)
    assert not buffer.view((4,), np.dtype(np.float32)).any()  # not back before a synchronize
    gpu.synchronize(stream)
    np.testing.assert_array_equal(buffer.view((4,), np.dtype(np.float32)), [0, 2, 3, 0])
    buffer.free()
    assert discrete.live() == 0


def test_managed_buffer_attaches_to_the_stream_where_access_is_not_concurrent(
        jetson: FakeCudart) -> None:
    buffer = memory.allocate("managed", 64)
    assert flags_of(jetson, "cudaMallocManaged") == 2  # cudaMemAttachHost first
    five, six = gpu.create_stream(), gpu.create_stream()
    buffer.to_device(five)
    buffer.to_device(five)  # already attached there: no second call
    buffer.to_device(six)
    assert [(s, flags) for s, _ptr, _len, flags in jetson.called("cudaStreamAttachMemAsync")] \
        == [(five, 4), (six, 4)]  # cudaMemAttachSingle
    assert not jetson.called("cudaMemPrefetchAsync")
    buffer.free()


def test_managed_buffer_prefetches_where_access_is_concurrent(discrete: FakeCudart) -> None:
    buffer = memory.allocate("managed", 64)
    buffer.to_device(stream=5, offset=16, nbytes=32)
    (ptr, count, where, flags, stream), = discrete.called("cudaMemPrefetchAsync")
    assert (ptr - buffer.device_ptr, count, flags, stream) == (16, 32, 0, 5)
    assert where.type == fake_cudart.cudaMemLocationType.cudaMemLocationTypeDevice
    buffer.free()


def test_allocate_when_cuda_refuses_raises_cuda_error_and_leaks_nothing(
        discrete: FakeCudart) -> None:
    discrete.fail.add("cudaHostGetDevicePointer")
    with pytest.raises(gpu.CudaError, match="cudaHostGetDevicePointer"):
        memory.allocate("mapped", 64)
    assert discrete.live() == 0


def flags_of(fake: FakeCudart, call: str) -> int:
    (_size, flags), = fake.called(call)
    return int(flags)


def test_device_pool_when_cuda_refuses_memory_goes_on_in_host_memory(
        discrete: FakeCudart, caplog: pytest.LogCaptureFixture) -> None:
    pool = DeviceBufferPool(4, "pinned")
    discrete.fail.add("cudaHostAlloc")
    batch = pool.concatenate("x", [np.ones((2, 3), np.float32)])
    np.testing.assert_array_equal(batch, np.ones((2, 3)))
    assert locate(batch) is None and "batches use host memory" in caplog.text
    pool.close()


def test_host_pool_when_padding_to_rows_fills_the_rest_with_zero_rows() -> None:
    pool = HostBufferPool(4)
    full = pool.concatenate("x", [np.ones((4, 3), np.float32)])
    padded = pool.concatenate("x", [np.full((1, 3), 2, np.float32),
                                    np.full((1, 3), 3, np.float32)], rows=4)
    # The same buffer, written once: the earlier batch's rows must not show through.
    assert padded.__array_interface__["data"][0] == full.__array_interface__["data"][0]
    np.testing.assert_array_equal(padded, [[2, 2, 2], [3, 3, 3], [0, 0, 0], [0, 0, 0]])


@pytest.mark.parametrize("kind", ["host", "mapped"])
def test_pool_when_batching_strings_stacks_them_in_host_memory_padded_with_empty(
        discrete: FakeCudart, kind: str) -> None:
    # BYTES inputs are Python objects: never placed in (or viewed from) CUDA memory.
    pool = HostBufferPool(4) if kind == "host" else DeviceBufferPool(4, kind)
    parts = [np.array([[b"a", b""]], dtype=np.object_),
             np.array([[b"bc", b"\xff"]], dtype=np.object_)]
    out = pool.concatenate("s", parts, rows=3)
    assert out.dtype == np.object_ and locate(out) is None
    assert out.tolist() == [[b"a", b""], [b"bc", b"\xff"], [b"", b""]]
    pool.close()
