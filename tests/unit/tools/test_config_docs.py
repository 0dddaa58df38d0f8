"""docs/configuration.md is generated from the config schemas (`python -m tools.config_docs`):
the committed file must be what the code writes now, and every key must have help to write."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from edged.config import DaemonConfig
from edged.model.config import ModelConfig
from tools import config_docs


def test_configuration_doc_when_regenerated_matches_the_committed_file() -> None:
    committed = config_docs.OUTPUT.read_text(encoding="utf-8")
    assert committed == config_docs.render(), (
        f"{config_docs.OUTPUT.relative_to(config_docs.ROOT)} is stale: run "
        f"`.venv/bin/python -m {config_docs.COMMAND.removeprefix('python -m ')}` and commit it")


@pytest.mark.parametrize("root", [DaemonConfig, ModelConfig])
def test_configuration_doc_when_walked_lists_every_key_of_every_section(root: type) -> None:
    listed = {(s.path, row.key) for s in config_docs.sections(root) for row in s.rows}

    def walk(cls: type, path: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = f.metadata.get("key") or f.name
            full = f"{path}.{key}" if path else key
            assert (path, key) in listed, full
            for child, child_path in config_docs._sections_of(hints[f.name], full):
                walk(child, child_path)

    walk(root, "")


def test_configuration_doc_when_a_setting_has_no_help_refuses_to_render() -> None:
    from edged.core.schema import setting

    @dataclasses.dataclass(frozen=True)
    class Bare:
        size: int = setting(3)

    with pytest.raises(ValueError, match=r"Bare.size \(size\) has no help string"):
        config_docs.sections(Bare)


def test_configuration_doc_when_a_key_has_a_yaml_alias_shows_the_yaml_key() -> None:
    rows = {s.path: s for s in config_docs.sections(DaemonConfig)}
    keys = [row.key for row in rows["streams[].secondary[]"].rows]
    assert "as" in keys and "as_" not in keys


def test_configuration_doc_when_a_key_waits_for_a_restart_says_so() -> None:
    rows = {(s.path, r.key): r.reload for s in config_docs.sections(
        DaemonConfig, config_docs.daemon_reload) for r in s.rows}
    assert rows[("", "api")] == "restart"
    assert rows[("cache", "budget_mb")] == "restart"
    assert rows[("cache", "pinned")] == "applied"
    assert rows[("", "cache")] == "partly"
    assert rows[("streams[]", "fps")] == "applied"


def test_configuration_doc_when_checked_against_a_stale_copy_exits_1(tmp_path: Path) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text(config_docs.render().replace("warm model cache", "a cache"))
    assert config_docs.main(["--check", "--output", str(stale)]) == 1
    stale.write_text(config_docs.render())
    assert config_docs.main(["--check", "--output", str(stale)]) == 0
