"""One record of a device run, for docs/gpu-results/: the self-test's rows, `pytest tests/gpu`'s
outcome and the GPU benchmarks, with the device, driver, CUDA, ONNX Runtime, the commit and the
date, as JSON (gpu-results.json) and as a short Markdown table (summary.md).

    python3 tools/gpu_check/results.py OUT_DIR     (tools/gpu_device_run.sh calls it last)
"""

from __future__ import annotations

import json
import os
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]


def load(path: Path) -> dict[str, Any] | None:
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
        return doc
    except (OSError, ValueError):
        return None


def pytest_outcome(path: Path) -> str:
    """pytest's last summary line ("3 passed, 2 skipped in 4.1s"), or why there is none."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "not run"
    found = [line.strip("= ") for line in lines
             if re.search(r"\d+ (passed|failed|skipped|error)", line)]
    return found[-1] if found else "no summary (see pytest-gpu.txt)"


def combine(out: Path) -> dict[str, Any]:
    selftest = load(out / "selftest.json")
    bench = load(out / "gpu.json")
    machine = (selftest or {}).get("machine", {})
    device = machine.get("device") or {}
    return {
        "commit": os.environ.get("EDGED_COMMIT", "unknown"),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": device.get("name"), "driver": machine.get("driver"),
        "cuda": machine.get("cuda"), "onnxruntime": machine.get("onnxruntime"),
        "python": machine.get("python"),
        "selftest": selftest or {"ok": False, "rows": [], "missing": "selftest.json"},
        "pytest_gpu": pytest_outcome(out / "pytest-gpu.txt"),
        "bench": bench or {"missing": "gpu.json"},
    }


def summary(doc: dict[str, Any]) -> str:
    selftest = doc["selftest"]
    cuda = doc["cuda"] or {}
    lines = [f"# edged on a GPU: {doc['device'] or 'no device'}", "",
             f"Commit {doc['commit']}, {doc['date']}; driver {doc['driver']}, CUDA runtime "
             f"{cuda.get('runtime')} (driver API {cuda.get('driver')}), ONNX Runtime "
             f"{doc['onnxruntime']}, Python {doc['python']}.", "",
             f"## Device check (`tools/gpu_selftest.py`): "
             f"{'ok' if selftest.get('ok') else 'FAILED'} {selftest.get('counts', '')}", "",
             "| section | pass | FAIL | skip |", "|---|---|---|---|"]
    sections: dict[str, dict[str, int]] = {}
    for row in selftest.get("rows", []):
        counts = sections.setdefault(row["section"], {"pass": 0, "FAIL": 0, "skip": 0})
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    lines += [f"| {name} | {c['pass']} | {c['FAIL']} | {c['skip']} |"
              for name, c in sections.items()]
    lines += ["", "| section | check | result | detail |", "|---|---|---|---|"]
    for row in selftest.get("rows", []):
        detail = row["detail"].replace("|", "/").replace("\n", " ")[:220]
        lines.append(f"| {row['section']} | {row['check']} | {row['status']} | {detail} |")
    lines += ["", f"## `pytest tests/gpu`: {doc['pytest_gpu']}", "",
              "## Benchmarks (`python -m tools.bench gpu`)", ""]
    bench = doc["bench"]
    if "missing" in bench:
        lines.append("not run (no gpu.json)")
    else:
        from tools.bench.gpu import format_table

        try:
            lines.append(format_table(bench))
        except (KeyError, TypeError) as exc:  # a partial run: the JSON still has it
            lines.append(f"(incomplete: {exc!r}; see gpu-results.json)")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else ".")
    doc = combine(out)
    (out / "gpu-results.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    (out / "summary.md").write_text(summary(doc))
    print(summary(doc))
    return 0 if doc["selftest"].get("ok") else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
