"""The demo as `make run` runs it, served in-process: deploy/edged.yaml's streams (`demo`: the
colour classifier; `crossing`: squares through grid_det, its zone and its line) on videos
tools/assets/demo.py writes, with the loopback HTTP listener; and plain HTTP helpers for it."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml

from support.daemon import Served, ServeFactory
from tools.assets import models as test_models
from tools.assets.demo import write_color_video, write_crossing_video

DEPLOY = Path(__file__).parents[2] / "deploy" / "edged.yaml"


def demo_streams(tmp_path: Path) -> list[dict[str, Any]]:
    """deploy/edged.yaml's streams, on videos written here."""
    videos = {"demo": write_color_video(tmp_path / "colors.avi"),
              "crossing": write_crossing_video(tmp_path / "crossing.avi")}
    streams = yaml.safe_load(DEPLOY.read_text())["streams"]
    for stream in streams:
        stream["source"] = f"file://{videos[stream['name']]}"
    return streams


def serve_demo(make_served: ServeFactory, tmp_path: Path, api: str = "") -> Served:
    """The demo's models (only they, as `make run` has) and streams, device edge-01."""
    models = test_models.write_repository(tmp_path / "demo-models",
                                               names=["colors", "grid_det"])
    streams = json.dumps(demo_streams(tmp_path))  # JSON is YAML
    served = make_served(cache="preload: [colors, grid_det]", streams=streams, api=api,
                         models_dir=models, device_id="edge-01")
    running = sorted(p.cfg.name for p in served.daemon.pipelines)
    assert running == ["crossing", "demo"], f"the demo's streams did not start: {running}"
    return served


def get(address: str, path: str, headers: dict[str, str] | None = None,
        method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        answer = conn.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        conn.close()


def get_json(address: str, path: str) -> Any:
    status, _, body = get(address, path)
    assert status == 200, (path, status, body[:300])
    return json.loads(body)


def image(data: bytes) -> np.ndarray:
    picture = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert picture is not None, f"not an image: {data[:40]!r}"
    return picture


SQUARE_COLOURS = {"red": (0, 0, 255), "green": (0, 255, 0), "blue": (255, 0, 0)}


def find_square(picture: np.ndarray) -> tuple[str, tuple[int, int, int, int]] | None:
    """The demo's coloured square in a picture: its colour and its box (x1, y1, x2, y2), or
    None when none is in it. A square is a solid blob of one colour at least 16x16, about as
    high as wide (what else is drawn in that colour, a line or a label, is not)."""
    for label, colour in SQUARE_COLOURS.items():
        mask = np.all(np.abs(picture.astype(int) - np.array(colour)) < 45, axis=2)
        count, _, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), 4)
        for x, y, width, height, area in stats[1:count]:
            if min(width, height) >= 16 and 0.8 <= width / height <= 1.25 \
                    and area >= 0.8 * width * height:
                return label, (int(x), int(y), int(x + width), int(y + height))
    return None


@pytest.fixture
def demo(make_served: ServeFactory, tmp_path: Path) -> Served:
    return serve_demo(make_served, tmp_path)
