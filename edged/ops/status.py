"""`edged status`: the daemon's status report (GET /v2/edged/status) as one screen of text."""

from __future__ import annotations

from typing import Any

RECENT_SHOWN = 5


def render(report: dict[str, Any]) -> str:
    """Health first (what a person checks first), then models, queues, streams, the broker,
    the process and the last warnings."""
    lines = [_headline(report)]
    for problem in report.get("problems", []):
        lines.append(f"  STUCK {problem}")
    lines.append("")
    lines += _table(["MODEL", "STATE", "BACKEND", "ON", "LOAD", "DETAIL"], [
        (f"{m['name']}:{m['version']}", m["state"],
         m.get("backend") or "-", m.get("device") or "-",
         _seconds(m.get("load_seconds")),
         ", ".join(m.get("providers") or []) or m.get("reason") or "")
        for m in report.get("models", [])])
    queues = report.get("queues", {})
    if queues:
        lines.append("")
        lines += _table(["QUEUE", "WAITING", "IN MODEL", "BATCHES"], [
            (label, str(q["queued"]), str(q["pending"] - q["queued"]), str(q["batches"]))
            for label, q in sorted(queues.items())])
    streams = report.get("streams", {})
    lines.append("")
    if streams:
        lines += _table(["STREAM", "STATE", "MODEL", "DECODER", "IN", "DONE", "GATED",
                         "DROPPED", "RECONN", "LAST ERROR"], [
            (name, s["state"], s["model"], s.get("decoder") or "-", str(s["frames_in"]),
             str(s["processed"]), str(s.get("gated", 0)), str(s["dropped"]),
             str(s["reconnects"]),
             _short(s.get("last_error") or ""))
            for name, s in sorted(streams.items())])
    else:
        lines.append("no streams")
    mqtt = report.get("mqtt")
    lines.append("")
    if mqtt is None:
        lines.append("mqtt: disabled")
    else:
        lines.append(f"mqtt: {'connected' if mqtt.get('connected') else 'NOT connected'}, "
                     f"published {mqtt.get('published', 0)}, "
                     f"buffered while offline {mqtt.get('buffered', 0)}, "
                     f"dropped {mqtt.get('dropped', 0)}")
    faces = report.get("faces")
    if faces:
        state = faces.get("embedder") or {}
        lines.append(f"faces: {faces['names']} names, {faces['entries']} of "
                     f"{faces['max_entries']} faces enrolled, {faces['unknowns']} unknown "
                     f"sightings; embedder {state.get('embedder') or '-'}"
                     + (f", {state['stale']} rows to re-embed" if state.get("stale") else "")
                     + (f", {state['without_crop']} to enrol again"
                        if state.get("without_crop") else ""))
    process = report.get("process")
    if process:
        rss = process.get("rss_bytes")
        lines.append(f"process: rss {rss / 2**20:.0f} MiB" if rss else "process: rss unknown")
    for gpu in report.get("gpus") or []:
        lines.append(f"gpu {gpu.get('index')}: {gpu.get('name', '')} memory "
                     f"{gpu.get('memory_used_bytes', 0) / 2**20:.0f}/"
                     f"{gpu.get('memory_total_bytes', 0) / 2**20:.0f} MiB"
                     + (f", utilisation {gpu['utilization_percent']}%"
                        if gpu.get("utilization_percent") is not None else ""))
    jetson = report.get("jetson")
    if jetson:
        lines += _jetson(jetson)
    recent = report.get("recent", [])[-RECENT_SHOWN:]
    if recent:
        lines.append("")
        lines.append("recent warnings:")
        for row in recent:
            where = " ".join(f"{k}={row[k]}" for k in ("model", "stream", "code") if k in row)
            lines.append(f"  {row['level'].lower():7} {_short(row['message'], 90)}"
                         + (f" [{where}]" if where else ""))
    return "\n".join(lines)


def _jetson(j: dict[str, Any]) -> list[str]:
    """Power mode and throttle state first (why frames are slow), then what feeds them."""
    mode = j.get("power_mode") or (f"mode {j['power_mode_id']}"
                                   if j.get("power_mode_id") is not None else "unknown")
    state = ("THROTTLED" + (f" ({', '.join(j['hot_zones'])} hot)" if j.get("hot_zones")
                            else " (over-current)")) if j.get("throttled") else "not throttled"
    events = ", ".join(f"{k} {v}" for k, v in sorted((j.get("throttle_events") or {}).items()))
    lines = [f"jetson: L4T {j.get('l4t') or '?'}, power mode {mode}, {state}"
             + (f"; throttle events since start: {events}" if events else "")]
    gpu = (j.get("clocks_hz") or {}).get("gpu")
    if gpu:
        cap = gpu.get("max")
        top = gpu.get("hardware_max")
        lines.append(f"  gpu clock {gpu['now'] / 1e6:.0f} MHz"
                     + (f", capped at {cap / 1e6:.0f}" if cap else "")
                     + (f" of {top / 1e6:.0f} MHz" if top and cap and top > cap else ""))
    temps = j.get("temperatures_c") or {}
    if temps:
        hottest = sorted(temps.items(), key=lambda kv: -kv[1])[:3]
        lines.append("  hottest " + ", ".join(f"{k} {v:.1f} C" for k, v in hottest))
    rails = j.get("rails") or {}
    if rails:
        lines.append("  power " + ", ".join(f"{k} {v['watts']:.1f} W"
                                             for k, v in sorted(rails.items())))
    return lines


def _headline(report: dict[str, Any]) -> str:
    health = "live" if report.get("live") else "NOT LIVE"
    ready = "ready" if report.get("ready") else "NOT READY"
    systemd = report.get("systemd", {})
    under = ""
    if systemd.get("notify"):
        watchdog = systemd.get("watchdog_s")
        under = " under systemd" + (f" (watchdog {watchdog:g} s)" if watchdog else "")
    return (f"edged {report.get('version', '?')} on {report.get('device_id', '?')}: "
            f"{health}, {ready}, up {_duration(report.get('uptime_s', 0))}, "
            f"pid {report.get('pid', '?')}{under}")


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.1f}s"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _short(text: str, width: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def _table(header: list[str], rows: list[tuple[str, ...]]) -> list[str]:
    table = [tuple(header), *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header) - 1)]
    return [("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  "
             + r[-1]).rstrip() for r in table]
