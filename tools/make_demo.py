"""Demo assets for `make run` and the stream tests: the `colors` model repository and a video
(written by OpenCV) whose frames are solid red, green and blue in turn, with a moving square
so it is plainly video. The model's answer for each frame can be checked by eye or by test."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
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
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (width, height))
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


def write_ota_update(out_dir: Path) -> Path:
    """The next version of the demo's `colors` model, ready for `edged ota push`: its
    model.onnx and an unsigned manifest (`push --key` fills in the artifact and signs it) in
    `<out_dir>/ota/`. The version is one above the newest in `<out_dir>/models/colors/`, so
    each push is a new version. Returns the manifest's path."""
    import json

    import make_test_models

    versions = [int(p.name) for p in (out_dir / "models" / "colors").iterdir()
                if p.name.isdigit()]
    version = max(versions, default=0) + 1
    folder = out_dir / "ota"
    make_test_models.write_model(make_test_models.make_colors(), folder / "model.onnx")
    manifest = {"model": "colors", "version": version, "format": "onnx", "artifact": {},
                "note": "the demo classifier, published again as a new version"}
    path = folder / "manifest.json"
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir", type=Path, help="where models/ and colors.avi go")
    parser.add_argument("--ota-update", action="store_true",
                        help="write the next version of the demo model and its manifest "
                             "into OUT_DIR/ota/ instead")
    args = parser.parse_args(argv)
    if args.ota_update:
        print(write_ota_update(args.out_dir))
        return 0
    import make_test_models

    make_test_models.write_repository(args.out_dir / "models", names=["colors"])
    print(write_color_video(args.out_dir / "colors.avi"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
