"""edged's CUDA calls against the real cuda-python (13, the `gpu` extra; 12, JetPack 6), which
installs without a GPU and answers every call with cudaErrorInsufficientDriver: every name the
code uses exists; each call edged makes (recorded on the double while edged's memory and
stream code runs) is replayed on the real module with the same arguments, which must convert,
and must return a tuple as long as the double's; the double's flags, enums and struct fields
are the real ones."""

from __future__ import annotations

import enum
from typing import Any

import numpy as np
import pytest
from callsites import CUDA_FILES, TOOLS, chains
from doubles import fake_cudart
from doubles.fake_cudart import DISCRETE, JETSON, FakeCudart, Props
from realmods import TARGETS, install, probe

from edged.backends.onnxruntime import device_inputs
from edged.hardware import gpu, memory

CUDA = [t for t in TARGETS if t.library == "cuda"]


def encode(arg: Any) -> Any:
    if isinstance(arg, enum.Enum):
        return {"enum": type(arg).__name__, "member": arg.name}
    if isinstance(arg, fake_cudart.cudaMemLocation):
        return {"struct": "cudaMemLocation",
                "fields": {"type": encode(arg.type), "id": arg.id}}
    assert isinstance(arg, int) and not isinstance(arg, bool), f"cannot replay {arg!r}"
    return int(arg)


def replay_problems(calls: list[tuple[str, Any, int]], real: list[dict[str, Any]]
                    ) -> list[str]:
    """Where the real module disagrees with the double on a replayed call."""
    problems = []
    for (name, _args, length), answer in zip(calls, real, strict=True):
        if "raised" in answer:
            problems.append(f"{name}: the real call refuses edged's arguments: {answer}")
        elif answer["len"] != length:
            problems.append(f"{name}: the real one returns {answer['len']} items, the double "
                            f"{length}")
        elif answer["error"] != "cudaErrorInsufficientDriver":  # it reached the runtime
            problems.append(f"{name}: {answer['error']}")
    return problems


def exercise(monkeypatch: pytest.MonkeyPatch, props: Props, api: int) -> FakeCudart:
    """edged's memory and stream code on the double, every buffer kind and path."""
    fake = fake_cudart.install(monkeypatch, FakeCudart(props, api=api))
    assert gpu.device() is not None
    stream = gpu.create_stream()
    for kind in ("mapped", "managed", "pinned"):
        pool = memory.DeviceBufferPool(4, kind)
        batch = pool.concatenate("x", [np.ones((2, 8), np.float32)])
        buffer, offset = memory.locate(batch) or (None, 0)
        assert buffer is not None
        buffer.to_device(stream, offset, batch.nbytes)
        buffer.attach(stream)
        buffer.to_host(stream, offset, batch.nbytes)
        if kind == "managed":
            buffer.detach(stream)
        gpu.synchronize(stream)
        if kind != "managed":
            device_inputs({"x": batch})
        pool.close()
    gpu.destroy_stream(stream)
    return fake


@pytest.mark.parametrize("target", CUDA, ids=[t.name for t in CUDA])
def test_every_cuda_call_edged_makes_fits_the_real_cuda_python(
        target: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = install(target)
    api = 13 if target.name.endswith("13") else 12
    recorded: list[tuple[str, tuple[Any, ...], int]] = []
    for props in (JETSON, DISCRETE):
        recorded += exercise(monkeypatch, props, api).returns
    used = chains(CUDA_FILES, {"cudart"}, True)
    tools = chains(TOOLS, {"cudart"}, True)
    double = fake_cudart.FakeCudart().module()
    constants = [n for n in dir(double) if n.startswith("cuda") and
                 isinstance(getattr(double, n), int)]
    enums = [f"{n}.{m}" for n in dir(double) if isinstance(getattr(double, n), enum.EnumMeta)
             for m in getattr(double, n).__members__]
    unique = {repr((name, [encode(a) for a in args], n)): (name, [encode(a) for a in args], n)
              for name, args, n in recorded}
    calls = [unique[key] for key in sorted(unique)]
    answer = probe(target, folder, None, {
        "names": sorted({*used, *tools, *constants, *enums}),
        "structs": {"cudaDeviceProp": list(Props.__dataclass_fields__),
                    "cudaMemLocation": ["type", "id"]},
        "calls": [[name, args] for name, args, _n in calls]})

    missing = {n: used.get(n, tools.get(n)) for n, kind in answer["names"].items()
               if kind is None and (n in used or n in tools)}
    assert not missing, f"not in cuda-python {answer['version']}: {missing}"
    functions = {n for n in used if answer["names"][n] == "function"}
    assert functions <= {name for name, _a, _n in recorded}, \
        "a CUDA call in edged that the scenario never makes (extend exercise())"
    wrong = {n: (getattr(double, n.split(".")[0]) if "." not in n else
                 getattr(getattr(double, n.split(".")[0]), n.split(".")[1]), v)
             for n, v in answer["values"].items() if n in constants or n in enums}
    assert not {n: v for n, v in wrong.items() if int(v[0]) != v[1]}, \
        "the double's constants differ from the real ones"
    assert answer["structs"] == {"cudaDeviceProp": [], "cudaMemLocation": []}
    assert not replay_problems(calls, answer["calls"])
    names = {name for name, *_ in calls}
    assert {"cudaStreamAttachMemAsync", "cudaMemPrefetchAsync", "cudaMemcpyAsync"} <= names


def test_the_double_refuses_what_the_real_runtime_refuses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The rules the doubles enforce, each broken once: a CPU write to managed memory attached
    to a busy stream, a GPU read of host-attached managed memory, a copy read before its
    stream is synchronized, and an unaligned or foreign attach."""
    fake = fake_cudart.install(monkeypatch, FakeCudart(JETSON))
    cudart = gpu.runtime()
    stream = gpu.create_stream()
    ptr = gpu.call(cudart.cudaMallocManaged, 512, cudart.cudaMemAttachHost)
    assert ptr % fake_cudart.ALIGNMENT == 0
    assert fake.gpu_access(ptr, stream) is not None  # host-attached: the GPU may not read it
    gpu.call(cudart.cudaStreamAttachMemAsync, stream, ptr, 0, cudart.cudaMemAttachSingle)
    assert fake.gpu_access(ptr, stream) is None
    fake.launch(stream)
    with pytest.raises(fake_cudart.Fault):
        fake.cpu_access(ptr)
    gpu.synchronize(stream)
    fake.cpu_access(ptr)  # idle stream: allowed
    with pytest.raises(gpu.CudaError, match="InvalidValue"):
        gpu.call(cudart.cudaStreamAttachMemAsync, stream, ptr + 16, 0,
                 cudart.cudaMemAttachSingle)
    with pytest.raises(gpu.CudaError, match="InvalidValue"):
        gpu.call(cudart.cudaStreamAttachMemAsync, 0, ptr, 0, cudart.cudaMemAttachSingle)
    host = np.arange(4, dtype=np.float32)
    device = gpu.call(cudart.cudaMalloc, host.nbytes)
    back = np.zeros_like(host)
    for kind, dst, src in ((cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, device,
                            host.ctypes.data),
                           (cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, back.ctypes.data,
                            device)):
        gpu.call(cudart.cudaMemcpyAsync, dst, src, host.nbytes, kind, stream)
    assert not back.any()  # nothing arrives before the stream is synchronized
    gpu.synchronize(stream)
    np.testing.assert_array_equal(back, host)


def test_a_double_returning_another_tuple_or_taking_other_arguments_fails_the_replay() -> None:
    real = [{"name": "cudaMalloc", "len": 2, "error": "cudaErrorInsufficientDriver"},
            {"name": "cudaMemPrefetchAsync", "raised": "TypeError: an int was expected"}]
    calls = [("cudaMalloc", [16], 1), ("cudaMemPrefetchAsync", [1, 2, 3, 4], 1)]
    assert [p.split(":")[0] for p in replay_problems(calls, real)] == [
        "cudaMalloc", "cudaMemPrefetchAsync"]
    assert not replay_problems([("cudaMalloc", [16], 2)], real[:1])
