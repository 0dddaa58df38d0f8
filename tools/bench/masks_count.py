"""Instructions per frame of the mask paths, counted by valgrind's callgrind (`python -m
tools.bench masks` runs this module under `valgrind --tool=callgrind --instr-atstart=no`):
CPU time on the shared 2-core VMs moves 2x with the other sessions' load, the instruction
count of the same work does not. The process switches counting on around N frames of one path
(`callgrind_control -i on`), then off and dumps; an empty span counted the same way (the
control calls themselves) is taken off. Every thread of the process is counted (OpenBLAS's and
OpenCV's too), in user space."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from edged.tasks.rle import encode
from edged.tasks.segment import mask_polygons
from tools.bench import masks_reference
from tools.bench.masks import FRAME, kept


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True,
                   capture_output=True, timeout=120)


def _span(name: str, work: Callable[[], object], frames: int) -> None:
    _control("-i", "on")
    for _ in range(frames):
        work()
    _control("-i", "off")
    _control("-d", name)


def main(frames: int) -> None:
    protos, coefficients, boxes, points = kept()
    polygons = mask_polygons(protos, coefficients, boxes, FRAME, 0.5, points)
    width, height = FRAME.frame_size
    paths: dict[str, Callable[[], object]] = {
        "empty": lambda: None,
        "before": lambda: masks_reference.mask_polygons(protos, coefficients, boxes, FRAME, 0.5,
                                                        points),
        "now": lambda: mask_polygons(protos, coefficients, boxes, FRAME, 0.5, points),
        "rle_before": lambda: [masks_reference.rle_encode(p, height, width) for p in polygons],
        "rle_now": lambda: [encode(p, height, width) for p in polygons],
    }
    for name, work in paths.items():
        work()  # warm: first calls allocate and load
        _span(name, work, 1 if name.startswith("rle") else frames)


def totals(out: Path) -> dict[str, int]:
    """Each dump's total instructions by its name (`callgrind_control -d NAME`)."""
    found: dict[str, int] = {}
    for dump in sorted(out.parent.glob(out.name + ".*")):
        name, total = None, None
        for line in dump.read_text(errors="replace").splitlines():
            if line.startswith("desc: Trigger: dump "):
                name = line.removeprefix("desc: Trigger: dump ").strip()
            elif line.startswith("totals:"):
                total = int(line.split()[1])
        if name is not None and total is not None:
            found[name] = total
    return found


def count(workdir: Path, frames: int) -> dict[str, float]:
    """Instructions per frame: the per-object path (before), the one-pass path (now), and RLE
    of the frame's 20 polygons before and now; an empty span's count taken off each."""
    out = workdir / "masks-callgrind.out"
    subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                    f"--callgrind-out-file={out}", sys.executable, "-m", "tools.bench.masks_count",
                    str(frames)], check=True, capture_output=True, timeout=900,
                   cwd=Path(__file__).resolve().parents[2])
    found = totals(out)
    empty = found["empty"]
    return {"frames": frames,
            **{name: round((found[name] - empty) / (1 if name.startswith("rle") else frames))
               for name in ("before", "now", "rle_before", "rle_now")}}


if __name__ == "__main__":
    main(int(sys.argv[1]))
    print(json.dumps({"done": True}))
