"""The face gallery on the status page, in Debian's headless Chromium: a daemon with faces on
streams a face no one is enrolled as (an unknown group keeps its aligned crop) and has Ana
enrolled through the API; the page's Faces panel lists Ana with her count and the unknown
group with its kept face (a loaded 112 x 112 PNG), asks only this origin, shows no vector,
and a daemon without faces shows no panel."""

from __future__ import annotations

import json
from pathlib import Path

from integration.test_faces import (
    FACES,
    GALLERY,
    PRELOAD,
    astronaut,
    coffee,
    enrol,
    picture,
    png,
    stream,
    write_video,
)
from support.browser import Browser
from support.daemon import ServeFactory

from tools.assets.faces import write_face_models


def test_status_page_when_faces_are_on_lists_names_and_unknown_groups_with_their_faces(
        make_served: ServeFactory, repo_dir: Path, tmp_path: Path, browser: Browser) -> None:
    write_face_models(repo_dir)
    video = write_video(tmp_path / "door.avi", picture((coffee(), 380, 150, 180)))
    served = make_served(cache=PRELOAD, faces=FACES, streams=stream(video))
    with served.client() as client:
        status, entry = enrol(client, "Ana", png(picture((astronaut(), 40, 60, 240))))
        assert status == 201, entry
    origin = f"http://{served.http}"
    page = browser.page(origin + "/")
    names = page.wait_for(
        "(() => { const rows = [...document.querySelectorAll('#gallery-names tr[data-name]')]"
        ".map(r => [r.dataset.name, r.children[1].textContent]);"
        " return rows.length > 0 && rows; })()", timeout=60, what="the enrolled names")
    assert names == [["Ana", "1"]]
    crop = page.wait_for(
        "(() => { const img = [...document.querySelectorAll('#gallery-groups .group img.crop')]"
        ".find(i => i.complete && i.naturalWidth > 0);"
        " return img && [img.getAttribute('src'), img.naturalWidth, img.naturalHeight,"
        " img.closest('.group').dataset.group]; })()",
        timeout=60, what="an unknown group with its kept face")
    src, width, height, group = crop
    assert src.startswith(f"{GALLERY}/sightings/") and src.endswith("/crop")
    assert (width, height) == (112, 112)
    with served.client() as client:
        listed = client.request("GET", f"{GALLERY}/groups")
        assert int(group) in [g["group"] for g in json.loads(listed[2])["groups"]]
        _status, headers, _body = client.request("GET", src)
        assert headers["Cross-Origin-Resource-Policy"] == "same-origin"
        assert headers["Cache-Control"] == "no-store"
    summary = page.evaluate("document.getElementById('gallery-summary').textContent")
    assert summary.startswith("1 of 10000 faces enrolled"), summary
    text = page.evaluate("document.getElementById('gallery').innerText")
    assert "0." not in text.replace("10000", "")  # names, counts, groups: no vector values
    urls = {r["request"]["url"] for r in page.requests}
    assert not {u for u in urls if not (u.startswith(origin + "/") or u.startswith("data:"))}
    assert page.console == [], page.console


def test_status_page_when_faces_are_off_shows_no_gallery(
        make_served: ServeFactory, browser: Browser) -> None:
    served = make_served()
    origin = f"http://{served.http}"
    page = browser.page(origin + "/")
    page.wait_for("document.getElementById('health').textContent !== 'connecting…'",
                  what="the first status report")
    assert page.evaluate("document.getElementById('gallery').hidden") is True
    assert not any("/galleries/" in r["request"]["url"] for r in page.requests)
