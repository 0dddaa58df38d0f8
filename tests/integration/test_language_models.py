"""A language model served by the running daemon: the real SmolLM2 GGUF from its wheel, next
to an ONNX model, driven as users drive it: OpenAI's own Python client on the loopback TCP
listener (chat and completions, streamed and not), `curl` on Triton's generate routes over the
Unix socket, a client that hangs up mid-stream (its generation stops), the fair queue
(priorities, its bound, a deadline), and the bad requests. The model is loaded once for the
module; answers are a few tokens (max_tokens small) and their quality is never judged."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from support.daemon import Served, serve
from support.polling import wait_until
from support.ports import free_port

from edged.config import parse_config
from edged.core.errors import QueueFull, Timeout
from edged.inference.generation import Ask, Done, Generation, Started
from tools.real_models import LANGUAGE_MODEL

CONTEXT = 256
COUNTING = "1 2 3 4 5 6 7 8 9 10"  # greedy SmolLM2 goes on counting: a long answer


@pytest.fixture(scope="module")
def llm(real_models: Path, repo_template: Path,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("llm")
    models = root / "models"
    (models / "smol" / "1").mkdir(parents=True)
    (models / "smol" / "1" / "model.gguf").symlink_to(real_models / LANGUAGE_MODEL)
    (models / "smol" / "model.yaml").write_text(
        f"llm: {{context: {CONTEXT}, threads: 1, max_tokens: 8, max_queue: 3, sequences: 2}}\n")
    (models / "smol1" / "1").mkdir(parents=True)  # the same file, one answer at a time
    (models / "smol1" / "1" / "model.gguf").symlink_to(real_models / LANGUAGE_MODEL)
    (models / "smol1" / "model.yaml").write_text(
        f"llm: {{context: {CONTEXT}, threads: 1, sequences: 1}}\n")
    shutil.copytree(repo_template / "tiny_cls", models / "tiny_cls")
    short = Path(tempfile.mkdtemp(prefix="ed-", dir="/tmp"))
    sock, port = short / "s.sock", free_port()
    config = parse_config(f"""device_id: test
models_dir: {models}
cache: {{dir: {root / 'cache'}, preload: [smol, smol1, tiny_cls]}}
backends: {{onnxruntime: {{providers: [cpu], intra_op_threads: 1}}}}
api: {{socket: {sock}, http: "127.0.0.1:{port}"}}
mqtt: {{enabled: false}}
streams: []
""")
    running = serve(config)
    try:
        yield Served(next(running), sock, f"127.0.0.1:{port}")
    finally:
        next(running, None)
        shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def client(llm: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{llm.http}/v1", api_key="unused", max_retries=0,
                         timeout=60)


def curl(llm: Served, path: str, body: Any, *extra: str) -> tuple[int, str]:
    data = body if isinstance(body, str) else json.dumps(body)
    done = subprocess.run(["curl", "-sS", "--unix-socket", str(llm.socket), "-w",
                           "\n%{http_code}", "-H", "Content-Type: application/json",
                           "-d", data, *extra, f"http://localhost{path}"],
                          capture_output=True, text=True, timeout=60, check=True)
    text, _, status = done.stdout.rpartition("\n")
    return int(status), text


def counters(llm: Served) -> dict[str, Any]:
    """The model's generation counts, as `edged status` reads them."""
    with llm.client() as client:
        generations: dict[str, Any] = client.status()["generations"]
    return generations.get("smol", {})


# -- OpenAI's client -----------------------------------------------------------------------
def test_openai_chat_when_asked_answers_in_openais_shape(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Say hello."}], max_tokens=6,
        temperature=0)
    choice = answer.choices[0]
    assert answer.object == "chat.completion" and answer.model == "smol"
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert answer.usage is not None and 0 < answer.usage.completion_tokens <= 6
    assert answer.usage.prompt_tokens > 5  # the chat template's tokens too


def test_openai_chat_when_streamed_gives_the_same_text(client: openai.OpenAI) -> None:
    ask: dict[str, Any] = {"model": "smol", "max_tokens": 8, "temperature": 0,
                           "messages": [{"role": "user", "content": "Count to five."}]}
    whole = client.chat.completions.create(**ask).choices[0].message.content
    chunks = list(client.chat.completions.create(**ask, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length") and set(finishes[:-1]) == {None}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 8


def test_openai_completion_when_stop_given_ends_before_it(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="smol", prompt="1, 2, 3, 4, 5,", max_tokens=8,
                                       temperature=0, stop=[","])
    assert answer.choices[0].text.strip() == "6"
    assert answer.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model="smol", prompt="1, 2, 3, 4, 5,", max_tokens=8,
                                         temperature=0, stop=[","], stream=True)
    assert "".join(c.choices[0].text for c in streamed) == answer.choices[0].text


def test_openai_models_when_listed_names_the_language_models_only(
        client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["smol", "smol1"]


def test_openai_when_request_is_bad_answers_400_in_openais_shape(
        client: openai.OpenAI) -> None:
    bad: list[tuple[dict[str, Any], str]] = [
        ({"messages": [{"role": "robot", "content": "hi"}]}, "role must be one of"),
        ({"messages": []}, "messages must be a list of 1"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n: only 1"),
        ({"messages": [{"role": "user", "content": "word " * 400}]},
         f"the context holds {CONTEXT}"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": 9},
         "temperature must be a number from 0"),
    ]
    for extra, message in bad:
        with pytest.raises(openai.BadRequestError, match=message) as caught:
            client.chat.completions.create(model="smol", **{"max_tokens": 2, **extra})
        assert caught.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="not a language model"):
        client.completions.create(model="tiny_cls", prompt="hi", max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nothing", prompt="hi", max_tokens=2)


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["person", "threat"],
          "properties": {"person": {"type": "boolean"},
                         "threat": {"type": "integer", "minimum": 0, "maximum": 2}}}


def test_openai_chat_when_json_schema_given_answers_json_that_fits_it(
        client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "A man walks past a parked car at night."}]
    answer = client.chat.completions.create(
        model="smol", messages=messages, max_tokens=40, temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "review", "schema": SCHEMA}})
    assert answer.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(answer.choices[0].message.content or ""), SCHEMA)
    anything = client.chat.completions.create(
        model="smol", messages=messages, max_tokens=8, temperature=0,
        response_format={"type": "json_object"})
    assert (anything.choices[0].message.content or "").lstrip().startswith("{")
    with pytest.raises(openai.BadRequestError, match="cannot be made a grammar"):
        client.chat.completions.create(model="smol", messages=messages, max_tokens=2,
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "x", "schema": {"type": "nosuchtype"}}})
    with pytest.raises(openai.BadRequestError, match=r"response_format\.type must be"):
        client.chat.completions.create(model="smol", messages=messages, max_tokens=2,
                                       response_format={"type": "xml"})  # type: ignore[arg-type]


def test_openai_when_seed_given_samples_the_same_answer_on_either_path(
        client: openai.OpenAI) -> None:
    def ask(model: str, seed: int) -> str:
        return client.completions.create(
            model=model, prompt="In the middle of the night, a small fox",
            max_tokens=16, temperature=1.0, seed=seed).choices[0].text

    first = ask("smol", 11)
    assert ask("smol", 11) == first == ask("smol1", 11)  # batched, or one at a time
    assert len({first, ask("smol", 12), ask("smol", 13)}) > 1


def test_openai_routes_when_curl_sends_what_clients_may_answer_each_in_openais_shape(
        llm: Served) -> None:
    hi: Any = [{"role": "user", "content": "hi"}]
    cases: list[tuple[str, Any, int, str]] = [
        ("chat", {"model": "smol", "max_tokens": 1, "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, 200, ""),
        ("chat", {"model": "smol", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "only text parts"),
        ("chat", {"model": "smol", "messages": "hi"}, 400, "messages must be a list"),
        ("chat", {"model": "smol", "messages": [5]}, 400, "messages[0] must be an object"),
        ("chat", {"model": "smol", "messages": [{"role": "user", "content": 5}]}, 400,
         "messages[0].content must be a string"),
        ("chat", {"messages": hi}, 400, "model must name a language model"),
        ("chat", {"model": "smol", "messages": hi, "stream": "yes"}, 400,
         "stream must be true or false"),
        ("chat", {"model": "smol", "messages": hi, "stream_options": 5}, 400,
         "stream_options must be an object"),
        ("chat", {"model": "smol", "messages": hi, "response_format": {
            "type": "json_schema", "json_schema": {}}}, 400, "schema must be a JSON object"),
        ("chat", {"model": "smol", "messages": hi, "logprobs": True}, 400, "logprobs: only"),
        ("chat", {"model": "smol", "messages": hi, "tools": []}, 400,
         "unsupported fields ['tools']"),
        ("completions", {"model": "smol", "prompt": [1, 2]}, 400, "prompt must be a string"),
        ("completions", {"model": "smol", "prompt": ["hi"], "max_tokens": 1}, 200, ""),
    ]
    for route, body, want, message in cases:
        status, text = curl(llm, f"/v1/{route if route == 'completions' else 'chat/completions'}",
                            body)
        assert status == want, (body, text)
        if message:
            error = json.loads(text)["error"]
            assert message in error["message"] and error["type"] == "invalid_request_error"
            assert error["code"] == "invalid_input"


# -- Triton's generate with curl -----------------------------------------------------------
def test_generate_when_curl_asks_answers_text_output(llm: Served) -> None:
    status, text = curl(llm, "/v2/models/smol/generate",
                        {"text_input": COUNTING, "max_tokens": 4,
                         "parameters": {"temperature": 0}})
    assert status == 200, text
    answer = json.loads(text)
    assert answer["model_name"] == "smol" and answer["model_version"] == "1"
    status, streamed = curl(llm, "/v2/models/smol/versions/1/generate_stream",
                            {"text_input": COUNTING, "max_tokens": 4, "temperature": 0}, "-N")
    assert status == 200
    events = [json.loads(line[len("data: "):]) for line in streamed.splitlines()
              if line.startswith("data: ")]
    assert len(events) >= 2 and all(e["model_version"] == "1" for e in events)
    assert "".join(e["text_output"] for e in events) == answer["text_output"]


def test_generate_when_request_is_bad_answers_400_naming_why(llm: Served) -> None:
    cases: list[tuple[str, Any, int, str]] = [
        ("smol", "{not json", 400, "malformed JSON"),
        ("smol", [1, 2], 400, "must be a JSON object"),
        ("smol", {"max_tokens": 2}, 400, "needs text_input"),
        ("smol", {"text_input": "hi", "beams": 4}, 400, "unknown fields ['beams']"),
        ("smol", {"text_input": 5}, 400, "text_input must be a string"),
        ("smol", {"text_input": "hi", "max_tokens": 0}, 400, "max_tokens must be an integer"),
        ("smol", {"text_input": "hi", "stop": ["a"] * 9}, 400, "stop must be"),
        ("smol", {"text_input": "hi", "seed": -1}, 400, "seed must be an integer from 0"),
        ("smol", {"text_input": "word " * 400}, 400,
         f"tokens; the context holds {CONTEXT}"),
        ("tiny_cls", {"text_input": "hi"}, 400, "not a language model"),
        ("nothing", {"text_input": "hi"}, 404, "nothing"),
    ]
    for model, body, want, message in cases:
        status, text = curl(llm, f"/v2/models/{model}/generate", body)
        assert status == want and message in json.loads(text)["error"], (body, text)


def test_infer_when_model_is_a_language_model_answers_400(llm: Served) -> None:
    status, text = curl(llm, "/v2/models/smol/infer", {"inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]})
    assert status == 400 and "is a language model" in text


def test_metadata_when_language_model_shows_text_in_and_out(llm: Served) -> None:
    with llm.client() as client:
        meta = client.model_metadata("smol")
    assert meta["inputs"] == [{"name": "text_input", "datatype": "BYTES", "shape": [1]}]
    assert meta["outputs"] == [{"name": "text_output", "datatype": "BYTES", "shape": [-1]}]


# -- a client gone, and the queue ----------------------------------------------------------
def test_generate_stream_when_client_hangs_up_stops_generating(llm: Served) -> None:
    before = counters(llm)
    body = json.dumps({"text_input": COUNTING, "max_tokens": 200, "temperature": 0}).encode()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(str(llm.socket))
        sock.sendall(b"POST /v2/models/smol/generate_stream HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        seen = b""
        while b"data: " not in seen:
            seen += sock.recv(4096)
        assert seen.startswith(b"HTTP/1.1 200")
    after = wait_until(lambda: (c := counters(llm))["cancelled"] > before.get("cancelled", 0)
                       and not c["generating"] and c, what="the generation cancelled")
    assert after["completed"] == before.get("completed", 0)
    assert after["tokens"] - before.get("tokens", 0) < 200


def test_generate_when_client_of_a_whole_answer_hangs_up_stops_generating(
        llm: Served) -> None:
    before = counters(llm)
    body = json.dumps({"text_input": COUNTING, "max_tokens": 200, "temperature": 0}).encode()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(llm.socket))
        sock.sendall(b"POST /v2/models/smol/generate HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        wait_until(lambda: counters(llm)["generating"], what="the answer under way")
    after = wait_until(lambda: (c := counters(llm))["cancelled"] > before.get("cancelled", 0)
                       and not c["generating"] and c, what="the generation cancelled")
    assert after["tokens"] - before.get("tokens", 0) < 200


def test_queue_when_slots_are_busy_serves_higher_priority_first_and_bounds_the_rest(
        llm: Served) -> None:
    generations = llm.daemon.generations

    async def scenario() -> tuple[list[str], BaseException | None, BaseException | None,
                                  dict[str, Any]]:
        loop = asyncio.get_running_loop()

        def submit(priority: int, max_tokens: int = 1, timeout_s: float | None = None
                   ) -> Generation:
            return generations.submit(Ask("smol", prompt=COUNTING, max_tokens=max_tokens,
                                          temperature=0, priority=priority,
                                          timeout_s=timeout_s), loop)

        busy = [submit(1, max_tokens=200) for _ in range(2)]  # both sequences (llm.sequences)
        for generation in busy:
            assert isinstance(await generation.next(), Started)
        low, high = submit(2), submit(1, max_tokens=200)
        late = submit(1, timeout_s=0.3)
        refused: BaseException | None = None
        try:
            submit(1)  # the queue holds 3 (llm.max_queue)
        except QueueFull as exc:
            refused = exc
        timed_out = await late.next()  # failed by the deadline while both slots generate
        seen = generations.statistics()["smol"]
        order: list[str] = []
        busy[0].cancel()  # one slot frees: the higher priority takes it, the other waits
        assert isinstance(await asyncio.wait_for(high.next(), 60), Started)
        order.append("high")
        assert generations.statistics()["smol"]["queued"] == 1  # low: no slot yet
        busy[1].cancel()
        assert isinstance(await asyncio.wait_for(low.next(), 60), Started)
        order.append("low")
        high.cancel()
        for generation in (*busy, high, low):
            while not isinstance(await asyncio.wait_for(generation.next(), 60), Done):
                pass
        return order, refused, timed_out if isinstance(timed_out, Timeout) else None, seen

    order, refused, timed_out, seen = asyncio.run(scenario())
    assert order == ["high", "low"]
    assert isinstance(refused, QueueFull) and "llm.max_queue 3" in str(refused)
    assert isinstance(timed_out, Timeout)
    assert seen["generating"] == 2 and seen["queued"] == 2


def test_openai_when_chats_come_at_once_answers_as_one_at_a_time(
        client: openai.OpenAI) -> None:
    """Speed never buys a different answer: greedy chats and completions asked together of
    the batched model (two sequences, so the third waits for a slot and takes a freed one)
    answer what the same file answers one at a time. Three asks: the queue holds three."""
    asks: list[dict[str, Any]] = [
        {"messages": [{"role": "user", "content": "Describe a red car."}], "max_tokens": 20},
        {"prompt": "Once upon a time, in a town by the sea, there lived", "max_tokens": 24},
        {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 12, "stop": [" 9"]}]

    def ask(model: str, body: dict[str, Any]) -> tuple[str, str | None]:
        if "messages" in body:
            chat = client.chat.completions.create(model=model, temperature=0, **body)
            return chat.choices[0].message.content or "", chat.choices[0].finish_reason
        done = client.completions.create(model=model, temperature=0, **body)
        return done.choices[0].text, done.choices[0].finish_reason

    alone = [ask("smol1", body) for body in asks]
    got: dict[int, tuple[str, str | None]] = {}
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, ask("smol", asks[i])))
               for i in range(len(asks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [got.get(i) for i in range(len(asks))] == alone


def test_generation_when_running_yields_the_cpu_to_the_cameras(llm: Served) -> None:
    curl(llm, "/v2/models/smol/generate", {"text_input": "hi", "max_tokens": 1})
    worker = next(t for t in threading.enumerate() if t.name == "edged-generate-smol")
    assert worker.native_id is not None
    assert os.getpriority(os.PRIO_PROCESS, worker.native_id) == 10  # llm.nice's default
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 0


def test_metrics_when_generations_ran_counts_them_per_model(llm: Served) -> None:
    curl(llm, "/v2/models/smol/generate", {"text_input": "hi", "max_tokens": 2})
    with llm.client() as client:
        _, _, raw = client.request("GET", "/metrics")
    text = raw.decode()
    completed = re.search(r'^edged_generation_requests_total\{model="smol",'
                          r'outcome="completed"\} (\S+)$', text, re.M)
    tokens = re.search(r'^edged_generation_tokens_total\{model="smol"\} (\S+)$', text, re.M)
    assert completed is not None and float(completed.group(1)) >= 1
    assert tokens is not None and float(tokens.group(1)) >= 1
    assert 'edged_generation_queued{model="smol"} 0.0' in text


def test_openai_when_higher_priority_finds_slots_busy_pauses_a_low_one_answers_unchanged(
        client: openai.OpenAI, llm: Served) -> None:
    lows = [("Once upon a time, in a town by the sea, there lived", 7), (COUNTING, None)]

    def ask(prompt: str, seed: int | None, priority: int, max_tokens: int) -> Any:
        return client.completions.create(
            model="smol", prompt=prompt, max_tokens=max_tokens, stream=True,
            temperature=0.8 if seed is not None else 0, seed=seed,
            extra_body={"priority": priority})

    alone = ["".join(c.choices[0].text for c in ask(p, s, 2, 48) if c.choices)
             for p, s in lows]
    before = counters(llm).get("preempted", 0)
    streams = [ask(p, s, 2, 48) for p, s in lows]
    texts = [next(iter(stream)).choices[0].text for stream in streams]  # both generating
    high = client.completions.create(model="smol", prompt="The capital of France is",
                                     max_tokens=4, temperature=0, extra_body={"priority": 1})
    assert high.choices[0].finish_reason == "length"
    for i, stream in enumerate(streams):
        texts[i] += "".join(c.choices[0].text for c in stream if c.choices)
    assert texts == alone  # the paused one resumed where it was
    assert counters(llm)["preempted"] == before + 1
