"""The operator's side of delivery: `edged ota push` and `edged ota rollback`.

`push` publishes a manifest (signing it first when given the key), optionally serves the
artifact over HTTP from this machine or sends it inline as MQTT chunks, then follows the
status topics of the target devices and prints each step until every device has reached a
final state (or the time limit). `rollback` sends signed rollback commands the same way.
Exit codes: 0 every device succeeded, 1 a device failed, 2 a device did not answer in time.
"""

from __future__ import annotations

import json
import os
import queue
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO

from edged.api.config import split_host_port
from edged.core.errors import ToolError
from edged.core.states import OtaState
from edged.mqtt import topics
from edged.ops.keys import (
    DEFAULT_TTL_S,
    describe_artifact,
    freshness,
    load_private_key,
    read_manifest,
)
from edged.ota.manifest import FINAL, Rejected, parse_manifest, sign_document

CHUNK_BYTES = 64 * 1024
CONNECT_TIMEOUT_S = 15.0


@dataclass
class Broker:
    host: str
    port: int
    username: str | None = None
    password_file: Path | None = None
    ca_file: Path | None = None

    @classmethod
    def parse(cls, address: str, **kwargs: Any) -> Broker:
        return cls(*_host_port(address, "--broker"), **kwargs)


@dataclass
class Target:
    """Where a push goes and whose status topics tell how it went."""

    topics: list[str]  # manifest (or command) topics
    watch: list[str]  # device prefixes, MQTT wildcards allowed
    expect: int | None  # devices that must answer; None: every device that answers

    @classmethod
    def of(cls, devices: list[str], fleet: str | None, group: str | None, watch: list[str],
           expect: int | None) -> Target:
        devices = [d.rstrip("/") for d in devices]
        if bool(devices) == bool(fleet):
            raise ToolError("give the devices (--device PREFIX, repeatable) or --fleet PREFIX")
        if group and not fleet:
            raise ToolError("--group goes with --fleet")
        if devices:
            return cls(devices, watch or devices, expect if expect is not None else len(devices))
        assert fleet is not None
        root = fleet.rstrip("/") + (f"/groups/{group}" if group else "")
        # edged/<device_id> beside edged/fleet is the default layout: watch its siblings
        parent = fleet.rstrip("/").rpartition("/")[0]
        return cls([root], watch or [f"{parent}/+" if parent else "+"], expect)


@dataclass
class Outcome:
    states: dict[str, dict[str, Any]] = field(default_factory=dict)  # device -> last event

    def code(self, expect: int | None) -> int:
        finals = [e for e in self.states.values() if e["state"] in FINAL]
        if any(e["state"] != OtaState.ACTIVE and not e.get("ok") for e in finals):
            return 1
        if not finals or (expect is not None and len(finals) < expect):
            return 2
        return 0


def prepare(manifest_path: Path, *, key: Path | None, artifact: Path | None,
            url: str | None, inline: bool, target: str | None = None,
            ttl_s: float = DEFAULT_TTL_S,
            seq: int | None = None) -> tuple[dict[str, Any], bytes | None]:
    """The manifest to publish (signed when `key` is given, fresh for topic root `target`, or
    the manifest's own target) and the inline artifact bytes."""
    doc = read_manifest(manifest_path)
    given: dict[str, Any] = doc["artifact"] if isinstance(doc.get("artifact"), dict) else {}
    data = None
    if artifact is not None:
        described = describe_artifact(artifact)
        if inline:
            data = artifact.read_bytes()
            described["chunks"] = max(1, -(-len(data) // CHUNK_BYTES))
        elif url is not None:
            described["url"] = url
        else:
            described["url"] = given.get("url")
        changed = {k: v for k, v in described.items() if given.get(k) != v}
        if changed and key is None:
            raise ToolError(f"the manifest's {', '.join(changed)} do not match what is being "
                            "sent; pass --key to fill them in and sign it")
        doc["artifact"] = {k: v for k, v in described.items() if v is not None}
    elif inline or url is not None:
        raise ToolError("--serve and --inline send the --artifact file: give it")
    if key is not None:
        body = {k: v for k, v in doc.items() if k not in ("signature", "key_id")}
        fresh_for = target or body.get("target")
        if isinstance(fresh_for, str) and fresh_for:  # push always names it
            body.update(freshness(fresh_for, ttl_s=ttl_s, seq=seq))
        doc = sign_document(body, load_private_key(key))
    try:
        parse_manifest(json.dumps(doc).encode())  # as a device will read it
    except Rejected as exc:
        raise ToolError(f"{manifest_path}: a device would refuse it: {exc}") from None
    return doc, data if inline else None


@contextmanager
def serve(path: Path, bind: str, advertise: str | None) -> Iterator[str]:
    """Serve `path` over HTTP (with Range, for resumed downloads) while the block runs;
    yields its URL."""
    host, port = _host_port(bind, "--serve", any_port=True)
    shown = advertise or host
    if shown in ("0.0.0.0", "::", ""):
        raise ToolError("--serve binds every address: say which one devices reach with "
                        "--url-host")
    shown = f"[{shown}]" if ":" in shown else shown
    httpd = ThreadingHTTPServer((host, port), _file_handler(path))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, name="edged-ota-serve", daemon=True)
    thread.start()
    try:
        yield f"http://{shown}:{httpd.server_address[1]}/{path.name}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _host_port(value: str, option: str, *, any_port: bool = False) -> tuple[str, int]:
    """HOST:PORT (port 0: any free one, where `any_port`), or a ToolError naming `option`."""
    try:
        if any_port and value.endswith(":0"):
            return split_host_port(value[:-1] + "1")[0], 0
        return split_host_port(value)
    except ValueError as exc:
        raise ToolError(f"{option}: {exc}") from None


def _file_handler(path: Path) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != f"/{path.name}":
                self.send_error(404)
                return
            size = path.stat().st_size
            start, end = 0, size - 1
            header = self.headers.get("Range", "")
            if header.startswith("bytes="):
                first, _, last = header[6:].partition("-")
                try:
                    start = int(first)
                    end = min(int(last), size - 1) if last else size - 1
                except ValueError:
                    self.send_error(416)
                    return
                if start > end:
                    self.send_error(416)
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(end - start + 1))
            self.end_headers()
            with path.open("rb") as f:
                f.seek(start)
                left = end - start + 1
                while left > 0:
                    block = f.read(min(left, 1 << 20))
                    if not block:
                        break
                    self.wfile.write(block)
                    left -= len(block)

        def log_message(self, fmt: str, *args: Any) -> None:
            sys.stderr.write(f"serve: {self.address_string()} {fmt % args}\n")

    return Handler


class Session:
    """One MQTT connection for publishing and following status topics."""

    def __init__(self, broker: Broker) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        self.events: queue.Queue[tuple[str, bytes, bool]] = queue.Queue()
        self._client = paho.Client(CallbackAPIVersion.VERSION2,
                                   client_id=f"edged-ota-{os.getpid()}")
        if broker.username is not None:
            password = broker.password_file.read_text().rstrip("\r\n") \
                if broker.password_file else None
            self._client.username_pw_set(broker.username, password)
        if broker.ca_file is not None:
            try:
                self._client.tls_set(ca_certs=str(broker.ca_file),
                                     cert_reqs=ssl.CERT_REQUIRED)
            except (OSError, ssl.SSLError) as exc:
                raise ToolError(f"--ca-file: {exc}") from None
        self._connected = threading.Event()
        self._refused = ""
        self._subscribed = threading.Condition()
        self._acked: set[int] = set()
        self._client.on_connect = self._on_connect
        self._client.on_subscribe = self._on_subscribe
        self._client.on_message = lambda _c, _u, m: self.events.put(
            (m.topic, bytes(m.payload), bool(m.retain)))
        try:
            self._client.connect(broker.host, broker.port, keepalive=30)
        except OSError as exc:
            raise ToolError(f"cannot reach the broker {broker.host}:{broker.port}: "
                            f"{exc}") from None
        self._client.loop_start()
        if not self._connected.wait(CONNECT_TIMEOUT_S) or self._refused:
            self.close()
            raise ToolError(f"the broker {broker.host}:{broker.port} did not accept us: "
                            f"{self._refused or 'no answer'}")

    def _on_connect(self, _client: Any, _userdata: Any, _flags: Any, reason: Any,
                    _properties: Any = None) -> None:
        if reason.is_failure:
            self._refused = str(reason)
        self._connected.set()

    def _on_subscribe(self, _client: Any, _userdata: Any, mid: int, *_rest: Any) -> None:
        with self._subscribed:
            self._acked.add(mid)
            self._subscribed.notify_all()

    def follow(self, topics: list[str]) -> None:
        """Subscribe, and wait for the broker's SUBACK: no status can be missed after."""
        _result, mid = self._client.subscribe([(t, 1) for t in topics])
        with self._subscribed:
            if not self._subscribed.wait_for(lambda: mid in self._acked, CONNECT_TIMEOUT_S):
                raise ToolError(f"the broker did not confirm the subscription to {topics}")

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self._client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(30)

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


def follow_status(session: Session, target: Target, model: str, version: int | None,
                  timeout_s: float, out: TextIO, *, quiet_s: float = 10.0) -> Outcome:
    """Print status events of `model` from the watched devices until each expected device
    reaches a final state, or `timeout_s` passes (or, with no expected count, `quiet_s`
    passes without news once every device seen is final)."""
    outcome = Outcome()
    deadline = time.monotonic() + timeout_s
    last_news = time.monotonic()
    while time.monotonic() < deadline:
        finals = {d for d, e in outcome.states.items() if e["state"] in FINAL}
        if finals and finals == set(outcome.states):
            if target.expect is not None and len(finals) >= target.expect:
                break
            if target.expect is None and time.monotonic() - last_news > quiet_s:
                break
        try:
            topic, payload, retained = session.events.get(timeout=0.2)
        except queue.Empty:
            continue
        if retained:  # an earlier update's outcome, kept by the broker: not this one's
            continue
        device = topic.rsplit(topics.OTA, 1)[0]
        try:
            event = json.loads(payload)
            state = str(event["state"])
        except (ValueError, KeyError, TypeError):
            continue
        if version is not None and state != OtaState.ROLLED_BACK and \
                event.get("version") != version:
            continue
        previous = outcome.states.get(device, {})
        if previous.get("state") == OtaState.FAILED and state == OtaState.ROLLED_BACK:
            event["ok"] = False  # the rollback that followed a failure: still a failure
            event["reason"] = previous.get("reason")
        elif state == OtaState.ROLLED_BACK and version is None:
            event["ok"] = True  # what `edged ota rollback` asked for
        outcome.states[device] = event
        last_news = time.monotonic()
        out.write(_line(device, model, event))
        out.flush()
    return outcome


def _line(device: str, model: str, event: dict[str, Any]) -> str:
    text = f"{device}  {model}:{event.get('version')}  {event['state']}"
    if event.get("progress") is not None and event["state"] == OtaState.DOWNLOADING:
        text += f" {event['progress']:.0f}%"
    if event.get("reason"):
        text += f" [{event['reason']}]"
    if event.get("detail"):
        text += f"  {event['detail']}"
    return text + "\n"


def summary(outcome: Outcome, target: Target, out: TextIO) -> int:
    code = outcome.code(target.expect)
    counts: dict[str, int] = {}
    for event in outcome.states.values():
        counts[event["state"]] = counts.get(event["state"], 0) + 1
    answered = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no answer"
    missing = (target.expect or 0) - sum(1 for e in outcome.states.values()
                                         if e["state"] in FINAL)
    tail = f"; {missing} device(s) did not finish in time" if missing > 0 else ""
    out.write(f"{'done' if code == 0 else 'FAILED'}: {answered}{tail}\n")
    return code


def push(manifest_path: Path, broker: Broker, target: Target, *, key: Path | None = None,
         artifact: Path | None = None, serve_at: str | None = None, url_host: str | None = None,
         inline: bool = False, retain: bool = False, timeout_s: float = 600.0,
         ttl_s: float = DEFAULT_TTL_S, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if serve_at is not None and inline:
        raise ToolError("--serve and --inline are two ways to send the artifact: pick one")
    if serve_at is not None:
        if artifact is None:
            raise ToolError("--serve needs --artifact FILE")
        with serve(artifact, serve_at, url_host) as url:
            out.write(f"serving {artifact} at {url}\n")
            return _push(manifest_path, broker, target, key, artifact, url, inline, retain,
                         timeout_s, ttl_s, out)
    return _push(manifest_path, broker, target, key, artifact, None, inline, retain, timeout_s,
                 ttl_s, out)


def _push(manifest_path: Path, broker: Broker, target: Target, key: Path | None,
          artifact: Path | None, url: str | None, inline: bool, retain: bool,
          timeout_s: float, ttl_s: float, out: TextIO) -> int:
    # One signed manifest per topic root: each carries the root it is for (its target).
    docs, data = {}, None
    for topic in target.topics:
        docs[topic], data = prepare(manifest_path, key=key, artifact=artifact, url=url,
                                    inline=inline, target=topic, ttl_s=ttl_s)
    doc = docs[target.topics[0]]
    model, version = str(doc["model"]), int(doc["version"])
    session = Session(broker)
    try:
        session.follow([topics.under(w, topics.ota_status(model)) for w in target.watch])
        for topic in target.topics:
            publish_manifest(session, topic, model, docs[topic], data, retain=retain)
        out.write(f"pushed {model}:{version} to {', '.join(target.topics)}"
                  f"{' (retained)' if retain else ''}\n")
        outcome = follow_status(session, target, model, version, timeout_s, out)
    finally:
        session.close()
    return summary(outcome, target, out)


def publish_manifest(session: Session, root: str, model: str, doc: dict[str, Any],
                     data: bytes | None, *, retain: bool = False) -> None:
    """The manifest on `<root>/ota/<model>`, then the artifact's chunks when sent inline."""
    session.publish(topics.under(root, topics.ota(model)),
                    json.dumps(doc, separators=(",", ":")).encode(), retain=retain)
    if data is not None:
        for index in range(0, len(data), CHUNK_BYTES):
            session.publish(topics.under(root, topics.ota_chunk(model, index // CHUNK_BYTES)),
                            data[index:index + CHUNK_BYTES])


def rollback(model: str, broker: Broker, target: Target, key: Path | None, *,
             from_version: int | None = None, timeout_s: float = 120.0,
             ttl_s: float = DEFAULT_TTL_S, out: TextIO | None = None) -> int:
    """Signed rollback commands on `<target>/ota/<model>/command`, each fresh for its topic
    root; with `from_version`, only devices serving that version roll back (the others answer
    that nothing was to do)."""
    unsigned: dict[str, Any] = {"model": model, "action": "rollback"}
    if from_version is not None:
        unsigned["from_version"] = from_version
    return _command(unsigned, broker, target, key, timeout_s, ttl_s, out or sys.stdout,
                    f"to roll {model} back")


def decide(model: str, promote: bool, broker: Broker, target: Target, key: Path | None, *,
           version: int | None = None, timeout_s: float = 120.0,
           ttl_s: float = DEFAULT_TTL_S, out: TextIO | None = None) -> int:
    """Signed `promote` or `reject` commands for the candidate that a shadow rollout is
    proving (only `version`, when given); a rejection clears the retained manifest too."""
    unsigned: dict[str, Any] = {"model": model, "action": "promote" if promote else "reject"}
    if version is not None:
        unsigned["version"] = version
    return _command(unsigned, broker, target, key, timeout_s, ttl_s, out or sys.stdout,
                    f"to {unsigned['action']} the candidate of {model}", clear=not promote)


def _command(unsigned: dict[str, Any], broker: Broker, target: Target, key: Path | None,
             timeout_s: float, ttl_s: float, out: TextIO, what: str, *,
             clear: bool = True) -> int:
    """Send one command to each topic root (signed and fresh for it when `key` is given) and
    follow the devices' status."""
    model = str(unsigned["model"])
    commands = {topic: unsigned for topic in target.topics}
    if key is not None:
        private = load_private_key(key)
        commands = {topic: sign_document({**unsigned, **freshness(topic, ttl_s=ttl_s)}, private)
                    for topic in target.topics}
    session = Session(broker)
    try:
        session.follow([topics.under(w, topics.ota_status(model)) for w in target.watch])
        for topic in target.topics:
            if clear:  # a retained manifest would bring the version back at the next reconnect
                session.publish(topics.under(topic, topics.ota(model)), b"", retain=True)
            session.publish(topics.under(topic, topics.ota_command(model)),
                            json.dumps(commands[topic], separators=(",", ":")).encode())
        out.write(f"asked {', '.join(target.topics)} {what}"
                  f"{' (and cleared any retained manifest there)' if clear else ''}\n")
        outcome = follow_status(session, target, model, None, timeout_s, out)
    finally:
        session.close()
    if unsigned["action"] == "reject":  # what was asked for: the candidate is gone
        for event in outcome.states.values():
            if event.get("reason") == "rejected_by_operator":
                event["ok"] = True
    return summary(outcome, target, out)
