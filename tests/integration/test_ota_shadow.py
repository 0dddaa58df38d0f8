"""Shadow rollouts through a real mosquitto and the daemon in-process, on real tiny_cls models
and live socket requests: a candidate that agrees with the serving version is promoted after
min_samples; one that disagrees is rejected while the serving version never changes and no
request fails; an operator's signed command decides early; a newer update supersedes a
shadow; progress stays retained on <prefix>/ota/<model>/shadow."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from onnx import numpy_helper
from support.artifacts import ArtifactServer
from support.broker import Broker, Subscriber, retained_json
from support.daemon import Served, ServeFactory
from support.ota import Pusher, fresh, statuses, tiny_cls_bytes
from support.shadow import nudged_cls_bytes, traffic

from edged.ota.manifest import sign_document
from tools.assets import models as test_models
from tools.assets.demo import color_of, write_color_video


def shadow(min_samples: int, **extra: Any) -> dict[str, Any]:
    return {"rollout": {"mode": "shadow", "sample": 1.0, "min_samples": min_samples,
                        "max_duration_s": 120, **extra}}


@pytest.fixture
def device(broker: Broker, make_served: ServeFactory, artifacts: ArtifactServer,
           key: tuple[Ed25519PrivateKey, Path], request: pytest.FixtureRequest
           ) -> Iterator[tuple[Served, Pusher, Subscriber, str]]:
    private, public = key
    prefix = f"t/shadow/{request.node.name[-24:]}"
    sub = Subscriber(broker, f"{prefix}/ota/tiny_cls/status", f"{prefix}/ota/tiny_cls/shadow")
    try:
        served = make_served(mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}",
                             ota=f"trusted_keys: [{public}], shadow: {{max_share: 1.0}}")
        assert served.daemon.mqtt is not None and served.daemon.mqtt.wait_connected(10)
        assert served.daemon.ota is not None and served.daemon.ota.wait_listening(10)
        yield served, Pusher(sub, artifacts, private), sub, prefix
    finally:
        sub.close()



def test_shadow_when_the_candidate_agrees_is_promoted_after_min_samples(
        device: tuple[Served, Pusher, Subscriber, str], broker: Broker) -> None:
    served, pusher, sub, prefix = device
    status, progress = f"{prefix}/ota/tiny_cls/status", f"{prefix}/ota/tiny_cls/shadow"
    pusher.push(f"{prefix}/ota/tiny_cls", 2, nudged_cls_bytes(0), **shadow(25))
    assert statuses(sub, status, "shadowing")[-1]["version"] == 2
    cache = served.daemon.cache
    assert cache.default_version("tiny_cls") == 1 and cache.ready("tiny_cls", 2)
    with traffic(served) as live:
        events = statuses(sub, status, "active", timeout=60)
    assert events[-1]["version"] == 2 and "promoted after 25 shadow samples" in \
        events[-1]["detail"]
    assert live.failures == [] and live.answers >= 25
    assert cache.default_version("tiny_cls") == 2
    assert served.daemon.repository.active_version("tiny_cls") == 2
    final = retained_json(broker, progress)  # a dashboard that comes later sees it
    assert final["state"] == "promoted" and final["samples"] >= 25
    assert final["metrics"]["top1_agreement"] == 1.0 and final["failures"] == 0
    assert {c["name"]: c["passed"] for c in final["checks"]} == {
        "max_failure_rate": True, "min_top1_agreement": True}


def test_shadow_when_the_candidate_disagrees_is_rejected_and_serving_never_changes(
        device: tuple[Served, Pusher, Subscriber, str], broker: Broker) -> None:
    served, pusher, sub, prefix = device
    status, progress = f"{prefix}/ota/tiny_cls/status", f"{prefix}/ota/tiny_cls/shadow"
    with traffic(served) as live:
        pusher.push(f"{prefix}/ota/tiny_cls", 2, tiny_cls_bytes(1),
                    **shadow(30, promote_if={"min_top1_agreement": 0.9}))
        statuses(sub, status, "shadowing")
        failed = statuses(sub, status, "failed", timeout=60)[-1]
    final = retained_json(broker, progress)
    assert final["state"] == "rejected"
    assert failed["reason"] == "shadow_rejected" and failed["version"] == 2
    assert "min_top1_agreement" in failed["detail"] and "version 1 serves on" in failed["detail"]
    assert final["metrics"]["top1_agreement"] < 0.9 and final["samples"] >= 30
    assert live.failures == [] and live.mismatches == 0 and live.answers > 30
    cache = served.daemon.cache
    assert cache.default_version("tiny_cls") == 1 and not cache.ready("tiny_cls", 2)
    assert served.daemon.repository.versions_on_disk("tiny_cls") == [1]
    assert served.daemon.scheduler.taps == {}


def test_shadow_when_the_operator_signs_a_decision_acts_on_it_and_refuses_stale_ones(
        device: tuple[Served, Pusher, Subscriber, str],
        key: tuple[Ed25519PrivateKey, Path]) -> None:
    served, pusher, sub, prefix = device
    private, _public = key
    status, topic = f"{prefix}/ota/tiny_cls/status", f"{prefix}/ota/tiny_cls/command"
    pusher.push(f"{prefix}/ota/tiny_cls", 2, nudged_cls_bytes(0), **shadow(10_000))
    statuses(sub, status, "shadowing")

    def send(doc: dict[str, Any]) -> None:
        pusher.publish(topic, json.dumps(doc).encode())

    unsigned = {"model": "tiny_cls", "action": "promote", "version": 2, **fresh(prefix)}
    send(unsigned)
    assert statuses(sub, status, "failed")[-1]["reason"] == "unsigned"
    wrong = sign_document({"model": "tiny_cls", "action": "reject", "version": 3,
                           **fresh(prefix)}, private)
    send(wrong)  # a decision about another version: refused, the shadow goes on
    refused = statuses(sub, status, "failed")[-1]
    assert refused["reason"] == "no_shadow"
    running = served.daemon.status_report()["ota"]["shadows"]["tiny_cls"]  # `edged status`
    assert running["state"] == "running" and running["candidate"] == 2
    promote = sign_document({"model": "tiny_cls", "action": "promote", "version": 2,
                             **fresh(prefix)}, private)
    send(promote)
    active = statuses(sub, status, "active")[-1]
    assert active["version"] == 2 and "promoted by the operator" in active["detail"]
    send(promote)  # the same signed command again: a replay
    assert statuses(sub, status, "failed")[-1]["reason"] == "replayed"
    assert served.daemon.cache.default_version("tiny_cls") == 2


def test_shadow_when_a_newer_update_comes_gives_way_to_it(
        device: tuple[Served, Pusher, Subscriber, str]) -> None:
    served, pusher, sub, prefix = device
    status = f"{prefix}/ota/tiny_cls/status"
    pusher.push(f"{prefix}/ota/tiny_cls", 2, nudged_cls_bytes(0), **shadow(10_000))
    statuses(sub, status, "shadowing")
    pusher.push(f"{prefix}/ota/tiny_cls", 3, tiny_cls_bytes(2))  # urgent, direct
    events = statuses(sub, status, "active")
    superseded = [e for e in events if e.get("reason") == "superseded"]
    assert superseded and superseded[0]["version"] == 2
    assert "superseded by version 3" in superseded[0]["detail"]
    assert events[-1]["version"] == 3
    assert served.daemon.repository.versions_on_disk("tiny_cls") == [1, 3]
    assert served.daemon.cache.default_version("tiny_cls") == 3


def test_shadow_when_both_versions_do_not_fit_the_cache_budget_is_refused_before_loading(
        device: tuple[Served, Pusher, Subscriber, str]) -> None:
    served, pusher, sub, prefix = device
    status = f"{prefix}/ota/tiny_cls/status"
    cache = served.daemon.cache
    cache.budget_bytes = sum(r.nbytes or 0 for r in cache.status() if r.nbytes)  # full now
    pusher.push(f"{prefix}/ota/tiny_cls", 2, nudged_cls_bytes(0), **shadow(10))
    failed = statuses(sub, status, "failed")[-1]
    assert failed["reason"] == "no_memory" and "cache budget" in failed["detail"]
    assert statuses(sub, status, "rolled_back")[-1]["version"] == 1
    assert cache.default_version("tiny_cls") == 1 and not cache.ready("tiny_cls", 2)


def swapped_colors_bytes() -> bytes:
    """The colors classifier with red and green swapped: it disagrees on those frames and
    agrees on blue ones."""
    model = test_models.make_colors()
    for init in model.graph.initializer:
        if init.name == "sharpen":
            swapped = numpy_helper.to_array(init)[:, [1, 0, 2]]
            init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(swapped), "sharpen"))
    return model.SerializeToString()


def test_shadow_when_a_candidate_disagrees_on_live_frames_is_rejected_and_results_stay_right(
        broker: Broker, make_served: ServeFactory, artifacts: ArtifactServer,
        key: tuple[Ed25519PrivateKey, Path], tmp_path: Path) -> None:
    private, public = key
    prefix = "t/shadow/stream"
    video = write_color_video(tmp_path / "colors.avi", fps=60, frames_per_color=10)
    results, status = f"{prefix}/streams/cam/results", f"{prefix}/ota/colors/status"
    sub = Subscriber(broker, results, status)
    try:
        served = make_served(
            cache="preload: [colors]",
            mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}",
            ota=f"trusted_keys: [{public}], shadow: {{max_share: 1.0}}",
            streams=f"[{{name: cam, source: 'file://{video}', model: colors, loop: true, "
                    "backpressure: block}]")
        assert served.daemon.ota is not None and served.daemon.ota.wait_listening(10)
        data = swapped_colors_bytes()
        (artifacts.root / "colors-2.onnx").write_bytes(data)
        doc = sign_document({"model": "colors", "version": 2, "format": "onnx",
                             "artifact": {"url": artifacts.url("colors-2.onnx"),
                                          "size": len(data),
                                          "sha256": hashlib.sha256(data).hexdigest()},
                             **shadow(30, promote_if={"min_top1_agreement": 0.9}),
                             **fresh(prefix)}, private)
        sub.client.publish(f"{prefix}/ota/colors", json.dumps(doc).encode(),
                           qos=1).wait_for_publish(5)
        got = sub.collect(results, status, timeout=60, what="the shadow's rejection",
                          until=lambda m: m[-1].topic == status and
                          json.loads(m[-1].payload)["state"] == "failed")
    finally:
        sub.close()
    events = [json.loads(m.payload) for m in got if m.topic == status]
    assert [e["state"] for e in events if e["state"] != "downloading"] == [
        "received", "verifying", "installing", "warming", "shadowing", "failed"]
    assert events[-1]["reason"] == "shadow_rejected"
    frames = [json.loads(m.payload) for m in got if m.topic == results]
    assert len(frames) > 30
    for message in frames:  # every frame answered by version 1, and rightly
        assert message["version"] == 1
        assert message["results"]["classes"][0]["label"] == color_of((message["seq"] - 1) % 30,
                                                                     10)
    final = retained_json(broker, f"{prefix}/ota/colors/shadow")
    assert final["state"] == "rejected" and 0.2 < final["metrics"]["top1_agreement"] < 0.5
    assert served.daemon.repository.versions_on_disk("colors") == [1]
