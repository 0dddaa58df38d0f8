"""The status page in a real browser: Debian's headless Chromium loads it from a daemon running
the demo's streams (deploy/edged.yaml, on videos OpenCV wrote) and the test checks what a
person would see: the models and streams listed, the crossing stream's live view showing the
moving square with a box of its label's colour around it (pixels of the screenshot), an
object's event with its snapshot, no URL of any other site asked for or written in the page,
and the zone and line helper's YAML, pasted into the config, giving the zone and line it drew.

Screenshots go to test-output/browser/ (or $EDGED_TEST_OUTPUT/browser/); the README's is one
of them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.browser import Browser, Page
from support.daemon import Served
from support.demo import DEPLOY, find_square, image
from support.polling import wait_until

from edged.config import parse_config
from edged.events.zones import Lines, Zones
from edged.processing.draw import colour_of

ROOT = Path(__file__).parents[2]


@pytest.fixture
def output(tmp_path: Path) -> Path:
    """Where this test's screenshots are kept after it (tmp_path goes with pytest's)."""
    base = Path(os.environ.get("EDGED_TEST_OUTPUT", ROOT / "test-output"))
    folder = base / "browser"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def rect(page: Page, selector: str) -> dict[str, float]:
    box = page.evaluate(f"JSON.stringify(document.querySelector({json.dumps(selector)})"
                        ".getBoundingClientRect())")
    return dict(json.loads(box))


def boxed_square(page: Page) -> Any:
    """The live view's square and the box around it, from a screenshot of the page: the
    square's label and box when box-coloured pixels surround it, else None."""
    where = rect(page, '[data-stream="crossing"] img.live')
    shot = image(page.screenshot(full_page=False))
    scale = page.evaluate("window.devicePixelRatio") or 1
    x0, y0 = round(where["left"] * scale), round(where["top"] * scale)
    x1, y1 = round(where["right"] * scale), round(where["bottom"] * scale)
    view = shot[y0:y1, x0:x1]
    found = find_square(view)
    if found is None:
        return None
    label, (left, top, right, bottom) = found
    if min(left, top) < 12 or right > view.shape[1] - 12 or bottom > view.shape[0] - 12:
        return None  # at the picture's edge: half its box is cut off
    near = np.all(np.abs(view.astype(int) - np.array(colour_of(label))) <= 70, axis=2)
    side = max(3, (right - left) // 8)
    bands = {"left": near[top:bottom, left - side:left + 2],
             "right": near[top:bottom, right - 2:right + side],
             "top": near[top - side:top + 2, left:right],
             "bottom": near[bottom - 2:bottom + side, left:right]}
    sides = {name: band.any(axis=1 if name in ("left", "right") else 0).mean()
             for name, band in bands.items()}
    return (label, sides) if min(sides.values()) > 0.8 else None


def test_page_when_loaded_in_chromium_shows_models_streams_live_boxes_and_events(
        demo: Served, browser: Browser, output: Path) -> None:
    origin = f"http://{demo.http}"
    page = browser.page(origin + "/")
    models = page.wait_for(
        "(() => { const rows = [...document.querySelectorAll('#models tbody tr')]"
        ".map(r => [r.dataset.model, r.children[1].textContent]);"
        " return rows.filter(r => r[1] === 'READY').length >= 2 && rows; })()",
        what="both models READY in the table")
    assert {name for name, _ in models} >= {"colors:1", "grid_det:1"}
    streams = page.wait_for(
        "(() => { const cards = [...document.querySelectorAll('.card[data-stream]')];"
        " const rows = cards.map(c => [c.dataset.stream, c.querySelector('.state').textContent]);"
        " return rows.length === 2 && rows.every(r => r[1] === 'streaming') && rows; })()",
        what="both streams streaming")
    assert sorted(name for name, _ in streams) == ["crossing", "demo"]
    page.wait_for("document.querySelector('[data-stream=\"crossing\"] img.live').naturalWidth",
                  what="the crossing stream's live view showing frames")
    snapshot = page.wait_for(
        "(() => { const img = [...document.querySelectorAll('#events .event img.snapshot')]"
        ".find(i => i.complete && i.naturalWidth > 0); return img && img.getAttribute('src'); })()",
        timeout=60, what="an event with its snapshot")
    assert snapshot.startswith("/v2/edged/snapshots/")
    page.wait_for("document.querySelector('[data-stream=\"crossing\"] .objects').textContent",
                  what="the crossing stream's objects or last event")
    label, sides = wait_until(lambda: boxed_square(page), timeout=60, interval=0.2,
                              what="the square with its box in the live view")
    assert label in ("red", "green", "blue") and set(sides) == {"left", "right", "top",
                                                                 "bottom"}
    page.screenshot(output / "status-page.png")  # (the README's: a box in its live view)

    urls = {r["request"]["url"] for r in page.requests}
    elsewhere = {u for u in urls if not (u.startswith(origin + "/") or u.startswith("data:"))}
    assert not elsewhere, f"the page asked another site: {elsewhere}"
    assert f"{origin}/v2/edged/status" in urls
    assert any("/live.mjpeg" in u for u in urls)
    written = page.evaluate("[...document.querySelectorAll('[src],[href]')]"
                            ".map(e => e.getAttribute('src') || e.getAttribute('href'))")
    assert all(u.startswith(("/", "data:")) for u in written), written
    assert page.console == [], page.console  # no script error


def test_zone_helper_when_points_are_clicked_gives_yaml_that_makes_that_zone_and_line(
        demo: Served, browser: Browser, output: Path) -> None:
    page = browser.page(f"http://{demo.http}/")
    page.wait_for("!!document.querySelector('[data-stream=\"crossing\"] .foot button')",
                  what="the crossing stream's card")
    page.evaluate("document.querySelector('[data-stream=\"crossing\"] .foot button').click()")
    size = page.wait_for("(() => { const i = document.getElementById('helper-img');"
                         " return i.naturalWidth && [i.naturalWidth, i.naturalHeight]; })()",
                         what="the helper's picture")
    assert size == [256, 256]
    configured = page.evaluate("document.getElementById('helper-yaml').value")
    assert "right" in configured and "middle" in configured  # it starts from the config
    page.evaluate("document.getElementById('helper-clear').click()")

    def click(frame_x: float, frame_y: float) -> None:
        where = rect(page, "#helper-canvas")
        page.click(where["left"] + (frame_x + 0.25) * where["width"] / size[0],
                   where["top"] + (frame_y + 0.25) * where["height"] / size[1])

    zone = [[32, 40], [120, 40], [120, 200], [32, 200]]
    page.evaluate("document.getElementById('helper-name').value = 'door'")
    for x, y in zone:
        click(x, y)
    page.evaluate("document.getElementById('helper-finish').click()")
    page.evaluate("document.querySelector('input[value=\"line\"]').click()")
    page.evaluate("document.getElementById('helper-name').value = 'gate'")
    line = [[200, 250], [200, 10]]
    for x, y in line:
        click(x, y)
    text = page.evaluate("document.getElementById('helper-yaml').value")
    page.screenshot(output / "zone-helper.png", full_page=False)
    assert page.evaluate("document.getElementById('helper-error').textContent") == ""

    # Pasted into deploy/edged.yaml in place of the crossing stream's zones: and lines: (the
    # last keys of the last stream), indented under it: the real config parser takes it ...
    deploy = DEPLOY.read_text().splitlines()
    start = deploy.index("    zones:")
    end = deploy.index("ota:", start)
    pasted = ["    " + row for row in text.splitlines()]
    config = parse_config("\n".join(deploy[:start] + pasted + deploy[end:]) + "\n")
    [stream] = [s for s in config.streams if s.name == "crossing"]
    # ... and gives the zone and the line that were drawn, in frame pixels.
    assert [z.name for z in stream.zones] == ["door"]
    assert np.abs(np.array(stream.zones[0].polygon) - np.array(zone)).max() <= 1
    assert [ln.name for ln in stream.lines] == ["gate"]
    assert np.abs(np.array(stream.lines[0].points) - np.array(line)).max() <= 1
    inside = Zones(stream.zones).inside(np.array([[50.0, 100.0, 90.0, 190.0],
                                                  [150.0, 100.0, 190.0, 190.0]]))
    assert inside[:, 0].tolist() == [True, False]
    lines = Lines(stream.lines)
    state = [lines.new_state()]
    lines.observe(state, np.array([[150.0, 100.0, 190.0, 140.0]]))  # left of the line
    crossed = lines.observe(state, np.array([[210.0, 100.0, 250.0, 140.0]]))  # then right
    assert crossed == [[(0, "in")]], "left to right of p1 -> p2 (drawn upwards) is in"


def test_readme_screenshot_when_present_is_the_page() -> None:
    """The README's picture is a screenshot this test suite takes (copy it after a run:
    test-output/browser/status-page.png -> docs/img/status-page.png)."""
    picture = ROOT / "docs" / "img" / "status-page.png"
    assert picture.exists() and picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "docs/img/status-page.png" in (ROOT / "README.md").read_text()
