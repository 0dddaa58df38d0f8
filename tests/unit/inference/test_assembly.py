"""Assembling a batch's inputs (issue 41 #5): a client's shared memory, mapped, is read from
its file wherever the bytes are copied anyway (a pooled batch buffer, the buffer a GPU session
would copy into), so a client that truncates its object meets a short read for its own
request, not a SIGBUS for the daemon. The truncation here happens in this process, whose
mapping is never read after it: only pread touches the file."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from edged.hardware import filemaps
from edged.hardware.memory import HostBufferPool
from edged.inference.assembly import assemble
from edged.inference.batching import Request

CPU = SimpleNamespace(providers=["CPUExecutionProvider"])
GPU = SimpleNamespace(providers=["CUDAExecutionProvider", "CPUExecutionProvider"])


class Mapped:
    """A file mapped read-only and tracked as a client's region is, with arrays viewing it."""

    def __init__(self, path: Path, data: np.ndarray) -> None:
        self.path = path
        path.write_bytes(data.tobytes())
        self.fd = os.open(path, os.O_RDWR)
        self.mapping = mmap.mmap(self.fd, data.nbytes, mmap.MAP_SHARED, mmap.PROT_READ)
        address = np.frombuffer(self.mapping, np.uint8).ctypes.data
        self.range = filemaps.track(address, data.nbytes, self.fd, 0, "frames")
        self.shape, self.dtype = data.shape, data.dtype

    def view(self) -> np.ndarray:
        return np.frombuffer(self.mapping, self.dtype).reshape(self.shape)

    def close(self) -> None:
        filemaps.untrack(self.range)
        os.close(self.fd)


@pytest.fixture
def mapped(tmp_path: Path) -> Iterator[Mapped]:
    data = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    made = Mapped(tmp_path / "frames", data)
    try:
        yield made
    finally:
        made.close()


def request(x: np.ndarray) -> Request:
    return Request({"x": x}, x.shape[0], (x.shape[1:],), 1, None, 0.0)


def test_assemble_when_a_cpu_session_takes_a_batch_of_one_hands_the_view_over(
        mapped: Mapped) -> None:
    view = mapped.view()
    kept, inputs, dropped = assemble([request(view)], HostBufferPool(8), None, CPU)
    assert inputs["x"] is view and len(kept) == 1 and not dropped  # the only copy: not made


def test_assemble_when_a_gpu_session_takes_a_mapped_batch_of_one_reads_it_into_the_pool(
        mapped: Mapped) -> None:
    view = mapped.view()
    kept, inputs, dropped = assemble([request(view)], HostBufferPool(8), None, GPU)
    assert inputs["x"].ctypes.data != view.ctypes.data and len(kept) == 1 and not dropped
    np.testing.assert_array_equal(inputs["x"], np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    plain = np.ones((1, 3, 4), np.float32)  # not file-backed: a GPU session copies it itself
    assert assemble([request(plain)], HostBufferPool(8), None, GPU)[1]["x"] is plain


def test_assemble_when_a_mapped_object_has_shrunk_drops_that_request_and_runs_the_rest(
        mapped: Mapped) -> None:
    view = mapped.view()
    others = [np.full((1, 3, 4), 7, np.float32), np.full((1, 3, 4), 9, np.float32)]
    os.truncate(mapped.path, 0)  # the client shrinks it while its request waits
    batch = [request(others[0]), request(view), request(others[1])]
    kept, inputs, dropped = assemble(batch, HostBufferPool(8), None, CPU)
    assert kept == [batch[0], batch[2]]
    assert [(r, type(e)) for r, e in dropped] == [(batch[1], filemaps.SourceShrunk)]
    assert "has shrunk" in str(dropped[0][1])
    np.testing.assert_array_equal(inputs["x"], np.concatenate(others))


def test_assemble_when_a_fixed_batch_pads_a_mapped_request_reads_it_from_the_file(
        mapped: Mapped) -> None:
    view = mapped.view()[:1]
    batch, inputs, dropped = assemble([request(view)], None, 4, CPU)
    assert inputs["x"].shape == (4, 3, 4) and not dropped
    np.testing.assert_array_equal(inputs["x"][:1], view)
    assert not inputs["x"][1:].any()
    os.truncate(mapped.path, 0)
    batch, inputs, dropped = assemble([request(view)], None, 4, CPU)
    assert batch == [] and len(dropped) == 1


def test_untrack_when_the_region_closes_forgets_it_and_closes_its_descriptor(
        mapped: Mapped) -> None:
    view = mapped.view()
    entry = mapped.range
    assert filemaps.file_backed(view)
    filemaps.untrack(entry)
    with pytest.raises(OSError):
        os.fstat(entry.fd)  # its own duplicate, closed with it
    assert not filemaps.file_backed(view)
    out = np.empty_like(view)
    filemaps.copy_into(out, view)  # an untracked view is copied as any array is
    np.testing.assert_array_equal(out, view)
    mapped.range = filemaps.track(0, 0, mapped.fd, 0, "none")  # for the fixture's untrack
