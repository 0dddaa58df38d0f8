"""Faces end to end, the daemon in-process with a real mosquitto: a YOLOv8-face-shaped detector
finds faces with five landmarks in a video OpenCV wrote (a real face, skimage's astronaut,
pasted on a dark picture), an `as: identity` cascade aligns and embeds them with an
ArcFace-shaped embedder and matches the gallery. Enrolment over the CLI and the socket API,
names on the stream's results, in the events (sub_label, identity) and on
`tracked_object_update` (Frigate's `type: face`); negatives from an event's snapshot; unknown
faces grouped and a group named; every bad enrolment refused with its code; the gallery kept
across a restart; an OTA update of the embedder re-embeds it from the kept crops; an enrolled
name's presence sensor on while the face is in view, off after the delay once it is gone,
removed when the name is deleted."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import cv2
import jsonschema
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from support.broker import Broker, Received, Subscriber, retained_json
from support.daemon import ServeFactory
from support.images import png_of_zeros
from support.ota import fresh
from support.polling import wait_until

from edged.cli import main
from edged.events.presence import token
from edged.ops.client import EdgedClient
from edged.ota.manifest import sign_document
from tools.assets.faces import make_face_embedder, paste_face, write_face_models
from tools.real_models import member

SCHEMAS = Path(__file__).parents[2] / "docs" / "schemas"
EVENT, RESULT, UPDATE = (json.loads((SCHEMAS / name).read_text()) for name in (
    "events.schema.json", "stream-result.schema.json", "tracked-object-update.schema.json"))
SIZE = (640, 480)
FACES = "enabled: true, detector: face_yolo, embedder: face_embedder"
PRELOAD = "preload: [face_yolo, face_embedder]"
GALLERY = "/v2/edged/galleries/faces"


def astronaut() -> np.ndarray:
    return cv2.imread(str(member("astronaut.png")))[20:240, 100:300]  # her face


def coffee() -> np.ndarray:
    return cv2.imread(str(member("coffee.png")))[50:350, 100:400]


def stranger() -> np.ndarray:
    """A face the embedder finds like the astronaut's (about 0.8) but not hers."""
    face = astronaut()
    return cv2.addWeighted(face, 0.7, cv2.resize(coffee(), face.shape[1::-1]), 0.3, 0)


def picture(*faces: tuple[np.ndarray, int, int, int]) -> np.ndarray:
    """Faces pasted at (x, y, size): each within one half (the stand-in detector's)."""
    frame = np.zeros((SIZE[1], SIZE[0], 3), np.uint8)
    for face, x, y, size in faces:
        paste_face(frame, face, x, y, size)
    return frame


def decode(data: bytes) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)


def png(frame: np.ndarray) -> bytes:
    return cv2.imencode(".png", frame)[1].tobytes()


def write_video(path: Path, frame: np.ndarray, frames: int = 12) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, SIZE)
    assert writer.isOpened()
    try:
        for _ in range(frames):
            writer.write(frame)
    finally:
        writer.release()
    return path


def stream(video: Path, extra: str = "") -> str:
    return (f"[{{name: door, source: 'file://{video}', model: face_yolo, fps: 10, loop: true, "
            f"publish: {{frames: true, events: true}}, track: {{min_hits: 1, max_age_s: 30}}, "
            f"secondary: [{{model: face_embedder, labels: [face], as: identity}}]{extra}}}]")


def messages(got: list[Received], topic: str) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in got if m.topic == topic]


def identities(got: list[Received], prefix: str) -> list[dict[str, Any]]:
    return [d["identity"] for m in messages(got, f"{prefix}/streams/door/results")
            for d in m["results"].get("detections", []) if "identity" in d]


def named(prefix: str, name: str | None) -> Callable[[list[Received]], bool]:
    def seen(got: list[Received]) -> bool:
        return any(i["name"] == name for i in identities(got, prefix))
    return seen


def call(client: EdgedClient, method: str, path: str, body: bytes | None = None,
         content_type: str = "application/json") -> tuple[int, dict[str, Any]]:
    status, _, raw = client.request(method, path, body,
                                    {"Content-Type": content_type} if body else None)
    return status, json.loads(raw)


def enrol(client: EdgedClient, name: str, image: bytes, *, negative: bool = False
          ) -> tuple[int, dict[str, Any]]:
    return call(client, "POST", f"{GALLERY}/names/{name}" + ("/negatives" if negative else ""),
                image, "image/png")


@pytest.fixture
def faces_repo(repo_dir: Path) -> Path:
    return write_face_models(repo_dir)


def test_faces_when_enrolled_by_the_cli_a_stream_names_the_face_in_results_and_events(
        broker: Broker, make_served: ServeFactory, faces_repo: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    prefix = "t/faces"
    video = write_video(tmp_path / "door.avi", picture((astronaut(), 380, 150, 180)))
    sub = Subscriber(broker, f"{prefix}/#")
    try:
        served = make_served(cache=PRELOAD, faces=FACES, streams=stream(video),
                             mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}")
        image = tmp_path / "ana.png"
        image.write_bytes(png(picture((astronaut(), 40, 60, 240))))  # another size and place
        assert main(["faces", "add", "Ana", str(image), "--socket", str(served.socket)]) == 0
        entry = json.loads(capsys.readouterr().out)
        assert entry["name"] == "Ana" and entry["embedder"] == "face_embedder:1"
        got = sub.collect(until=lambda got: named(prefix, "Ana")(got) and any(
            u["name"] == "Ana" for u in messages(got, f"{prefix}/tracked_object_update"))
            and any(e["after"]["sub_label"] == "Ana" for e in messages(got, f"{prefix}/events")),
            timeout=60, what="the face named on results, events and tracked_object_update")
    finally:
        sub.close()
    for message in messages(got, f"{prefix}/streams/door/results"):
        jsonschema.validate(message, RESULT)
    known = [d for m in messages(got, f"{prefix}/streams/door/results")
             for d in m["results"]["detections"] if d.get("identity", {}).get("name") == "Ana"]
    assert known and all(d["sub_label"] == "Ana" for d in known)
    assert all(d["identity"]["similarity"] > 0.9 for d in known)
    for event in messages(got, f"{prefix}/events"):
        jsonschema.validate(event, EVENT)
    event = next(e for e in messages(got, f"{prefix}/events") if e["after"]["sub_label"] == "Ana")
    assert event["after"]["identity"]["name"] == "Ana"
    for said in messages(got, f"{prefix}/tracked_object_update"):
        jsonschema.validate(said, UPDATE)
    update = next(u for u in messages(got, f"{prefix}/tracked_object_update") if u["name"])
    assert update["type"] == "face" and update["camera"] == "door"
    assert update["id"] == event["after"]["id"] and update["score"] > 0.9
    # no vector ever went out on MQTT: every JSON message is small (snapshots are JPEGs)
    assert all(len(m.payload) < 4000 for m in got if not m.topic.endswith("/snapshot"))
    # Home Assistant: the stream's last recognised face, retained, and its sensor
    kept = retained_json(broker, f"{prefix}/streams/door/recognized/face")
    assert kept["name"] == "Ana" and kept["id"] == update["id"]
    config = retained_json(broker, "homeassistant/sensor/test_door_recognized_face/config")
    assert config["state_topic"] == f"{prefix}/streams/door/recognized/face"
    assert config["value_template"] == "{{ value_json.name }}"
    assert config["availability_topic"] == f"{prefix}/status"



def test_faces_when_a_look_alike_is_marked_not_x_from_its_snapshot_stops_being_x(
        broker: Broker, make_served: ServeFactory, faces_repo: Path, tmp_path: Path) -> None:
    prefix = "t/neg"
    video = write_video(tmp_path / "door.avi", picture((stranger(), 100, 120, 200)))
    sub = Subscriber(broker, f"{prefix}/#")
    try:
        served = make_served(cache=PRELOAD, faces=f"{FACES}, match_threshold: 0.6",
                             streams=stream(video, ", snapshots: {crop: false, draw_box: false}"),
                             mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}")
        with served.client() as client:
            assert enrol(client, "Ana", png(picture((astronaut(), 60, 100, 220))))[0] == 201
            got = sub.collect(until=named(prefix, "Ana"), timeout=60,
                              what="the look-alike taken for Ana")
            object_id = next(e["after"]["id"] for e in messages(got, f"{prefix}/events")
                             if e["after"]["has_snapshot"]) if any(
                e["after"]["has_snapshot"] for e in messages(got, f"{prefix}/events")) else None
            if object_id is None:
                got += sub.collect(f"{prefix}/events", until=lambda g: any(
                    e["after"]["has_snapshot"] for e in messages(g, f"{prefix}/events")),
                    timeout=60, what="a snapshot of the look-alike")
                object_id = next(e["after"]["id"] for e in messages(got, f"{prefix}/events")
                                 if e["after"]["has_snapshot"])
            status, entry = call(client, "POST", f"{GALLERY}/names/Ana/negatives",
                                 json.dumps({"snapshot": object_id}).encode())
            assert status == 201, entry
            assert entry["negative"] is True
            later = sub.collect(f"{prefix}/streams/door/results",
                                until=lambda g: len(identities(g, prefix)) >= 5, timeout=60,
                                what="results after the negative")
            assert all(i["name"] is None for i in identities(later, prefix)[1:])
            # Ana herself is still Ana
            status, listing = call(client, "GET", GALLERY)
            assert listing["names"] == [{"name": "Ana", "entries": 1, "negatives": 1}]
    finally:
        sub.close()


def test_faces_when_an_unknown_face_recurs_groups_it_and_naming_the_group_enrols_it(
        broker: Broker, make_served: ServeFactory, faces_repo: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    prefix = "t/grp"
    video = write_video(tmp_path / "door.avi", picture((astronaut(), 380, 150, 180)))
    sub = Subscriber(broker, f"{prefix}/#")
    try:
        served = make_served(cache=PRELOAD, faces=FACES, streams=stream(video),
                             mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}")
        got = sub.collect(until=lambda g: len(identities(g, prefix)) >= 3, timeout=60,
                          what="unknown faces")
        groups = {i["group"] for i in identities(got, prefix)}
        assert len(groups) == 1 and None not in groups
        assert all(i["name"] is None for i in identities(got, prefix))
        update = messages(got, f"{prefix}/tracked_object_update")[0]
        jsonschema.validate(update, UPDATE)
        assert (update["name"], update["group"]) == (None, next(iter(groups)))
        group = str(next(iter(groups)))
        with served.client() as client:
            listed = call(client, "GET", f"{GALLERY}/groups")[1]
            assert [g["group"] for g in listed["groups"]] == list(groups)
            sightings = call(client, "GET", f"{GALLERY}/groups/{group}")[1]["sightings"]
            assert sightings and sightings[0]["source"] == "stream door"
        # whom the group is, seen before naming it: the aligned face the sighting kept
        saved = tmp_path / "seen.png"
        assert main(["faces", "crop", "--sighting", str(sightings[0]["id"]), "-o", str(saved),
                     "--socket", str(served.socket)]) == 0
        capsys.readouterr()
        assert cv2.imread(str(saved)).shape == (112, 112, 3)
        assert main(["faces", "name-group", group, "Ana", "--socket", str(served.socket)]) == 0
        assert json.loads(capsys.readouterr().out)["enrolled"] >= 1
        sub.collect(until=named(prefix, "Ana"), timeout=60, what="the named group matched")
        assert main(["faces", "list", "--socket", str(served.socket)]) == 0
        listing = capsys.readouterr().out
        assert "Ana: " in listing and "unknown group" not in listing
        assert main(["faces", "name-group", group, "Ana", "--socket", str(served.socket)]) == 1
        assert "identity_not_found" in capsys.readouterr().err
        assert main(["faces", "crop", "--sighting", str(sightings[0]["id"]), "-o",
                     str(saved), "--socket", str(served.socket)]) == 1  # moved to Ana
        assert "identity_not_found" in capsys.readouterr().err
        with served.client() as client:
            [entry] = call(client, "GET", f"{GALLERY}/names/Ana")[1]["entries"][:1]
            status, headers, body = client.request("GET", f"{GALLERY}/entries/{entry['id']}/crop")
            assert status == 200 and headers["Content-Type"] == "image/png"
            assert decode(body).shape == (112, 112, 3)
    finally:
        sub.close()


def test_faces_when_enrolment_is_bad_refuses_with_its_code_and_keeps_serving(
        make_served: ServeFactory, faces_repo: Path) -> None:
    served = make_served(cache=PRELOAD, faces=f"{FACES}, max_entries: 1")
    with served.client() as client:
        cases = [("Ana", png(picture()), 400, "no_face", "no face"),
                 ("Ana", png(picture((astronaut(), 20, 100, 200), (coffee(), 400, 100, 200))),
                  400, "several_faces", "2 faces"),
                 ("Ana", b"\x89PNG\r\n\x1a\nnot really", 400, "image_invalid", "no image"),
                 ("..%2Fetc", png(picture((astronaut(), 20, 100, 200))), 400,
                  "invalid_input", "is not a name")]
        for name, image, status, code, words in cases:
            got_status, answer = enrol(client, name, image)
            assert (got_status, answer["code"]) == (status, code), answer
            assert words in answer["error"]
        assert enrol(client, "Ana", png(picture((astronaut(), 20, 100, 200))))[0] == 201
        status, answer = enrol(client, "Bo", png(picture((coffee(), 20, 100, 200))))
        assert (status, answer["code"]) == (507, "gallery_full")
        assert "at most 1 faces (faces.max_entries)" in answer["error"]
        assert call(client, "GET", GALLERY)[1]["counts"]["entries"] == 1
        assert client.ready()
        faces = client.status()["faces"]
        assert (faces["entries"], faces["max_entries"], faces["names"]) == (1, 1, 1)
        assert faces["embedder"]["embedder"] == "face_embedder:1"
        metrics = client.metrics()
        assert "edged_gallery_faces 1.0" in metrics and "edged_gallery_max_faces 1.0" in metrics
        assert 'edged_faces_identified_total{outcome="known"} 0.0' in metrics


def test_faces_when_restarted_and_the_embedder_is_updated_keeps_and_reembeds_the_gallery(
        make_served: ServeFactory, faces_repo: Path,
        key: tuple[Ed25519PrivateKey, Path]) -> None:
    ota = f"trusted_keys: [{key[1]}], max_artifact_mb: 16"
    first = make_served(cache=PRELOAD, faces=FACES, ota=ota)
    with first.client() as client:
        assert enrol(client, "Ana", png(picture((astronaut(), 40, 60, 240))))[0] == 201
    first.daemon.request_stop()
    assert first.daemon.stopped_event.wait(30)
    served = make_served(cache=PRELOAD, faces=FACES, ota=ota)
    probe = picture((astronaut(), 380, 150, 180))
    faces = served.daemon.faces
    assert faces is not None
    assert faces.identify(probe, faces.find_faces(probe))[0]["name"] == "Ana"  # kept
    data = make_face_embedder(1).SerializeToString()
    doc = {"model": "face_embedder", "version": 2, "format": "onnx",
           "artifact": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()},
           **fresh("local")}
    head = json.dumps(sign_document(doc, key[0])).encode()
    with served.client() as client:
        status, _, raw = client.request(
            "POST", "/v2/edged/ota/install", head + data,
            {"Content-Type": "application/octet-stream", "Edged-Manifest-Length": str(len(head))})
        assert status == 202, raw
        wait_until(lambda: served.daemon.scheduler.model("face_embedder").version == 2,
                   timeout=60, what="embedder version 2 serving")
        # the next use sees the swap and re-embeds from the kept crop
        assert faces.identify(probe, faces.find_faces(probe))[0]["name"] in ("Ana", None)
        def reembedded() -> dict[str, Any] | None:
            state = call(client, "GET", GALLERY)[1]["embedder"]
            return state if not state["reembedding"] and state["stale"] == 0 else None

        state = wait_until(reembedded, timeout=60, what="the gallery re-embedded")
        assert state["embedder"] == "face_embedder:2" and state["reembedded"] >= 1
        found = faces.identify(probe, faces.find_faces(probe))[0]
        assert found["name"] == "Ana" and found["similarity"] > 0.9
        entries = call(client, "GET", f"{GALLERY}/names/Ana")[1]["entries"]
        assert [e["embedder"] for e in entries] == ["face_embedder:2"]


def test_gallery_routes_when_asked_wrongly_answer_with_codes_and_change_nothing(
        make_served: ServeFactory, faces_repo: Path) -> None:
    served = make_served(cache=PRELOAD, faces=FACES)
    with served.client() as client:
        assert enrol(client, "Ana", png(picture((astronaut(), 20, 100, 200))))[0] == 201
        cases = [
            ("POST", f"{GALLERY}/names/Bo", b"{not json", 400, "invalid_input"),
            ("POST", f"{GALLERY}/names/Bo", b'{"snapshot": "../../etc/passwd"}', 400,
             "invalid_input"),
            ("POST", f"{GALLERY}/names/Bo", b'{"snapshot": "1718000000.123-door-9"}', 404,
             "snapshot_not_found"),
            ("POST", f"{GALLERY}/groups/7/name", b'{"name": "Bo"}', 404, "identity_not_found"),
            ("POST", f"{GALLERY}/groups/x/name", b'{"name": "Bo"}', 400, "invalid_input"),
            ("POST", f"{GALLERY}/groups/7/name", b'["Bo"]', 400, "invalid_input"),
            ("DELETE", f"{GALLERY}/names/Bo", None, 404, "identity_not_found"),
            ("DELETE", f"{GALLERY}/entries/999", None, 404, "identity_not_found"),
            ("DELETE", f"{GALLERY}/groups/3", None, 404, "identity_not_found"),
            ("GET", f"{GALLERY}/names/Bo", None, 404, "identity_not_found"),
        ]
        for method, path, body, status, code in cases:
            got, answer = call(client, method, path, body)
            assert (got, answer["code"]) == (status, code), (method, path, answer)
        listing = call(client, "GET", GALLERY)[1]
        assert listing["names"] == [{"name": "Ana", "entries": 1, "negatives": 0}]
        assert listing["groups"] == [] and client.ready()


def test_gallery_routes_when_faces_are_off_say_so(make_served: ServeFactory) -> None:
    served = make_served()
    with served.client() as client:
        status, answer = call(client, "GET", GALLERY)
        assert (status, answer["code"]) == (503, "faces_unavailable")


def test_enrolment_when_the_detector_gives_no_landmarks_names_the_model(
        make_served: ServeFactory, faces_repo: Path) -> None:
    served = make_served(cache=PRELOAD, faces="enabled: true, detector: tiny_cls, "
                                              "embedder: face_embedder")
    with served.client() as client:
        status, answer = enrol(client, "Ana", png(picture((astronaut(), 20, 100, 200))))
        assert (status, answer["code"]) == (400, "model_invalid")
        assert "faces.detector tiny_cls:1 gives no landmarks" in answer["error"]


def test_enrolment_when_the_image_is_a_decompression_bomb_refuses_it_typed_without_traceback(
        make_served: ServeFactory, faces_repo: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A ~100-byte PNG claiming 40000x40000 made OpenCV raise cv2.error (500 `internal`, a
    traceback in the log); a 47 KB one of 7000x7000 zeros was decoded whole before its size
    was checked. Both are `image_invalid` from their header, and the daemon serves on."""
    served = make_served(cache=PRELOAD, faces=FACES)
    with served.client() as client:
        for width, rows in ((40000, 1), (7000, 7000)):
            status, answer = enrol(client, "Ana", png_of_zeros(width, width, rows))
            assert (status, answer["code"]) == (400, "image_invalid"), answer
            assert f"{width}x{width}: more than" in answer["error"]
        assert enrol(client, "Ana", png(picture((astronaut(), 20, 100, 200))))[0] == 201
        assert client.ready()
    assert not [r for r in caplog.records if r.exc_info or r.levelname == "CRITICAL"
                or "internal" in r.getMessage()], [r.getMessage() for r in caplog.records]


def test_presence_when_a_named_face_comes_and_goes_is_on_then_off_and_delete_removes_it(
        broker: Broker, make_served: ServeFactory, faces_repo: Path, tmp_path: Path) -> None:
    prefix, name = "t/presence", "Ana María López"  # any Unicode, spaces
    face, blank = picture((astronaut(), 380, 150, 180)), picture()
    video = tmp_path / "door.avi"  # she is in view 2 s of every 6 (the stream loops)
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, SIZE)
    for frame in [face] * 20 + [blank] * 40:
        writer.write(frame)
    writer.release()
    state = f"{prefix}/presence/face/{token(name)}"
    config = f"homeassistant/binary_sensor/pres_presence_face_{token(name)}_present/config"
    sub = Subscriber(broker, f"{prefix}/presence/#", "homeassistant/binary_sensor/#")
    try:
        served = make_served(
            cache=PRELOAD, faces=FACES, device_id="pres",
            streams=stream(video).replace("max_age_s: 30", "max_age_s: 0.3"),
            mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}, "
                 "presence_off_delay_s: 1.0")
        with served.client() as client:
            for bad in ("Ana/Lopez", "Ana#1", "a+b", "..", " Ana"):  # never a name: no entity
                status, answer = enrol(client, quote(bad, safe=""), png(face))
                assert status == 400 and answer["code"] == "invalid_input", bad
            assert enrol(client, quote(name, safe=""), png(face))[0] == 201
            assert enrol(client, "Bo", png(picture((coffee(), 20, 100, 200))))[0] == 201

            def on_then_off(got: list[Received]) -> bool:
                said = [m.payload for m in got if m.topic == state]
                return b"ON" in said and b"OFF" in said[said.index(b"ON"):]
            got = sub.collect(until=on_then_off, timeout=60,
                              what="her presence on while in view, off once she is gone")
            assert all("+" not in m.topic and "#" not in m.topic for m in got)
            announced = {m.topic: json.loads(m.payload) for m in got
                         if m.topic.startswith("homeassistant/") and m.payload}
            mine = announced[config]
            assert mine["name"] == f"{name} present" and mine["device_class"] == "presence"
            assert mine["state_topic"] == state and mine["availability_topic"] == \
                f"{prefix}/status"
            bo = "homeassistant/binary_sensor/pres_presence_face_Bo_present/config"
            assert bo in announced
            assert [m.payload for m in got if m.topic == f"{prefix}/presence/face/Bo"] == [b"OFF"]
            said = [m.payload for m in got if m.topic == state]
            assert said[:said.index(b"ON")] in ([], [b"OFF"])  # (off when enrolled, if not seen)
            # deleting her removes the entity and clears her retained state
            status, _ = call(client, "DELETE", f"{GALLERY}/names/{quote(name, safe='')}")
            assert status == 200
            gone = sub.collect(until=lambda got: any(
                m.topic == config and not m.payload for m in got) and any(
                m.topic == state and not m.payload for m in got), timeout=20,
                what="her entity removed and her state cleared")
            assert not any(m.topic == bo and not m.payload for m in gone)  # Bo stays
    finally:
        sub.close()
    late = Subscriber(broker, f"{prefix}/presence/#", "homeassistant/binary_sensor/#")
    try:
        kept = late.collect(until=lambda got: any(m.topic == bo for m in got), timeout=10,
                            what="the retained configs")
    finally:
        late.close()
    assert not any(m.topic in (config, state) for m in kept)  # nothing of her is retained
