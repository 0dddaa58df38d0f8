"""A plate's own picture on the status page, in Debian's headless Chromium: a plate stream
reads the alpr picture's two plates; each ended object's card shows the plate's text and its
picture (`/v2/edged/snapshots/<id>/plate`, loaded, wider than tall), asking only this origin."""

from __future__ import annotations

from pathlib import Path

import cv2
from integration.test_plates_states import write_clip
from support.browser import Browser
from support.daemon import ServeFactory
from unit.tasks.test_plates import plate_repository

from tools.real_models import member


def test_status_page_when_a_plate_is_read_shows_its_picture_on_the_objects_card(
        make_served: ServeFactory, repo_dir: Path, tmp_path: Path, browser: Browser) -> None:
    plate_repository(repo_dir)
    clip = write_clip(tmp_path / "cars.avi", [cv2.imread(str(member("alpr_plates.jpg")))] * 6)
    served = make_served(
        cache="preload: [plate_det, plate_rec]",
        streams=f"[{{name: drive, source: 'file://{clip}', model: plate_det, "
                "backpressure: block, track: {min_hits: 2, update_interval_s: 0}, "
                "secondary: [{model: plate_rec, as: text}], lpr: {enabled: true}}]")
    origin = f"http://{served.http}"
    page = browser.page(origin + "/")
    shown = page.wait_for(
        "(() => { const cards = [...document.querySelectorAll('#events .event')]"
        ".map(c => [c.dataset.id, c.querySelector('.platetext')?.textContent,"
        " c.querySelector('img.platepicture')]).filter(([, text, img]) =>"
        " text && img && img.complete && img.naturalWidth > 0);"
        " return cards.length >= 2 && cards.map(([id, text, img]) =>"
        " [id, text, img.getAttribute('src'), img.naturalWidth, img.naturalHeight]); })()",
        timeout=90, what="two objects' cards with their plate's picture")
    assert "MLB803" in [text for _id, text, *_ in shown]
    for object_id, _text, src, width, height in shown:
        assert src.startswith(f"/v2/edged/snapshots/{object_id}/plate?")
        assert width > 2 * height  # the plate, not the frame
    urls = {r["request"]["url"] for r in page.requests}
    assert not {u for u in urls if not (u.startswith(origin + "/") or u.startswith("data:"))}
    assert page.console == [], page.console
