"""The MQTT link against a real private mosquitto: retained status and Last Will, TLS with a
password, QoS per topic class, the bounded offline buffer across a broker restart, inbound
dispatch that survives a failing handler."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.broker import PASSWORD, USERNAME, Broker, Subscriber
from support.polling import wait_until
from support.ports import free_port

from edged.core.errors import ConfigError
from edged.mqtt import link as mqtt
from edged.mqtt.config import MqttConfig, TlsConfig
from edged.mqtt.link import MqttLink, read_password


@pytest.fixture
def links() -> Iterator[list[MqttLink]]:
    made: list[MqttLink] = []
    yield made
    for link in made:
        link.stop(timeout_s=1)


def plain(broker: Broker, **kw: object) -> MqttConfig:
    return MqttConfig(host="127.0.0.1", port=broker.port, **kw)  # type: ignore[arg-type]


def start(links: list[MqttLink], config: MqttConfig, prefix: str,
          wait: bool = True) -> MqttLink:
    link = MqttLink(config, prefix=prefix, client_id=f"edged-{prefix.replace('/', '-')}")
    links.append(link)
    link.start()
    if wait:
        assert link.wait_connected(10)
    return link


def test_mqtt_link_when_connected_publishes_online_retained_and_offline_on_stop(
        broker: Broker, links: list[MqttLink]) -> None:
    link = start(links, plain(broker), "t/status")
    late = Subscriber(broker, "t/status/status")  # joins after: sees the retained value
    try:
        message = late.wait_for("t/status/status")
        assert (message.payload, message.retain) == (b"online", True)
        link.stop()
        assert late.wait_for("t/status/status").payload == b"offline"
    finally:
        late.close()


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_mqtt_link_when_tls_and_password_are_set_connects_and_delivers(
        broker: Broker, links: list[MqttLink], protocol: str) -> None:
    config = MqttConfig(host="127.0.0.1", port=broker.tls_port, protocol=protocol,  # type: ignore[arg-type]
                        username=USERNAME, password_file=broker.password_file,
                        tls=TlsConfig(ca=broker.ca), qos_results=1)
    sub = Subscriber(broker, "t/tls/#")
    try:
        link = start(links, config, "t/tls")
        link.publish("results", "streams/a/results", b'{"seq": 1}')
        message = sub.wait_for("t/tls/streams/a/results")
        assert (message.payload, message.qos) == (b'{"seq": 1}', 1)
    finally:
        sub.close()


def test_mqtt_link_when_password_is_wrong_stays_disconnected_and_buffers(
        broker: Broker, links: list[MqttLink], tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("not-it\n")
    config = MqttConfig(host="127.0.0.1", port=broker.tls_port, username=USERNAME,
                        password_file=wrong, tls=TlsConfig(ca=broker.ca), buffer_messages=2)
    link = start(links, config, "t/wrong", wait=False)
    for i in range(3):
        link.publish("results", "streams/a/results", str(i).encode())
    assert not link.wait_connected(1)
    stats = link.stats()
    assert (stats["connected"], stats["buffered"], stats["dropped"]) == (False, 2, 1)


def test_mqtt_link_when_tls_ca_is_missing_is_a_config_error(broker: Broker,
                                                            tmp_path: Path) -> None:
    config = MqttConfig(port=broker.tls_port, tls=TlsConfig(ca=tmp_path / "nope.crt"))
    with pytest.raises(ConfigError, match=r"mqtt\.tls"):
        MqttLink(config, prefix="t/x", client_id="x")


def test_mqtt_read_password_when_relative_reads_from_credentials_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mqtt-password").write_text(PASSWORD + "\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert read_password(Path("mqtt-password")) == PASSWORD
    with pytest.raises(ConfigError, match="cannot read"):
        read_password(Path("absent"))


def test_mqtt_link_when_broker_restarts_delivers_the_buffer_and_counts_what_overflowed(
        broker: Broker, links: list[MqttLink]) -> None:
    sub = Subscriber(broker, "t/restart/#", client_id="restart-sub", persistent=True)
    link = start(links, plain(broker, qos_results=1, buffer_messages=5), "t/restart")
    try:
        link.publish("results", "r", b"before")
        assert sub.wait_for("t/restart/r").payload == b"before"
        broker.stop()
        wait_until(lambda: not link.connected, timeout=10, interval=0.05,
                   what="the link noticed the broker is gone")
        for i in range(8):  # 3 more than the buffer holds: the 3 oldest go
            link.publish("results", "r", f"{i}".encode())
        stats = link.stats()
        assert (stats["buffered"], stats["dropped"]) == (5, 3)
        broker.start()
        assert link.wait_connected(40)  # paho's reconnect backoff is capped at 30 s
        got: list[bytes] = []
        while len(got) < 5:  # QoS 1 is at least once: a redelivered "before" is allowed
            payload = sub.wait_for("t/restart/r", timeout=20).payload
            if payload != b"before":
                got.append(payload)
        assert got == [b"3", b"4", b"5", b"6", b"7"]
        stats = link.stats()
        assert stats["dropped_by_class"] == {"results": 3}
        assert stats["published_by_class"] == {"results": 6}  # "before" and the 5 kept
    finally:
        sub.close()
        if broker.process is None:
            broker.start()


def test_mqtt_link_when_it_connects_again_calls_back_once_the_buffer_went_out(
        broker: Broker, links: list[MqttLink], quick_retries: None) -> None:
    sub = Subscriber(broker, "t/again/#", client_id="again-sub", persistent=True)
    link = MqttLink(plain(broker, qos_events=1), prefix="t/again", client_id="edged-t-again")
    links.append(link)
    buffered_then: list[int] = []

    def republish() -> None:  # what the events hub does: the retained state again
        buffered_then.append(link.stats()["buffered"])
        link.publish("events", "streams/door/person", b"1", retain=True)

    link.on_connected(lambda: 1 / 0)  # a failing callback is logged; the others still run
    link.on_connected(republish)
    link.start()
    try:
        assert sub.wait_for("t/again/streams/door/person").payload == b"1"
        broker.stop()
        wait_until(lambda: not link.connected, timeout=10, interval=0.05,
                   what="the link noticed the broker is gone")
        link.publish("events", "events", b"while away")
        broker.start()
        assert sub.wait_for("t/again/events", timeout=20).payload == b"while away"
        assert sub.wait_for("t/again/streams/door/person", timeout=20).payload == b"1"
        assert buffered_then == [0, 0]  # after the buffered message went out, each time
        assert link.stats()["published_by_class"]["events"] == 3
    finally:
        sub.close()
        if broker.process is None:
            broker.start()


def test_mqtt_link_when_a_handler_raises_counts_it_and_keeps_dispatching(
        broker: Broker, links: list[MqttLink]) -> None:
    got: list[bytes] = []
    arrived = threading.Event()

    def handler(topic: str, payload: bytes) -> None:
        if payload == b"bad":
            raise ValueError("boom")
        got.append(payload)
        arrived.set()

    link = start(links, plain(broker), "t/in")
    link.subscribe("t/in/sensors/+", handler)
    sub = Subscriber(broker, "unused/topic")
    try:
        def publish_both() -> bool:  # until the link's subscription is in place
            sub.client.publish("t/in/sensors/a", b"bad", qos=1).wait_for_publish(5)
            sub.client.publish("t/in/sensors/a", b"good", qos=1).wait_for_publish(5)
            arrived.wait(0.5)
            return link.stats()["received"] >= 2

        wait_until(publish_both, timeout=10, interval=0, what="both payloads received")
        assert arrived.is_set() and b"good" in got
        assert link.stats()["handler_errors"] >= 1
    finally:
        sub.close()


def connect_failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and "MQTT: cannot connect" in r.getMessage()]


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """paho retries from 1 s by default; a few attempts fit a test at 20 ms."""
    monkeypatch.setattr(mqtt, "RECONNECT_MIN_S", 0.02)


def test_mqtt_link_when_no_broker_listens_says_why_once_and_keeps_trying(
        links: list[MqttLink], quick_retries: None, caplog: pytest.LogCaptureFixture) -> None:
    config = MqttConfig(host="127.0.0.1", port=free_port())
    link = start(links, config, "t/refused", wait=False)
    wait_until(lambda: link.stats()["failed_connects"] >= 3, timeout=10,
               what="three failed attempts")
    (line,) = connect_failures(caplog)  # the same reason again is not a new warning
    assert f"cannot connect to 127.0.0.1:{config.port}: connection refused (is a broker " \
           "listening on that port?); next attempt in" in line
    assert not link.connected


def test_mqtt_link_when_the_password_is_wrong_says_the_broker_refused_it(
        broker: Broker, links: list[MqttLink], quick_retries: None, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    wrong = tmp_path / "password"
    wrong.write_text("not-the-password\n")
    link = start(links, MqttConfig(host="127.0.0.1", port=broker.tls_port, username=USERNAME,
                                   password_file=wrong, tls=TlsConfig(ca=broker.ca)),
                 "t/badpass", wait=False)
    wait_until(lambda: link.stats()["failed_connects"] >= 2, timeout=10,
               what="two refused attempts")
    (line,) = connect_failures(caplog)
    assert "the broker refused it: " in line
    assert "Not authorized" in line or "Bad user name or password" in line


# paho 2.x drops the socket of a failed TLS handshake without closing it; the garbage
# collector closes it (with a ResourceWarning), so nothing accumulates, but pytest sees it.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_mqtt_link_when_the_broker_certificate_is_not_trusted_says_so(
        broker: Broker, links: list[MqttLink], quick_retries: None,
        caplog: pytest.LogCaptureFixture) -> None:
    untrusted = broker.directory / "server.crt"  # not a CA: nothing it signed is trusted
    link = start(links, MqttConfig(host="127.0.0.1", port=broker.tls_port, username=USERNAME,
                                   password_file=broker.password_file,
                                   tls=TlsConfig(ca=untrusted)),
                 "t/untrusted", wait=False)
    wait_until(lambda: link.stats()["failed_connects"] >= 2, timeout=10,
               what="two failed TLS handshakes")
    (line,) = connect_failures(caplog)
    assert "TLS: the broker's certificate is not trusted" in line
