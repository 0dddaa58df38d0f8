"""MQTT 5 prompts to a language model on a real mosquitto, the daemon in-process with the real
SmolLM2 GGUF: one answer with the whole text, or streamed pieces with the same correlation data
and a final marker, the same text either way; a prompt too long for the context and a tensor
model asked to generate answer with the socket's codes; a response topic outside the allowlist
gets nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.broker import Broker
from support.daemon import Served, ServeFactory
from support.mqtt_requests import Answer, Requester
from support.polling import wait_until

from tools.real_models import LANGUAGE_MODEL

PREFIX = "t/llm"
TOPIC = f"{PREFIX}/generate"


@pytest.fixture
def device(broker: Broker, make_served: ServeFactory, real_models: Path, repo_dir: Path
           ) -> Iterator[tuple[Served, Requester]]:
    (repo_dir / "smol" / "1").mkdir(parents=True)
    (repo_dir / "smol" / "1" / "model.gguf").symlink_to(real_models / LANGUAGE_MODEL)
    (repo_dir / "smol" / "model.yaml").write_text("llm: {context: 256, threads: 1}\n")
    served = make_served(cache="preload: [smol]", mqtt=(
        f"host: 127.0.0.1, port: {broker.port}, prefix: {PREFIX}, requests: {{enabled: true, "
        "clients: [{name: a, response_topics: ['replies/a/#']}]}"))
    assert served.daemon.mqtt is not None and served.daemon.mqtt.wait_connected(10)
    assert served.daemon.mqtt.wait_subscribed([f"{TOPIC}/+"], 10)
    requester = Requester(broker.port, "a")
    try:
        yield served, requester
    finally:
        requester.close()


def prompt(**fields: object) -> bytes:
    return json.dumps({"text_input": "1, 2, 3, 4,", "max_tokens": 6, "temperature": 0,
                       **fields}).encode()


def final(answer: Answer) -> bool:
    return bool(answer.json().get("final"))


def test_prompt_when_asked_answers_once_or_streams_the_same_text(
        device: tuple[Served, Requester]) -> None:
    _, requester = device
    whole = requester.call(f"{TOPIC}/smol", prompt())
    assert whole.status == 200 and whole.content_type == "application/json"
    answer = whole.json()
    assert answer["final"] is True and answer["model_version"] == "1"
    assert answer["finish_reason"] in ("stop", "length")
    assert 0 < answer["usage"]["completion_tokens"] <= 6
    correlation = requester.ask(f"{TOPIC}/smol", prompt(parameters={"stream": True}))
    messages = [m.json() for m in requester.stream(correlation, final)]
    assert len(messages) >= 3 and messages[-1]["final"] is True
    assert not any(m.get("final") for m in messages[:-1])
    assert "".join(m["text_output"] for m in messages) == answer["text_output"]


def test_prompt_when_bad_answers_with_the_sockets_codes(
        device: tuple[Served, Requester]) -> None:
    _, requester = device
    too_long = requester.call(f"{TOPIC}/smol", prompt(text_input="word " * 400))
    assert too_long.status == 400 and too_long.json()["code"] == "invalid_input"
    assert "the context holds 256" in too_long.json()["error"]
    assert too_long.json()["final"] is True
    malformed = requester.call(f"{TOPIC}/smol", b"{not json")
    assert malformed.status == 400 and "malformed JSON" in malformed.json()["error"]
    tensor = requester.call(f"{TOPIC}/tiny_cls", prompt())
    assert tensor.status == 400 and "not a language model" in tensor.json()["error"]
    assert "/" not in tensor.json()["error"].split("(")[0]  # no path of the device
    served, _ = device
    requests = served.daemon.requests
    assert requests is not None
    requester.ask(f"{TOPIC}/smol", prompt(), response_topic="elsewhere/x")
    wait_until(lambda: requests.stats()["not_allowed"] == 1,
               what="the prompt refused for its response topic")
