"""The small parts behind fleets: local installs before the daemon's warm-up, the MQTT
requests' token bucket, user properties and config checks."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from support.backends import options

from edged.config import parse_config
from edged.core.errors import ConfigError, InvalidInput
from edged.inference.cache import ModelCache
from edged.model.repository import ModelRepository
from edged.mqtt.requests import TokenBucket, _json_length
from edged.ota.config import OtaConfig
from edged.ota.install import Updater
from edged.ota.local import LocalInstalls
from edged.ota.manifest import Rejected, TrustStore


def test_local_installs_when_not_yet_recovered_refuse_as_busy(repo: ModelRepository,
                                                               tmp_path: Path) -> None:
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path))
    local = LocalInstalls(Updater(repo, cache, OtaConfig(), TrustStore({}), lambda e: None))
    with pytest.raises(Rejected) as refused:
        local.staging()
    assert refused.value.reason == "busy"
    with pytest.raises(Rejected) as refused:
        local.begin(b"{}", None, hold=True)
    assert refused.value.reason == "busy"
    local.recover()
    assert local.staging().is_dir()
    local.stop(1)


def test_token_bucket_when_drained_refills_at_its_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(2.0, 3, clock=lambda: now[0])
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    now[0] += 0.5  # one token at 2/s
    assert [bucket.take(), bucket.take()] == [True, False]
    now[0] += 100  # never more than the burst
    assert sum(bucket.take() for _ in range(10)) == 3


@pytest.mark.parametrize(("props", "expected"), [
    (None, None), ([], None), ([("other", "1")], None),
    ([("Inference-Header-Content-Length", "120")], 120),
    ([("inference-header-content-length", "0")], 0),
])
def test_json_length_when_given_as_a_user_property_is_read(props: list | None,
                                                           expected: int | None) -> None:
    assert _json_length(SimpleNamespace(UserProperty=props)) == expected


@pytest.mark.parametrize("value", ["-1", "12a", ""])
def test_json_length_when_not_a_number_is_invalid_input(value: str) -> None:
    with pytest.raises(InvalidInput):
        _json_length(SimpleNamespace(UserProperty=[("Inference-Header-Content-Length", value)]))


@pytest.mark.parametrize(("yaml", "where"), [
    ("{protocol: '3.1.1', requests: {enabled: true}}", "mqtt.requests.enabled"),
    ("{max_packet_mb: 2, requests: {enabled: true, max_request_mb: 4}}",
     "mqtt.requests.max_request_mb"),
    ("{requests: {clients: [{name: a, response_topics: [r/a/#]}, "
     "{name: a, response_topics: [r/b]}]}}", "mqtt.requests.clients[1].name"),
    ("{requests: {clients: [{name: a, response_topics: ['r/#/x']}]}}",
     "mqtt.requests.clients[0].response_topics"),
    ("{requests: {clients: [{name: a, response_topics: []}]}}",
     "mqtt.requests.clients[0].response_topics"),
])
def test_requests_config_when_it_cannot_work_names_the_key(yaml: str, where: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config(f"mqtt: {yaml}\n")
    assert any(issue.path == where for issue in error.value.issues), error.value.issues


def test_requests_config_when_off_is_not_held_to_the_packet_bound() -> None:
    assert not parse_config("mqtt: {max_packet_mb: 1}\n").mqtt.requests.enabled
