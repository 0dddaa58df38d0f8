"""A segment stream's masks on the status page, in Debian's headless Chromium as the page test
looks at boxes: the daemon serves the exporter-faithful YOLO-seg export on a looping video of a
green ellipse, and the stream's live view on the page shows the ellipse tinted with its
label's colour (pixels of the screenshot), the dark background around it untouched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from support.browser import Browser, Page
from support.daemon import ServeFactory
from support.demo import image
from support.polling import wait_until

from edged.processing.draw import MASK_FILL_ALPHA, colour_of
from tools.assets import tasks as task_models

SIZE = (160, 120)
GREEN = np.array([0, 255, 0])


def ellipse_video(path: Path) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, SIZE)
    assert writer.isOpened()
    try:
        for _ in range(20):
            frame = np.zeros((SIZE[1], SIZE[0], 3), np.uint8)
            cv2.ellipse(frame, (70, 60), (40, 28), 20, 0, 360, (0, 255, 0), -1)
            writer.write(frame)
    finally:
        writer.release()
    return path


def live_view(page: Page) -> np.ndarray:
    where = json.loads(page.evaluate(
        "JSON.stringify(document.querySelector('[data-stream=\"cam\"] img.live')"
        ".getBoundingClientRect())"))
    shot = image(page.screenshot(full_page=False))
    scale = page.evaluate("window.devicePixelRatio") or 1
    return shot[round(where["top"] * scale):round(where["bottom"] * scale),
                round(where["left"] * scale):round(where["right"] * scale)]


def tinted(page: Page) -> Any:
    """The live view (in a list) when its ellipse shows the mask's tint, else None."""
    view = live_view(page)
    if view.size == 0:
        return None
    height, width = view.shape[:2]
    centre = view[round(height * 60 / SIZE[1]), round(width * 70 / SIZE[0])].astype(int)
    mixed = MASK_FILL_ALPHA * np.array(colour_of("bicycle")) + (1 - MASK_FILL_ALPHA) * GREEN
    return [view] if np.abs(centre - mixed).max() < 45 else None


def test_status_page_when_a_segment_stream_runs_shows_its_mask_on_the_live_view(
        make_served: ServeFactory, repo_dir: Path, tmp_path: Path, browser: Browser) -> None:
    task_models.write_task_models(repo_dir, ["seg_yolo"])
    video = ellipse_video(tmp_path / "ellipse.avi")
    served = make_served(cache="preload: [seg_yolo]",
                         streams=f"[{{name: cam, source: 'file://{video}', model: seg_yolo, "
                                 "loop: true, publish: {frames: true}}]")
    page = browser.page(f"http://{served.http}/")
    page.wait_for("document.querySelector('[data-stream=\"cam\"] img.live')?.naturalWidth",
                  what="the segment stream's live view showing frames")
    [view] = wait_until(lambda: tinted(page), timeout=60, interval=0.2,
                        what="the ellipse tinted by its mask in the live view")
    height, width = view.shape[:2]
    corner = view[round(height * 0.9), round(width * 0.95)].astype(int)
    assert corner.max() < 40, corner  # the dark background: no tint outside the mask
    assert page.console == [], page.console
