"""The `edged` command line. `run` and `check-config` are the device's; the operator's commands
(`infer`, `models`, `status`, `ota`, `quantize`) come from `edged.ops`, which the daemon itself
never imports: this module is the one place that knows both."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path

from edged.api.config import default_socket
from edged.config import (
    CHECKS,
    DEFAULT_CONFIG_PATH,
    DaemonConfig,
    builtin_config,
    load_config,
    with_overrides,
)
from edged.configcheck import check
from edged.core.errors import ConfigError, EdgedError
from edged.core.schema import Parsed, parse_file
from edged.ops.commands import Command, add_commands

logger = logging.getLogger(__name__)


def _parser() -> tuple[argparse.ArgumentParser, dict[str, Command]]:
    parser = argparse.ArgumentParser(
        prog="edged", description="edged: inference runtime daemon for edge devices, and its "
        "operator commands")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run", help="run the daemon",
        description="Serve a model repository. Without a config file (none at "
                    f"{DEFAULT_CONFIG_PATH} and no --config), built-in defaults: models in "
                    f"{DaemonConfig().models_dir}, the API on {default_socket()}, MQTT off.")
    run.add_argument("--config", type=Path,
                     help=f"daemon YAML file (default: {DEFAULT_CONFIG_PATH} when it exists, "
                          "else built-in defaults)")
    run.add_argument("--models-dir", type=Path, help="override models_dir (default: "
                                                     f"{DaemonConfig().models_dir})")
    run.add_argument("--cache-dir", type=Path, help="override cache.dir")
    run.add_argument("--socket", type=Path, help=f"override api.socket (default: "
                                                 f"{default_socket()})")
    run.add_argument("--http", metavar="HOST:PORT", help="also listen on a loopback TCP port")
    run.add_argument("--source", action="append", default=[], metavar="STREAM=URI",
                     help="point a configured stream at another source (repeatable)")
    run.add_argument("--trusted-key", action="append", default=[], type=Path, metavar="PEM",
                     help="also trust this OTA public key (repeatable; the demo's own key)")
    run.add_argument("--log-level", choices=["debug", "info", "warning", "error"])

    check = sub.add_parser("check-config", help="validate a config file and its models")
    check.add_argument("file", type=Path)
    check.add_argument("--models-dir", type=Path, help="check this repository instead")
    return parser, add_commands(sub)


def cmd_run(args: argparse.Namespace) -> int:
    from edged.hardware import host

    sources = dict(item.partition("=")[::2] for item in args.source)

    def read_config() -> DaemonConfig:
        """The file with the command line's overrides: at start, and again on SIGHUP."""
        file = args.config or (DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.exists() else None)
        base = load_config(file) if file is not None else builtin_config()
        config = with_overrides(base, models_dir=args.models_dir, socket=args.socket,
                                http=args.http, sources=sources)
        if args.cache_dir:
            config = dataclasses.replace(config, cache=dataclasses.replace(config.cache,
                                                                           dir=args.cache_dir))
        if args.trusted_key:
            config = dataclasses.replace(config, ota=dataclasses.replace(
                config.ota, trusted_keys=[*config.ota.trusted_keys,
                                          *(key.resolve() for key in args.trusted_key)]))
        if args.log_level:
            config = dataclasses.replace(config, logging=dataclasses.replace(
                config.logging, level=args.log_level))
        return config

    config = read_config()
    choice = os.environ.get("EDGED_ALLOCATOR") or config.allocator
    if choice not in host.ALLOCATORS:
        raise ConfigError(f"EDGED_ALLOCATOR={choice!r}: expected one of "
                          f"{', '.join(host.ALLOCATORS)}")
    env = host.allocator_exec(choice)  # before any thread: the same process, jemalloc preloaded
    if env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    from edged.daemon import Daemon  # after the exec: its imports are most of a start
    from edged.service import statusline, systemd

    allocator = host.heap_allocator()
    if allocator == "glibc":
        host.limit_heap_arenas()  # before the daemon's threads: see their docstrings
        host.fix_heap_thresholds()
    target = systemd.setup_logging(config.logging.level, config.logging.target)
    if allocator == "jemalloc":
        logger.info("C heap: jemalloc (%s)", os.environ.get("MALLOC_CONF", ""))
    elif choice == "auto":  # the default, on a system without the library
        logger.info("C heap: glibc (%s is not installed; the heap grows a little at each "
                    "OTA swap: apt-get install libjemalloc2)", host.JEMALLOC_SONAME)
    else:
        logger.info("C heap: glibc")
    # On a terminal the streams' status lines are redrawn under the log (edged.service.statusline).
    terminal = statusline.install() if target == "stderr" else None
    if args.config is None and not DEFAULT_CONFIG_PATH.exists():
        logger.info("no config file (%s is absent): built-in defaults, models in %s, the API "
                    "on %s, MQTT off", DEFAULT_CONFIG_PATH, config.models_dir, config.api.socket)
    try:
        Daemon(config, reload_config=read_config, terminal=terminal).run()
    finally:
        if terminal is not None:
            statusline.uninstall(terminal)
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    """Exit 0 when `run` would take the file (warnings name what cannot be seen from here),
    1 with every error."""
    invalid: list[str] = []
    try:
        parsed = parse_file(DaemonConfig, args.file, CHECKS)
    except ConfigError as exc:  # said, and what did convert is checked on (every error at once)
        invalid = [str(issue) for issue in exc.issues]
        if exc.partial is None:
            print("\n".join(invalid))
            return 1
        parsed = exc.partial
    config = with_overrides(parsed.value, models_dir=args.models_dir)
    found = check(Parsed(config, parsed.lines, parsed.positions),
                  models_dir_given=args.models_dir is not None)
    for problem in [*invalid, *found.errors]:
        print(problem)
    for warning in found.warnings:
        print(f"warning: {warning}")
    if invalid or found.errors:
        return 1
    print(f"{args.file}: ok ({len(config.streams)} streams, models in {config.models_dir}"
          + (f"; {len(found.warnings)} warning(s) above" if found.warnings else "") + ")")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser, operator_commands = _parser()
    args = parser.parse_args(argv)
    commands = {"run": cmd_run, "check-config": cmd_check_config, **operator_commands}
    try:
        return commands[args.command](args)
    except ConfigError as exc:
        for issue in exc.issues:
            print(f"edged: {issue}", file=sys.stderr)
        return 1
    except EdgedError as exc:
        print(f"edged: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the CLI's own files and the daemon's socket
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"edged: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
