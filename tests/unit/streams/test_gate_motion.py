"""The change gate's measure of motion (`ChangeGate.moved`), which continuous recording's
`motion` mode keeps segments by: true only for a frame measured as changed."""

from __future__ import annotations

import numpy as np

from edged.streams.config import GateConfig
from edged.streams.gate import ChangeGate


def test_gate_moved_when_a_frame_changed_is_true_and_otherwise_false() -> None:
    gate = ChangeGate(GateConfig(enabled=True, max_skip_s=10.0))
    still = np.zeros((120, 160, 3), np.uint8)
    moved = still.copy()
    moved[40:80, 60:100] = 255
    assert gate.admit(still, 0.0) and not gate.moved  # the first: due, not measured
    assert not gate.admit(still, 0.1) and not gate.moved
    assert gate.admit(moved, 0.2) and gate.moved
    assert not gate.admit(moved, 0.3) and not gate.moved  # the same picture again
    assert gate.admit(moved, 20.0) and not gate.moved  # due by max_skip_s: not a change
