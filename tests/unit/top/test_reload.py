"""The reload plan: what a SIGHUP may change in a running daemon, from the two configs alone."""

from __future__ import annotations

from edged.config import DaemonConfig, parse_config
from edged.reload import plan

BASE = """device_id: a
models_dir: /m
cache: {dir: /c, budget_mb: 100, preload: [x], pinned: [x]}
api: {socket: /s.sock}
ota: {keep_versions: 3}
logging: {level: info}
streams:
  - {name: one, source: 'file:///1.avi', model: x}
  - {name: two, source: 'file:///2.avi', model: x}
"""


def config(text: str = BASE, **replace: str) -> DaemonConfig:
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    return parse_config(text)


def test_reload_plan_when_nothing_changed_does_nothing() -> None:
    steps = plan(config(), config())
    assert (steps.needs_restart, steps.stop, steps.start, steps.preload) == ([], [], [], [])
    assert steps.config == config() and not steps.trusted_keys_changed


def test_reload_plan_when_streams_change_touches_only_those() -> None:
    new = config(**{"  - {name: one, source: 'file:///1.avi', model: x}\n": "",
                    "'file:///2.avi'": "'file:///2b.avi'"})
    new_with_three = parse_config(BASE.replace(
        "  - {name: one, source: 'file:///1.avi', model: x}\n",
        "  - {name: three, source: 'rtsp://cam/3', model: x}\n"))
    steps = plan(config(), new)
    assert steps.stop == ["one", "two"]  # one went, two changed
    assert [s.source for s in steps.start] == ["file:///2b.avi"]
    steps = plan(config(), new_with_three)
    assert steps.stop == ["one"] and [s.name for s in steps.start] == ["three"]


def test_reload_plan_when_a_stream_had_failed_to_start_starts_it_again() -> None:
    steps = plan(config(), config(), streams_running={"two"})
    assert steps.stop == [] and [s.name for s in steps.start] == ["one"]


def test_reload_plan_when_restart_only_parts_change_keeps_them_and_names_them() -> None:
    new = config(**{"device_id: a": "device_id: b", "/s.sock": "/t.sock",
                    "budget_mb: 100": "budget_mb: 200", "preload: [x]": "preload: [x, y]",
                    "pinned: [x]": "pinned: [x, y]", "keep_versions: 3": "keep_versions: 5",
                    "level: info": "level: debug"})
    steps = plan(config(), new)
    assert steps.needs_restart == ["device_id", "api", "cache.budget_mb", "ota.keep_versions"]
    running = steps.config
    assert (running.device_id, str(running.api.socket), running.cache.budget_mb,
            running.ota.keep_versions) == ("a", "/s.sock", 100, 3)
    # ... while the reloadable parts of the same sections take the new values.
    assert running.cache.preload == ["x", "y"] and running.cache.pinned == ["x", "y"]
    assert running.logging.level == "debug"
    assert steps.preload == ["y"]


def test_reload_plan_when_trusted_keys_change_says_so() -> None:
    steps = plan(config(), config(**{"keep_versions: 3": "keep_versions: 3, "
                                                         "trusted_keys: [k.pub]"}))
    assert steps.trusted_keys_changed and steps.needs_restart == []
    assert [str(p) for p in steps.config.ota.trusted_keys] == ["k.pub"]


def test_plan_when_preload_becomes_all_preloads_all_and_not_when_it_stays() -> None:
    listed = parse_config("cache: {preload: [tiny_cls]}\n")
    every = parse_config("{}\n")
    assert every.cache.preload == "all"  # the default, as Triton loads every model
    assert plan(listed, every).preload == "all"
    assert plan(every, every).preload == []
    assert plan(every, listed).preload == []  # already loaded under `all`


def test_reload_plan_when_the_allocator_changes_holds_it_for_the_next_start() -> None:
    steps = plan(parse_config("allocator: auto\n"), parse_config("allocator: glibc\n"))
    assert steps.needs_restart == ["allocator"] and steps.config.allocator == "auto"


def test_reload_plan_when_the_describer_changes_keeps_it_until_restart_and_streams_follow(
        ) -> None:
    new = config(**{"logging: {level: info}": "logging: {level: info}\ndescriber: {model: smol}",
                    "model: x}\n  - {name: two": "model: x, describe: {enabled: true}}\n"
                                                  "  - {name: two"})
    steps = plan(config(), new)
    assert steps.needs_restart == ["describer"]
    assert steps.config.describer.model is None  # the running describer stays (none)
    assert steps.stop == ["one"] and steps.start[0].describe.enabled  # a stream reloads
