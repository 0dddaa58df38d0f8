"""A planted leak, for `python -m tools.bench soak --plant-leak MB`: the soak's daemon runs with
this folder on its PYTHONPATH, and Python imports this module at start. A thread keeps MB
(`EDGED_PLANTED_LEAK_MB_PER_H`) of touched memory an hour, a piece every 10 s, for good: what
a leak of that rate looks like in the daemon's RSS, to show that the soak's verdict fails it
(tests/unit/tools/test_soak_verdict.py holds the verdict to synthetic series; this holds it to
a real daemon). Never on the device: only the bench's daemon gets this folder."""

from __future__ import annotations

import os
import threading
import time

_RATE = float(os.environ.get("EDGED_PLANTED_LEAK_MB_PER_H", "0") or 0)
_KEPT: list[bytes] = []
PERIOD_S = 10.0


def _leak() -> None:
    piece = int(_RATE * 1024 * 1024 * PERIOD_S / 3600)
    while True:
        time.sleep(PERIOD_S)
        _KEPT.append(os.urandom(piece))  # random bytes: every page touched, none shared


if _RATE > 0:
    threading.Thread(target=_leak, name="planted-leak", daemon=True).start()
