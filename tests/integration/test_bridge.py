"""A site broker bridged to a fleet broker with the shipped config
(deploy/mosquitto/edged-bridge.conf), two real mosquittos: edged talks only to the site
broker; what it publishes reaches the fleet over TLS with a password, what it publishes during
a 30 s outage of the fleet broker all arrives after it returns, in order, and a manifest
published on the fleet broker reaches the device through the bridge. Across a cut of the link
itself (both brokers up, the fleet broker restarted inside it), what the fleet published for
the device meanwhile arrives after; and MQTT 5 requests cross the bridge both ways."""

from __future__ import annotations

import hashlib
import json
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from support.artifacts import ArtifactServer
from support.bridge import Sites
from support.broker import Received, Subscriber
from support.daemon import ServeFactory
from support.mqtt_requests import HEADER_LENGTH, Requester, tensor_request
from support.ota import Pusher, X, command, expected, fresh, tiny_cls_bytes
from support.polling import wait_until

from edged.ota.manifest import sign_document

pytestmark = pytest.mark.slow

OUTAGE_S = 30.0
EVENTS_PER_S = 10


def fleet_subscriber(sites: Sites) -> Subscriber:
    """A persistent subscriber on the fleet broker: its session outlives the broker's restart,
    so what the bridge forwards before it reconnects waits for it there."""
    p = sites.prefix
    sub = Subscriber(sites.fleet, f"{p}/events", f"{p}/ota/+/status", f"{p}/bridge",
                     f"{p}/status", client_id="fleet-watcher", persistent=True)
    sub.client.reconnect_delay_set(0.2, 1)
    return sub


def event(seq: int) -> bytes:
    return json.dumps({"type": "update", "seq": seq}).encode()


def attached_manifest(private: Ed25519PrivateKey, version: int, data: bytes) -> bytes:
    doc = {"model": "tiny_cls", "version": version, "format": "onnx",
           "artifact": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()},
           **fresh("local")}
    return json.dumps(sign_document(doc, private)).encode()


def test_bridge_when_the_fleet_broker_is_away_30s_delivers_everything_after_in_order(
        make_sites: Callable[..., Sites], make_served: ServeFactory, artifacts: ArtifactServer,
        key: tuple[Ed25519PrivateKey, Path]) -> None:
    private, public = key
    sites = make_sites()
    p = sites.prefix
    sub = fleet_subscriber(sites)
    try:
        sub.collect(f"{p}/bridge", until=lambda got: got[-1].payload == b"1", timeout=30,
                    what="the bridge's notification: connected")
        served = make_served(mqtt=f"host: 127.0.0.1, port: {sites.site.port}, prefix: {p}, "
                                  f"fleet_prefix: {sites.fleet_prefix}",
                             ota=f"trusted_keys: [{public}]", device_id="site-dev")
        link = served.daemon.mqtt
        assert link is not None and link.wait_connected(10)
        link.publish("events", "events", event(0))
        sub.collect(f"{p}/events", until=lambda got: got[-1].payload == event(0), timeout=30,
                    what="the first event through the bridge")

        sites.fleet.stop()  # the uplink's far end is gone
        published = publish_during(link, served, private, OUTAGE_S)
        sites.fleet.start()  # same ports, its sessions restored from persistence

        wanted = {f"{p}/events": [event(i) for i in range(1, published + 1)]}
        got = sub.collect(f"{p}/events", f"{p}/ota/tiny_cls/status",
                          until=lambda got: arrived(got, wanted, f"{p}/ota/tiny_cls/status"),
                          timeout=90, what="everything published during the outage")
        events = [m.payload for m in got if m.topic == f"{p}/events"]
        assert events == wanted[f"{p}/events"]  # all of them, once each, in order
        # OTA status: the install's steps in order, each once; its final state is retained,
        # and mosquitto subscribes its bridge again at every reconnect attempt, so that one
        # retained message also comes once per attempt (mosquitto issue 2248): the same
        # message, the device's current state, never an older one.
        statuses = [m.payload for m in got if m.topic == f"{p}/ota/tiny_cls/status"]
        steps = [json.loads(s) for s in dict.fromkeys(statuses)]
        live = [e for e in steps if e["state"] != "active"]
        finals = [e for e in steps if e["state"] == "active"]
        assert [e["state"] for e in live if e["state"] != "downloading"] == [
            "received", "verifying", "installing", "warming"]
        assert [e["ts"] for e in live] == sorted(e["ts"] for e in live)
        assert len(finals) == 1 and finals[0]["version"] == 2
        assert finals[0]["ts"] >= live[-1]["ts"]
        # The other way: a manifest published on the fleet broker reaches the device.
        pusher = Pusher(sub, artifacts, private)
        pusher.push(f"{sites.fleet_prefix}/ota/tiny_cls", 3, tiny_cls_bytes(2))
        done = sub.collect(f"{p}/ota/tiny_cls/status",
                           until=lambda got: json.loads(got[-1].payload)["version"] == 3 and
                           json.loads(got[-1].payload)["state"] in ("active", "failed"),
                           timeout=60, what="the fleet's manifest installed")
        assert json.loads(done[-1].payload)["state"] == "active"
    finally:
        sub.close()


def publish_during(link: Any, served: Any, private: Ed25519PrivateKey, seconds: float) -> int:
    """Events at EVENTS_PER_S for `seconds`, and an OTA install (through the socket) halfway:
    returns the number of events published."""
    count = 0
    stop = threading.Event()
    start = time.monotonic()
    installed = False
    while (elapsed := time.monotonic() - start) < seconds:
        count += 1
        link.publish("events", "events", event(count))
        if not installed and elapsed > seconds / 2:
            data = tiny_cls_bytes(1)
            head = attached_manifest(private, 2, data)
            with served.client() as client:
                status, _, raw = client.request(
                    "POST", "/v2/edged/ota/install", head + data,
                    {"Edged-Manifest-Length": str(len(head)),
                     "Content-Type": "application/octet-stream"})
            assert status == 202, raw
            installed = True
        stop.wait(max(0.0, start + count / EVENTS_PER_S - time.monotonic()))  # the pace
    assert link.stats()["dropped"] == 0  # edged handed every one to the site broker
    return count


def arrived(got: list[Received], wanted: dict[str, list[bytes]], status: str) -> bool:
    by_topic = [m.payload for m in got if m.topic in wanted]
    done = any(m.topic == status and json.loads(m.payload)["state"] == "active" for m in got)
    return done and len(by_topic) >= sum(len(v) for v in wanted.values())


def test_bridge_when_an_outage_outgrows_the_queue_keeps_the_first_max_queued(
        make_sites: Callable[..., Sites]) -> None:
    """What the config's comment says of max_queued_messages: past it, the newest go."""
    sites = make_sites(max_queued=20)
    p = sites.prefix
    sub = fleet_subscriber(sites)
    try:
        sub.collect(f"{p}/bridge", until=lambda got: got[-1].payload == b"1", timeout=30,
                    what="the bridge's notification: connected")
        sites.fleet.stop()
        # A publisher that waits for each PUBACK: all 50 are at the site broker before the
        # fleet broker returns (edged's link would hand them over just as well, but says
        # nothing of when the broker has them).
        publisher = Subscriber(sites.site, "t/unused")
        try:
            for seq in range(1, 51):
                publisher.client.publish(f"{p}/events", event(seq), qos=1).wait_for_publish(5)
        finally:
            publisher.close()
        sites.fleet.start()
        got = [sub.wait_for(f"{p}/events", timeout=60)]
        while True:  # the rest of what was queued comes right after the first
            try:
                got.append(sub.wait_for(f"{p}/events", timeout=3))
            except queue.Empty:
                break
        # The oldest, in order, with no gap: the newest were dropped. The queue also held
        # the retained messages mosquitto queues again at each reconnect attempt.
        kept = len(got)
        assert [m.payload for m in got] == [event(i) for i in range(1, kept + 1)]
        assert 10 <= kept <= 20
    finally:
        sub.close()


def test_bridge_when_a_fleet_client_asks_for_an_inference_the_answer_comes_back_through_it(
        make_sites: Callable[..., Sites], make_served: ServeFactory) -> None:
    """MQTT 5 both ways: the request's response topic and correlation data cross the bridge
    in, the answer and its properties cross it out."""
    sites = make_sites()
    p = sites.prefix
    watcher = fleet_subscriber(sites)
    try:
        watcher.collect(f"{p}/bridge", until=lambda got: got[-1].payload == b"1", timeout=30,
                        what="the bridge's notification: connected")
    finally:
        watcher.close()
    served = make_served(mqtt=f"host: 127.0.0.1, port: {sites.site.port}, prefix: {p}, "
                              "requests: {enabled: true, clients: [{name: hq, "
                              "response_topics: ['replies/hq/#']}]}")
    assert served.daemon.mqtt is not None
    assert served.daemon.mqtt.wait_subscribed([f"{p}/infer/+"], 10)
    requester = Requester(sites.fleet.port, "hq")  # on the fleet broker, not the device's
    try:
        body, length = tensor_request(X, binary=True)
        answer = requester.call(f"{p}/infer/tiny_cls", body, json_length=length,
                                correlation=b"\x00req-1\xff", timeout=30)
    finally:
        requester.close()
    assert answer.status == 200
    got = triton.InferenceServerClient.parse_response_body(
        answer.payload, header_length=int(answer.properties[HEADER_LENGTH]))
    np.testing.assert_allclose(got.as_numpy("prob"), expected(0), rtol=1e-5)


def answered(requester: Requester, topic: str, timeout: float) -> Any:
    """Ask until one is answered (bounded): a request published before the requests bridge
    has subscribed again at the fleet broker is dropped there, as MQTT drops what nobody
    reads."""
    body, length = tensor_request(X, binary=True)

    def ask() -> Any:
        try:
            return requester.call(topic, body, json_length=length, timeout=2)
        except TimeoutError:
            return None

    return wait_until(ask, timeout=timeout, interval=0, what=f"an answer on {topic}")


def test_bridge_when_the_link_is_cut_what_the_fleet_publishes_meanwhile_arrives_after(
        make_sites: Callable[..., Sites], make_served: ServeFactory, artifacts: ArtifactServer,
        key: tuple[Ed25519PrivateKey, Path]) -> None:
    """Both brokers run; the link between them goes down, and the fleet broker restarts during
    the outage. A manifest on the fleet's topic and a command on the device's, published QoS 1
    and not retained while the bridge is away, wait in the bridge's session at the fleet broker
    (kept through its restart) and reach the device once the link is back; the events the
    device published meanwhile reach the fleet, in order; an MQTT 5 request is answered
    through the bridge after. With the bridge on MQTT 5 alone (mosquitto 2.0 sends no Session
    Expiry Interval) the fleet broker ended the session at the cut, CONNACK (0, 0) after it,
    and both messages were lost (issue 49 #8)."""
    private, public = key
    sites = make_sites(relay=True)
    relay = sites.relay
    assert relay is not None
    p, fleet_prefix = sites.prefix, sites.fleet_prefix
    sub = fleet_subscriber(sites)
    requester = None
    try:
        sub.collect(f"{p}/bridge", until=lambda got: got[-1].payload == b"1", timeout=30,
                    what="the bridge's notification: connected")
        served = make_served(mqtt=f"host: 127.0.0.1, port: {sites.site.port}, prefix: {p}, "
                                  f"fleet_prefix: {fleet_prefix}, requests: {{enabled: true, "
                                  "clients: [{name: hq, response_topics: ['replies/hq/#']}]}",
                             ota=f"trusted_keys: [{public}]", device_id="site-dev")
        link, ota = served.daemon.mqtt, served.daemon.ota
        assert link is not None and ota is not None and ota.wait_listening(10)

        relay.cut()  # the uplink is gone; the fleet broker sees the bridge's will
        sub.collect(f"{p}/bridge", until=lambda got: got[-1].payload == b"0", timeout=30,
                    what="the bridge's will at the fleet broker: lost")
        pusher = Pusher(sub, artifacts, private)
        pusher.push(f"{fleet_prefix}/ota/tiny_cls", 2, tiny_cls_bytes(1))
        pusher.publish(f"{p}/ota/tiny_cnn/command",
                       json.dumps(command(private, p, model="tiny_cnn")).encode())
        for seq in range(1, 21):
            link.publish("events", "events", event(seq))
        sites.fleet.stop()  # ... and the fleet broker restarts inside the outage
        sites.fleet.start()
        log = sites.fleet.directory / "mosquitto.log"
        since = log.stat().st_size
        relay.restore()

        got = sub.collect(f"{p}/events", f"{p}/ota/tiny_cls/status", f"{p}/ota/tiny_cnn/status",
                          until=lambda got: all_after_the_cut(got, p), timeout=90,
                          what="the fleet's manifest and command answered, the events")
        assert [m.payload for m in got if m.topic == f"{p}/events"] == [
            event(i) for i in range(1, 21)]
        refused = [json.loads(m.payload) for m in got if m.topic == f"{p}/ota/tiny_cnn/status"]
        assert refused[-1]["state"] == "failed" and refused[-1]["reason"] == "no_previous"
        assert served.daemon.cache.repository.active_version("tiny_cls") == 2
        # The fleet broker kept the bridge's session: "session present" in its CONNACK.
        connacks = [line for line in log.read_text()[since:].splitlines()
                    if "Sending CONNACK to site-dev-bridge " in line]
        assert connacks and connacks[0].endswith("(1, 0)"), connacks

        requester = Requester(sites.fleet.port, "hq")
        answer = answered(requester, f"{p}/infer/tiny_cls", timeout=30)
        assert answer.status == 200
        got_back = triton.InferenceServerClient.parse_response_body(
            answer.payload, header_length=int(answer.properties[HEADER_LENGTH]))
        np.testing.assert_allclose(got_back.as_numpy("prob"), expected(1), rtol=1e-5)
    finally:
        if requester is not None:
            requester.close()
        sub.close()


def all_after_the_cut(got: list[Received], p: str) -> bool:
    events = sum(m.topic == f"{p}/events" for m in got)
    installed = any(m.topic == f"{p}/ota/tiny_cls/status" and
                    json.loads(m.payload)["state"] in ("active", "failed") for m in got)
    refused = any(m.topic == f"{p}/ota/tiny_cnn/status" for m in got)
    return events >= 20 and installed and refused


def test_bridge_when_the_site_broker_restarts_a_retained_manifest_reaches_the_device(
        make_sites: Callable[..., Sites], make_served: ServeFactory, artifacts: ArtifactServer,
        key: tuple[Ed25519PrivateKey, Path]) -> None:
    """The device's own broker restarts (a reboot, an upgrade of mosquitto) while the fleet
    pushes. Its bridge can be back, and hand over what waited in its session, before edged has
    reconnected and subscribed again (seen in mosquitto's log: the bridge's PUBLISH a second
    before edged's CONNECT), and a message that is only queued then reaches no one; a retained
    manifest (`edged ota push --retain`) is kept by the site broker and reaches edged when it
    subscribes again."""
    private, public = key
    sites = make_sites()
    p, fleet_prefix = sites.prefix, sites.fleet_prefix
    sub = fleet_subscriber(sites)
    pusher = Pusher(sub, artifacts, private)
    try:
        sub.collect(f"{p}/bridge", until=lambda got: got[-1].payload == b"1", timeout=30,
                    what="the bridge's notification: connected")
        served = make_served(mqtt=f"host: 127.0.0.1, port: {sites.site.port}, prefix: {p}, "
                                  f"fleet_prefix: {fleet_prefix}",
                             ota=f"trusted_keys: [{public}]", device_id="site-dev")
        ota = served.daemon.ota
        assert ota is not None and ota.wait_listening(10)
        sites.site.stop()
        sub.collect(f"{p}/bridge", until=lambda got: got[-1].payload == b"0", timeout=30,
                    what="the bridge's will at the fleet broker: lost")
        pusher.push(f"{fleet_prefix}/ota/tiny_cls", 2, tiny_cls_bytes(1), retain=True)
        sites.site.start()
        done = sub.collect(f"{p}/ota/tiny_cls/status",
                           until=lambda got: json.loads(got[-1].payload)["state"] in (
                               "active", "failed"), timeout=60, what="the retained manifest")
        assert json.loads(done[-1].payload)["state"] == "active"
        assert served.daemon.cache.repository.active_version("tiny_cls") == 2
    finally:
        pusher.publish(f"{fleet_prefix}/ota/tiny_cls", b"", retain=True)  # clear it
        sub.close()
