"""Writes `deploy/grafana/edged.json`, the Grafana dashboard of edged's Prometheus metrics
(Grafana's JSON model, schemaVersion 39: import it in Grafana 10/11 and pick the Prometheus
data source). The dashboard is made here, from a list of panels and their queries, rather than
edited by hand: `tests/unit/test_grafana.py` checks that every metric it queries is one that
`/metrics` exports and that the file is what this script writes.

    python tools/make_grafana.py [OUT]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "edged.json"
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
ON = 'instance=~"$instance"'  # every query's instance filter
M = f'{ON}, model=~"$model"'
S = f'{ON}, stream=~"$stream"'
R = "$__rate_interval"
WIDTH = 24


def requests(scope: str) -> str:
    return (f"sum by (model) (rate(edged_inference_request_success_total{{{scope}}}[{R}]) + "
            f"rate(edged_inference_request_failure_total{{{scope}}}[{R}]))")


def quantile(q: str) -> dict[str, str]:
    return {"expr": f"histogram_quantile({q}, sum by (model, le) "
                    f"(rate(edged_inference_request_latency_seconds_bucket{{{M}}}[{R}])))",
            "legend": f"{{{{model}}}} p{q[2:].ljust(2, '0')}"}


# (title, kind, unit, [(expr, legend)], width, height); kind: timeseries | stat | row
PANELS: list[tuple[str, str, str, list[dict[str, str]], int, int]] = [
    ("Models", "row", "", [], WIDTH, 1),
    ("Models ready", "stat", "none", [
        {"expr": f"sum(edged_model_ready{{{ON}}})", "legend": "ready"}], 4, 4),
    ("Requests / s (all models)", "stat", "reqps", [
        {"expr": f"sum(rate(edged_inference_request_success_total{{{ON}}}[{R}]))",
         "legend": "ok"}], 5, 4),
    ("Failed or refused / s", "stat", "reqps", [
        {"expr": f"sum(rate(edged_inference_request_failure_total{{{ON}}}[{R}])) + "
                 f"sum(rate(edged_inference_request_rejected_total{{{ON}}}[{R}]))",
         "legend": "failed"}], 5, 4),
    ("Queued now", "stat", "none", [
        {"expr": f"sum(edged_inference_pending_request_count{{{ON}}})", "legend": "queued"}],
     5, 4),
    ("API errors / s", "stat", "reqps", [
        {"expr": f"sum(rate(edged_api_errors_total{{{ON}}}[{R}]))", "legend": "errors"}], 5, 4),
    ("Request rate by model", "timeseries", "reqps", [
        {"expr": requests(M), "legend": "{{model}}"}], 12, 8),
    ("Latency percentiles (queue + compute)", "timeseries", "s", [
        quantile("0.5"), quantile("0.9"), quantile("0.99")], 12, 8),
    ("Average time in queue and in the model", "timeseries", "µs", [
        {"expr": f"sum by (model) (rate(edged_inference_queue_duration_us_total{{{M}}}[{R}])) "
                 f"/ {requests(M)}", "legend": "{{model}} queue"},
        {"expr": f"sum by (model) (rate(edged_inference_compute_infer_duration_us_total"
                 f"{{{M}}}[{R}])) / sum by (model) (rate(edged_inference_exec_count_total"
                 f"{{{M}}}[{R}]))", "legend": "{{model}} compute per batch"}], 8, 8),
    ("Queue depth", "timeseries", "none", [
        {"expr": f"sum by (model) (edged_inference_pending_request_count{{{M}}})",
         "legend": "{{model}}"}], 8, 8),
    ("Batch size (rows per execution)", "timeseries", "none", [
        {"expr": f"sum by (model) (rate(edged_inference_count_total{{{M}}}[{R}])) / "
                 f"sum by (model) (rate(edged_inference_exec_count_total{{{M}}}[{R}]))",
         "legend": "{{model}}"}], 8, 8),
    ("Failures, refusals and timeouts", "timeseries", "reqps", [
        {"expr": f"sum by (model) (rate(edged_inference_request_failure_total{{{M}}}[{R}]))",
         "legend": "{{model}} failed"},
        {"expr": f"sum by (model) (rate(edged_inference_request_rejected_total{{{M}}}[{R}]))",
         "legend": "{{model}} queue full"},
        {"expr": f"sum by (model) (rate(edged_inference_request_timeout_total{{{M}}}[{R}]))",
         "legend": "{{model}} timed out"}], 12, 8),
    ("Loads, evictions, memory", "timeseries", "bytes", [
        {"expr": f"sum by (model) (edged_model_memory_bytes{{{M}}})",
         "legend": "{{model}} memory"},
        {"expr": f"sum by (model) (increase(edged_model_loads_total{{{M}}}[{R}]))",
         "legend": "{{model}} loads"},
        {"expr": f"sum by (model) (increase(edged_model_evictions_total{{{M}}}[{R}]))",
         "legend": "{{model}} evictions"}], 12, 8),
    ("Streams", "row", "", [], WIDTH, 1),
    ("Frames through the model, and held back by the change gate / s", "timeseries", "fps", [
        {"expr": f"sum by (stream) (rate(edged_stream_frames_processed_total{{{S}}}[{R}]))",
         "legend": "{{stream}} processed"},
        {"expr": f"sum by (stream) (rate(edged_stream_frames_gated_total{{{S}}}[{R}]))",
         "legend": "{{stream}} gated (picture unchanged)"}], 12, 8),
    ("Capture to result latency", "timeseries", "s", [
        {"expr": f'edged_stream_latency_seconds{{{S}, quantile="0.5"}}',
         "legend": "{{stream}} p50"},
        {"expr": f'edged_stream_latency_seconds{{{S}, quantile="0.99"}}',
         "legend": "{{stream}} p99"}], 12, 8),
    ("Frames skipped, dropped, failed / s", "timeseries", "fps", [
        {"expr": f"sum by (stream) (rate(edged_stream_frames_skipped_total{{{S}}}[{R}]))",
         "legend": "{{stream}} skipped (fps limit)"},
        {"expr": f"sum by (stream) (rate(edged_stream_frames_dropped_total{{{S}}}[{R}]))",
         "legend": "{{stream}} dropped (queue full)"},
        {"expr": f"sum by (stream) (rate(edged_stream_frames_failed_total{{{S}}}[{R}]))",
         "legend": "{{stream}} failed"}], 12, 8),
    ("Reconnects and state", "timeseries", "none", [
        {"expr": f"sum by (stream) (increase(edged_stream_reconnects_total{{{S}}}[{R}]))",
         "legend": "{{stream}} reconnects"},
        {"expr": f"edged_stream_up{{{S}}}", "legend": "{{stream}} up"},
        {"expr": f"edged_stream_queue_depth{{{S}}}", "legend": "{{stream}} queued"}], 12, 8),
    ("Events", "row", "", [], WIDTH, 1),
    ("Events / min", "timeseries", "none", [
        {"expr": f"sum by (stream, type) (rate(edged_events_total{{{S}}}[{R}])) * 60",
         "legend": "{{stream}} {{type}}"}], 8, 8),
    ("Objects tracked now", "timeseries", "none", [
        {"expr": f"sum by (stream, label) (edged_objects{{{S}}})",
         "legend": "{{stream}} {{label}}"}], 8, 8),
    ("Objects in zones now", "timeseries", "none", [
        {"expr": f"sum by (stream, zone, label) (edged_zone_objects{{{S}}})",
         "legend": "{{stream}} {{zone}} {{label}}"}], 8, 8),
    ("Line crossings (per interval)", "timeseries", "none", [
        {"expr": f"sum by (stream, line, direction) "
                 f"(increase(edged_line_crossings_total{{{S}}}[{R}]))",
         "legend": "{{stream}} {{line}} {{direction}}"}], 12, 8),
    ("Live viewers and pictures drawn / s", "timeseries", "none", [
        {"expr": f"sum by (stream) (edged_live_viewers{{{S}}})",
         "legend": "{{stream}} viewers"},
        {"expr": f"sum by (stream) (rate(edged_live_pictures_total{{{S}}}[{R}]))",
         "legend": "{{stream}} pictures / s"}], 12, 8),
    ("Device", "row", "", [], WIDTH, 1),
    ("GPU utilisation", "timeseries", "percentunit", [
        {"expr": f"edged_gpu_utilization{{{ON}}}", "legend": "gpu {{gpu}}"}], 8, 8),
    ("GPU memory", "timeseries", "bytes", [
        {"expr": f"edged_gpu_memory_used_bytes{{{ON}}}", "legend": "gpu {{gpu}} used"},
        {"expr": f"edged_gpu_memory_total_bytes{{{ON}}}", "legend": "gpu {{gpu}} total"}], 8, 8),
    ("Process", "timeseries", "bytes", [
        {"expr": f"process_resident_memory_bytes{{{ON}}}", "legend": "RSS"}], 8, 8),
    ("Jetson temperatures", "timeseries", "celsius", [
        {"expr": f"edged_gpu_temperature_celsius{{{ON}}}", "legend": "{{zone}}"}], 8, 8),
    ("Jetson power rails", "timeseries", "watt", [
        {"expr": f"edged_gpu_power_watts{{{ON}}}", "legend": "{{rail}}"}], 8, 8),
    ("Jetson clocks and throttling", "timeseries", "hertz", [
        {"expr": f"edged_gpu_clock_hz{{{ON}}}", "legend": "{{clock}}"},
        {"expr": f"edged_gpu_clock_max_hz{{{ON}}}", "legend": "{{clock}} cap"},
        {"expr": f"edged_gpu_throttled{{{ON}}}", "legend": "throttled"},
        {"expr": f"sum by (cause) (increase(edged_gpu_throttle_events_total{{{ON}}}[{R}]))",
         "legend": "throttle {{cause}}"}], 8, 8),
    ("MQTT link", "timeseries", "none", [
        {"expr": f"edged_mqtt_connected{{{ON}}}", "legend": "connected"},
        {"expr": f"edged_mqtt_queued{{{ON}}}", "legend": "buffered offline"},
        {"expr": f"sum by (class) (rate(edged_mqtt_published_total{{{ON}}}[{R}]))",
         "legend": "{{class}} / s"},
        {"expr": f"sum by (class) (rate(edged_mqtt_dropped_total{{{ON}}}[{R}]))",
         "legend": "{{class}} dropped / s"}], 12, 8),
    ("Updates (OTA)", "row", "", [], WIDTH, 1),
    ("Update state", "timeseries", "none", [
        {"expr": f'edged_ota_update_state{{{M}}} == 1', "legend": "{{model}} {{state}}"}],
     12, 8),
    ("Update steps (per interval)", "timeseries", "none", [
        {"expr": f"sum by (model, state) (increase(edged_ota_updates_total{{{M}}}[{R}]))",
         "legend": "{{model}} {{state}}"},
        {"expr": f"edged_ota_shadow_samples{{{M}}}", "legend": "{{model}} shadow samples"}],
     12, 8),
]


def variable(name: str, query: str, label: str) -> dict[str, Any]:
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": f"{name}-values"},
            "definition": query, "refresh": 2, "includeAll": True, "multi": True,
            "allValue": ".*", "current": {"selected": True, "text": ["All"],
                                          "value": ["$__all"]},
            "sort": 1, "hide": 0}


def panel(index: int, title: str, kind: str, unit: str, targets: list[dict[str, str]],
          pos: dict[str, int]) -> dict[str, Any]:
    if kind == "row":
        return {"id": index, "type": "row", "title": title, "collapsed": False, "gridPos": pos,
                "panels": []}
    body: dict[str, Any] = {
        "id": index, "type": kind, "title": title, "datasource": DS, "gridPos": pos,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"datasource": DS, "refId": chr(ord("A") + i), "expr": t["expr"],
                     "legendFormat": t["legend"], "range": True}
                    for i, t in enumerate(targets)],
    }
    if kind == "timeseries":
        body["options"] = {"legend": {"displayMode": "list", "placement": "bottom",
                                      "showLegend": True},
                           "tooltip": {"mode": "multi", "sort": "desc"}}
    else:
        body["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "",
                                             "values": False},
                           "colorMode": "value", "graphMode": "area", "textMode": "auto"}
    return body


def dashboard() -> dict[str, Any]:
    panels, x, y, row_height = [], 0, 0, 0
    for index, (title, kind, unit, targets, width, height) in enumerate(PANELS, start=1):
        if x + width > WIDTH or kind == "row":  # a new line of panels
            x, y, row_height = 0, y + row_height, 0
        panels.append(panel(index, title, kind, unit, targets,
                            {"x": x, "y": y, "w": width, "h": height}))
        x, row_height = x + width, max(row_height, height)
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource",
                      "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "__requires": [{"type": "grafana", "id": "grafana", "name": "Grafana",
                        "version": "10.0.0"},
                       {"type": "datasource", "id": "prometheus", "name": "Prometheus",
                        "version": "1.0.0"}],
        "title": "edged", "uid": "edged-overview", "tags": ["edged", "edge", "inference"],
        "description": "edged's /metrics: models (rate, latency percentiles, queue, batch "
                       "size, failures), streams, events, device telemetry, OTA updates",
        "editable": True, "graphTooltip": 1, "refresh": "10s", "schemaVersion": 39,
        "version": 1, "time": {"from": "now-1h", "to": "now"}, "timezone": "",
        "annotations": {"list": []}, "links": [],
        "templating": {"list": [
            variable("instance", "label_values(edged_model_ready, instance)", "device"),
            variable("model", 'label_values(edged_model_ready{instance=~"$instance"}, model)',
                     "model"),
            variable("stream", 'label_values(edged_stream_up{instance=~"$instance"}, stream)',
                     "stream")]},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(), encoding="utf-8")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
