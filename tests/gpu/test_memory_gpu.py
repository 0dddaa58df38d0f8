"""On a machine with an NVIDIA GPU and cuda-python: each kind of pool buffer really reaches the
device. A batch written through the numpy view is made coherent on a stream, copied on the
device into scratch memory and back, and must come back unchanged. Skipped, with the reason
printed, everywhere else."""

from __future__ import annotations

import numpy as np
import pytest

from edged.hardware import gpu, memory


def _device() -> gpu.Device:
    pytest.importorskip("cuda.bindings.runtime", reason="cuda-python is not installed")
    device = gpu.device()
    if device is None:
        pytest.skip(f"no usable CUDA device: {gpu.unavailable_reason()}")
    return device


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["mapped", "managed", "pinned"])
def test_pool_buffer_when_gpu_present_reaches_the_device_and_back(kind: str) -> None:
    device = _device()
    if kind == "mapped" and not device.can_map_host_memory:
        pytest.skip(f"{device.name} cannot map host memory")
    if kind == "managed" and not device.managed_memory:
        pytest.skip(f"{device.name} has no managed memory")
    cudart = gpu.runtime()
    pool = memory.DeviceBufferPool(4, kind)
    parts = [np.full((1, 3, 8, 8), i, np.float32) for i in range(4)]
    batch = pool.concatenate("x", parts)
    found = memory.locate(batch)
    assert found is not None
    buffer, offset = found
    stream = gpu.create_stream()
    scratch = gpu.call(cudart.cudaMalloc, batch.nbytes)
    back = np.zeros_like(batch)
    try:
        buffer.to_device(stream, offset, batch.nbytes)
        gpu.call(cudart.cudaMemcpyAsync, scratch, buffer.address() + offset, batch.nbytes,
                 cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice, stream)
        gpu.call(cudart.cudaMemcpyAsync, back.ctypes.data, scratch, batch.nbytes,
                 cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream)
        gpu.synchronize(stream)
    finally:
        gpu.call(cudart.cudaFree, scratch)
        gpu.destroy_stream(stream)
        pool.close()
    np.testing.assert_array_equal(back, np.concatenate(parts))


@pytest.mark.gpu
def test_resolve_when_gpu_present_picks_by_the_device() -> None:
    device = _device()
    expected = "mapped" if device.integrated and device.can_map_host_memory else "pinned"
    assert memory.resolve("auto") == expected
