"""A discovery removal sent while a reconnect flushes the link's offline buffer: it queues
behind the buffer, so the buffered older config cannot be retained after it."""

from __future__ import annotations

import queue
import threading
import time

import pytest
from support.broker import Broker, Subscriber
from support.polling import wait_until

from edged.mqtt import link as mqtt
from edged.mqtt.config import MqttConfig
from edged.mqtt.link import MqttLink
from edged.streams.events_stage import EventsHub

TOPIC = "homeassistant/sensor/x/cam_person/config"


def test_hub_when_a_removal_meets_the_reconnects_flush_leaves_no_ghost_entity(
        broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sent under the hub's lock, a removal cannot be overtaken by `republish`; but a config
    changed while offline waits in the link's buffer, which paho's thread flushes after the
    link is marked connected, and a removal sent then goes straight out: it can reach the
    broker first, and the buffered config is retained after it. `republish` (after the
    flush) sends only the configs the hub still has, so nothing empties it again: a ghost
    entity until a restart. The flush is held open here at that one message."""
    monkeypatch.setattr(mqtt, "RECONNECT_MIN_S", 0.02)
    link = MqttLink(MqttConfig(host="127.0.0.1", port=broker.port), prefix="edged/x",
                    client_id="edged-ghost")
    hub = EventsHub(link, device=None)
    link.on_connected(hub.republish)
    link.start()
    entered, go = threading.Event(), threading.Event()
    try:
        assert link.wait_connected(10)
        hub.announce("cam", {TOPIC: b"X1"})
        broker.stop()
        wait_until(lambda: not link.connected, timeout=10, interval=0.02,
                   what="the link noticed the broker is gone")
        hub.announce("cam", {TOPIC: b"X2"})  # changed while offline: into the buffer
        real_send = link._send

        def send(message: mqtt._Message) -> None:
            if message.payload == b"X2" and threading.current_thread() is not \
                    threading.main_thread():
                entered.set()  # paho's thread, flushing the buffer
                go.wait(5)
            real_send(message)

        monkeypatch.setattr(link, "_send", send)
        broker.start()
        assert entered.wait(20)
        hub.withdraw("cam")  # a reload removed the stream: its entity emptied now
        go.set()
        time.sleep(1.0)
        sub = Subscriber(broker, TOPIC, client_id="ghost-check")
        try:
            retained: bytes | None = sub.wait_for(TOPIC, timeout=2).payload
        except queue.Empty:  # nothing retained: the entity is gone
            retained = None
        finally:
            sub.close()
        assert retained is None, f"a ghost entity: {retained!r} retained after its removal"
    finally:
        go.set()
        link.stop()
        hub.presence.close()
        if broker.process is None:
            broker.start()
