"""Demo assets for `make run` and the stream tests: the `colors` and `grid_det` model
repository and two videos written by OpenCV. `colors.avi`: solid red, green and blue frames in
turn, with a moving square so it is plainly video (the classifier's answer for each frame can be
checked by eye or by test). `crossing.avi`: coloured squares crossing the frame one grid cell a
frame (the cell grid_det boxes), for the events demo: objects tracked across the frame, into a
zone and over a line, one of them hidden for a frame on its way."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

COLORS_BGR = {"red": (0, 0, 255), "green": (0, 255, 0), "blue": (255, 0, 0)}
ORDER = ("red", "green", "blue")


def color_of(frame_index: int, frames_per_color: int) -> str:
    return ORDER[(frame_index // frames_per_color) % len(ORDER)]


def write_color_video(path: Path, *, fps: float = 30.0, frames_per_color: int = 30,
                      cycles: int = 1, size: tuple[int, int] = (320, 240)) -> Path:
    """An MJPG .avi (OpenCV's built-in writer: no codec libraries needed)."""
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    width, height = size
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), fps, (width, height))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {path}")
    try:
        total = frames_per_color * len(ORDER) * cycles
        for i in range(total):
            frame = np.empty((height, width, 3), np.uint8)
            frame[:] = COLORS_BGR[color_of(i, frames_per_color)]
            x = (i * 4) % max(1, width - 40)
            frame[height // 2 - 20:height // 2 + 20, x:x + 40] = 128  # grey: no colour wins
            writer.write(frame)
    finally:
        writer.release()
    return path


@dataclass(frozen=True)
class Pass:
    """A square of `colour` crossing row `row` of grid_det's 4x4 grid, one cell a frame,
    left to right (or `leftwards`), absent from the frames of the steps in `hidden`."""

    colour: str
    row: int
    leftwards: bool = False
    hidden: tuple[int, ...] = ()

    def cells(self) -> list[int]:
        return [3, 2, 1, 0] if self.leftwards else [0, 1, 2, 3]


CELLS = 4  # grid_det's grid is 4x4 cells
# The demo: red left to right on row 1, hidden on its third step (it keeps its id); blue
# right to left on row 2; green left to right on row 2.
DEMO_PASSES = (Pass("red", 1, hidden=(2,)), Pass("blue", 2, leftwards=True), Pass("green", 2))


def write_crossing_video(path: Path, passes: Sequence[Pass] = DEMO_PASSES, *,
                         fps: float = 4.0, cell: int = 64, lead_frames: int = 2,
                         gap_frames: int = 8) -> Path:
    """An MJPG .avi of `passes` one after the other on black, each followed by `gap_frames`
    empty frames (longer than track.max_age_s at `fps`, so each object ends before the next
    starts), after `lead_frames` empty ones. Frames are `4 * cell` pixels square."""
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    side = CELLS * cell
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), fps, (side, side))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {path}")
    black = np.zeros((side, side, 3), np.uint8)
    try:
        for _ in range(lead_frames):
            writer.write(black)
        for crossing in passes:
            for step, column in enumerate(crossing.cells()):
                frame = black.copy()
                if step not in crossing.hidden:
                    x, y = column * cell, crossing.row * cell
                    frame[y:y + cell, x:x + cell] = COLORS_BGR[crossing.colour]
                writer.write(frame)
            for _ in range(gap_frames):
                writer.write(black)
    finally:
        writer.release()
    return path


def write_ota_update(out_dir: Path) -> Path:
    """The next version of the demo's `colors` model, ready for `edged ota push`: its
    model.onnx and an unsigned manifest (`push --key` fills in the artifact and signs it) in
    `<out_dir>/ota/`. The version is one above the newest in `<out_dir>/models/colors/`, so
    each push is a new version. Returns the manifest's path."""
    import json

    from tools.assets import models as test_models

    versions = [int(p.name) for p in (out_dir / "models" / "colors").iterdir()
                if p.name.isdigit()]
    version = max(versions, default=0) + 1
    folder = out_dir / "ota"
    test_models.write_model(test_models.make_colors(), folder / "model.onnx")
    manifest = {"model": "colors", "version": version, "format": "onnx", "artifact": {},
                "note": "the demo classifier, published again as a new version"}
    path = folder / "manifest.json"
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir", type=Path, help="where models/, colors.avi and "
                                                   "crossing.avi go")
    parser.add_argument("--ota-update", action="store_true",
                        help="write the next version of the demo model and its manifest "
                             "into OUT_DIR/ota/ instead")
    args = parser.parse_args(argv)
    if args.ota_update:
        print(write_ota_update(args.out_dir))
        return 0
    from tools.assets import models as test_models

    test_models.write_repository(args.out_dir / "models", names=["colors", "grid_det"])
    print(write_color_video(args.out_dir / "colors.avi"))
    print(write_crossing_video(args.out_dir / "crossing.avi"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
