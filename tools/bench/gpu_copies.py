"""Host-to-device bandwidth through edged's own buffers (`edged.hardware.memory`), in GB/s: a pinned
pool buffer copied async to its device mirror (the discrete-GPU path), the same bytes from
plain pageable numpy memory (what a backend copies when a batch is not in a pool), device to
host into pinned memory (outputs), and the copy engine reading mapped (zero-copy) host memory
through its device address, each the median of several copies of one size on one stream.

Then what the CUDA EP pays to read an input where edged's pools put it: a model that sums its
input (one pass over every byte) bound by IOBinding to the bytes in device memory (the floor),
in mapped host memory (read in place: the Jetson path; over PCIe on a discrete GPU), in a
pinned buffer copied to its mirror first (the discrete-GPU path: `device_inputs`), and handed
to ORT as plain numpy (ORT's own copy)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from edged.hardware import gpu, memory


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
            "pinned_over_pageable": rows["pinned_h2d"] / rows["pageable_h2d"],
            "cuda_ep_reads": cuda_ep_reads(size_mb, repeats)}


def sum_model(count: int) -> bytes:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)], "sum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [count])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def cuda_ep_reads(size_mb: int, repeats: int) -> dict[str, Any]:
    """Milliseconds (median) and effective GB/s of one CUDA EP run reading `size_mb` of input
    from each place; every run's sum is checked against numpy's."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return {"skipped": "this onnxruntime is the CPU build (install the `gpu` extra)"}
    cudart = gpu.runtime()
    count = (size_mb << 20) // 4
    nbytes = count * 4
    session = ort.InferenceSession(sum_model(count), providers=["CUDAExecutionProvider"])
    if session.get_providers()[0] != "CUDAExecutionProvider":
        return {"skipped": f"the CUDA EP did not start: {session.get_providers()}"}
    data = np.random.default_rng(0).random(count, dtype=np.float32)
    want = float(data.astype(np.float64).sum())
    mapped, pinned = memory.allocate("mapped", nbytes), memory.allocate("pinned", nbytes)
    device = gpu.call(cudart.cudaMalloc, nbytes)
    for buffer in (mapped, pinned):
        buffer.view((count,), np.dtype(np.float32))[:] = data
    gpu.call(cudart.cudaMemcpy, device, data.ctypes.data, nbytes,
             cudart.cudaMemcpyKind.cudaMemcpyHostToDevice)

    def bound(address: int, copy: Callable[[], None] | None = None) -> float:
        if copy is not None:
            copy()
            gpu.synchronize(0)
        binding = session.io_binding()
        binding.bind_input("x", "cuda", 0, np.float32, [count], address)
        binding.bind_output("y", "cpu")
        session.run_with_iobinding(binding)
        return float(binding.copy_outputs_to_cpu()[0])

    cases: dict[str, Callable[[], float]] = {
        "device": lambda: bound(device),
        "mapped": lambda: bound(mapped.address()),
        "pinned_copy": lambda: bound(pinned.address(), lambda: pinned.to_device(0)),
        "numpy": lambda: float(session.run(["y"], {"x": data})[0]),
    }
    rows: dict[str, Any] = {}
    try:
        for name, run in cases.items():
            got = run()  # warm, and the answer
            seconds = []
            for _ in range(repeats):
                started = time.perf_counter()
                run()
                seconds.append(time.perf_counter() - started)
            median = statistics.median(seconds)
            rows[name] = {"ms": median * 1e3, "gb_per_s": nbytes / median / 1e9,
                          "sum_ok": abs(got - want) <= 1e-3 * abs(want)}
    finally:
        gpu.call(cudart.cudaFree, device)
        mapped.free()
        pinned.free()
    return {"size_mb": size_mb, **rows}
