"""Config faults a second read found: a lone surrogate in an unknown key (the issue must print),
and the checks of a mapping with an entry that did not convert (its siblings still checked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edged.config import parse_config
from edged.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def test_config_when_an_unknown_key_has_a_lone_surrogate_its_issue_can_be_printed() -> None:
    """The surrogate check covers mapping keys and string values, not the keys of a
    dataclass's mapping: an unknown key "\\ud800x" goes into the issue's key path as it is,
    so the issue is text no UTF-8 writer takes."""
    with pytest.raises(ConfigError) as caught:
        parse_config('mqtt: {enabled: false}\n"\\ud800x": 1\n')
    for issue in caught.value.issues:
        str(issue).encode("utf-8")


def test_check_config_when_an_unknown_key_has_a_lone_surrogate_exits_1_without_a_traceback(
        tmp_path: Path) -> None:
    """`edged check-config` prints each issue on stdout: that one stops it with a
    UnicodeEncodeError traceback instead of the list of errors."""
    config = tmp_path / "edged.yaml"
    config.write_text('mqtt: {enabled: false}\n"\\ud800x": 1\n', encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "edged.cli", "check-config", str(config),
                           "--models-dir", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 1
    assert "unknown key" in done.stdout


def test_config_when_one_known_plate_does_not_convert_still_reports_the_others_checks() -> None:
    """`_whole` skips a field's check when any item failed to convert: "'Ana' lists no
    plates" (reported at 6375f1b) waits for the next run once Bob's list has a bad item."""
    text = ("mqtt: {enabled: false}\n"
            "streams:\n"
            "  - name: cam\n"
            "    source: file:///x.avi\n"
            "    model: det\n"
            "    lpr:\n"
            "      known_plates:\n"
            "        Ana: []\n"
            "        Bob: [ABC123, [x]]\n")
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    messages = [str(issue) for issue in caught.value.issues]
    assert any("expected a string" in m for m in messages), messages
    assert any("'Ana' lists no plates" in m for m in messages), messages
