"""Host-to-device bandwidth through edged's own buffers (`edged.memory`), in GB/s: a pinned
pool buffer copied async to its device mirror (the discrete-GPU path), the same bytes from
plain pageable numpy memory (what a backend copies when a batch is not in a pool), device to
host into pinned memory (outputs), and the GPU reading mapped (zero-copy) host memory in place
(the Jetson path; on a discrete GPU every such read crosses PCIe), each the median of several
copies of one size on one stream."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from edged import gpu, memory


def bandwidths(size_mb: int = 64, repeats: int = 10) -> dict[str, Any]:
    cudart = gpu.runtime()
    nbytes = size_mb << 20
    kinds = cudart.cudaMemcpyKind
    stream = gpu.create_stream()
    pinned = memory.allocate("pinned", nbytes)
    mapped = memory.allocate("mapped", nbytes)
    device = gpu.call(cudart.cudaMalloc, nbytes)
    pageable = np.ones(nbytes, np.uint8)
    pinned.host[:] = 1
    mapped.host[:] = 1

    def timed(copy: Callable[[], None]) -> float:
        copy()  # first touch, mirror allocation
        gpu.synchronize(stream)
        seconds = []
        for _ in range(repeats):
            started = time.perf_counter()
            copy()
            gpu.synchronize(stream)
            seconds.append(time.perf_counter() - started)
        return nbytes / statistics.median(seconds) / 1e9

    try:
        rows = {
            "pinned_h2d": timed(lambda: pinned.to_device(stream)),
            "pageable_h2d": timed(lambda: gpu.call(
                cudart.cudaMemcpyAsync, device, pageable.ctypes.data, nbytes,
                kinds.cudaMemcpyHostToDevice, stream)),
            "pinned_d2h": timed(lambda: pinned.to_host(stream)),
            # The copy engine reads the mapped pages through their device address: what a
            # kernel reading a zero-copy input pays per byte.
            "mapped_read": timed(lambda: gpu.call(
                cudart.cudaMemcpyAsync, device, mapped.address(), nbytes,
                kinds.cudaMemcpyDeviceToDevice, stream)),
        }
    finally:
        gpu.call(cudart.cudaFree, device)
        pinned.free()
        mapped.free()
        gpu.destroy_stream(stream)
    return {"size_mb": size_mb, "repeats": repeats, "gb_per_s": rows,
            "pinned_over_pageable": rows["pinned_h2d"] / rows["pageable_h2d"]}
