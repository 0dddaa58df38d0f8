"""The `edged` command line: run the daemon, check a config, benchmark."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path

from edged.config import DaemonConfig, load_config, with_overrides
from edged.errors import ConfigError, EdgedError
from edged.repository import ModelRepository

DEFAULT_CONFIG = Path("/etc/edged/edged.yaml")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edged", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="daemon YAML file")
    run.add_argument("--models-dir", type=Path, help="override models_dir")
    run.add_argument("--cache-dir", type=Path, help="override cache.dir")
    run.add_argument("--socket", type=Path, help="override api.socket")
    run.add_argument("--http", metavar="HOST:PORT", help="also listen on a loopback TCP port")
    run.add_argument("--log-level", choices=["debug", "info", "warning", "error"])

    check = sub.add_parser("check-config", help="validate a config file and its models")
    check.add_argument("file", type=Path)
    check.add_argument("--models-dir", type=Path, help="check this repository instead")

    bench = sub.add_parser("bench", help="run a benchmark and print its table")
    bench.add_argument("suite", choices=["core"])
    bench.add_argument("--out", type=Path, default=Path("bench-results"), help="JSON folder")
    bench.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    return parser


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")


def cmd_run(args: argparse.Namespace) -> int:
    from edged.daemon import Daemon

    config = with_overrides(load_config(args.config), models_dir=args.models_dir,
                            socket=args.socket, http=args.http)
    if args.cache_dir:
        config = dataclasses.replace(config, cache=dataclasses.replace(config.cache,
                                                                       dir=args.cache_dir))
    _setup_logging(args.log_level or config.logging.level)
    Daemon(config).run()
    return 0


def check_models(config: DaemonConfig) -> list[str]:
    """Every model in the repository read and validated; returns one line per problem."""
    repository = ModelRepository(config.models_dir)
    problems = []
    if not config.models_dir.is_dir():
        return [f"models_dir {config.models_dir} does not exist"]
    names = repository.names()
    for name in names:
        try:
            for version in repository.served_versions(name):
                repository.get(name, version)
        except EdgedError as exc:
            problems.append(str(exc))
    for key in ("preload", "pinned"):
        for name in getattr(config.cache, key):
            if name not in names:
                problems.append(f"cache.{key}: model {name!r} is not in {config.models_dir}")
    return problems


def cmd_check_config(args: argparse.Namespace) -> int:
    try:
        config = with_overrides(load_config(args.file), models_dir=args.models_dir)
    except ConfigError as exc:
        for issue in exc.issues:
            print(issue)
        return 1
    problems = check_models(config)
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"{args.file}: ok ({len(config.streams)} streams, models in {config.models_dir})")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from edged.bench import core

    _setup_logging("warning")
    return core.main(out_dir=args.out, quick=args.quick)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    commands = {"run": cmd_run, "check-config": cmd_check_config, "bench": cmd_bench}
    try:
        return commands[args.command](args)
    except ConfigError as exc:
        for issue in exc.issues:
            print(f"edged: {issue}", file=sys.stderr)
        return 1
    except EdgedError as exc:
        print(f"edged: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
