"""The Grafana dashboard (deploy/grafana/edged.json) against what /metrics really exports: every
metric a panel or a variable queries, and every label it filters or groups by, exists on a
running daemon's /metrics (the demo's streams, MQTT on a real broker, a Jetson's sysfs faked,
an update recorded), so a renamed metric or label fails here and not on a user's wall. The file
is what tools/make_grafana.py writes."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.broker import Broker
from support.daemon import ServeFactory
from support.demo import demo_streams
from support.polling import wait_until

from edged.core.states import OtaState
from edged.hardware import host
from edged.hardware.tegra import Tegra
from edged.ota.install import Event
from tests.support.jetson_sysfs import orin_root
from tools import make_grafana

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "edged.json"
# PromQL words that are not metric names: functions, aggregations and their modifiers.
KEYWORDS = {"sum", "avg", "min", "max", "count", "rate", "irate", "increase", "by", "without",
            "on", "ignoring", "group_left", "group_right", "histogram_quantile", "and", "or",
            "unless", "bool", "offset", "topk", "bottomk", "delta", "deriv"}
ADDED_BY_PROMETHEUS = {"instance", "job"}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
            "gauge": ("",), "summary": ("", "_sum", "_count"), "untyped": ("",)}


def queries(node: Any) -> Iterator[str]:
    """Every PromQL expression in the dashboard: panel targets and variable queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, dict) and "query" in value:
                yield value["query"]
            else:
                yield from queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from queries(item)


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric, labels it is filtered or grouped by) for each metric an expression reads."""
    values = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", expr)
    if values:  # a variable's values: the label of the metric
        return [(name, labels | {values.group(2)}) for name, labels in selectors(values[1])]
    expr = re.sub(r"\$\w+", "", expr)  # Grafana's variables ($__rate_interval, $model)
    grouped = {label.strip() for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
               for label in group.split(",") if label.strip()}
    found = []
    for match in re.finditer(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?", expr):
        name, matchers = match.group(1), match.group(2) or ""
        after = expr[match.end():].lstrip()
        if name in KEYWORDS or after.startswith("(") or name in grouped or name == "le":
            continue
        if re.fullmatch(r"[0-9.e+-]+", name):
            continue
        labels = set(re.findall(r"([a-zA-Z_]\w*)\s*[=!~]", matchers))
        found.append((name, labels | grouped))
    return found


def exported(text: str) -> dict[str, set[str]]:
    """Sample name -> label names, from an exposition; a family without samples yet counts
    with the names its type gives it."""
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES.get(family.type, ("",)):
            names.setdefault(family.name + suffix, set())
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


@pytest.fixture
def orin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = orin_root(tmp_path / "orin")
    monkeypatch.setattr(host, "TEGRA", Tegra(root, min_interval_s=0.05))
    return root


def test_dashboard_when_a_daemon_runs_queries_only_metrics_and_labels_it_exports(
        orin: Path, broker: Broker, make_served: ServeFactory, repo_dir: Path,
        tmp_path: Path) -> None:
    from tools.assets import models as test_models

    test_models.write_repository(repo_dir, names=["colors", "grid_det"])
    served = make_served(cache="preload: [colors, grid_det]",
                         mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: t/grafana",
                         streams=json.dumps(demo_streams(tmp_path)))
    served.daemon.ota_progress.record(Event("colors", 2, OtaState.ACTIVE, "installed"))

    def lived() -> str | None:
        """/metrics once an object has come and gone, and crossed the line."""
        with urllib.request.urlopen(f"http://{served.http}/metrics", timeout=10) as reply:
            text = str(reply.read().decode())
        ended = re.search(r'edged_events_total\{stream="crossing",type="end"\} [1-9]', text)
        return text if ended and "edged_line_crossings_total{" in text else None

    text = wait_until(lived, timeout=60, what="an object's whole life on /metrics")
    metrics = exported(text)
    dashboard = json.loads(DASHBOARD.read_text())
    checked = 0
    for expr in queries(dashboard):
        for name, labels in selectors(expr):
            assert name in metrics, f"{name} (in {expr!r}) is not on /metrics"
            missing = labels - metrics[name] - ADDED_BY_PROMETHEUS
            if metrics[name]:  # (a family without samples here has no labels to check)
                assert not missing, f"{name} has no label {missing} (in {expr!r})"
            checked += 1
    assert checked > 50


def test_dashboard_when_compared_with_its_generator_is_what_it_writes() -> None:
    assert DASHBOARD.read_text(encoding="utf-8") == make_grafana.render(), \
        "deploy/grafana/edged.json: run python tools/make_grafana.py"


def test_selectors_when_given_promql_find_metrics_not_functions_or_labels() -> None:
    found = selectors('histogram_quantile(0.99, sum by (model, le) (rate(edged_x_bucket'
                      '{instance=~"$instance", model=~"$model"}[$__rate_interval]))) / '
                      'edged_y{stream="a"} * 60')
    assert found == [("edged_x_bucket", {"instance", "model", "le"}),
                     ("edged_y", {"stream", "model", "le"})]
    assert selectors('label_values(edged_model_ready{instance=~"$instance"}, model)') == [
        ("edged_model_ready", {"instance", "model"})]
