"""Run one benchmark from a source checkout and print its table:
`python -m tools.bench {core,api,instances,streams,gate,live,ota,quantize,post,events,
soak,instructions,shmviews,fleet,differential,gpu,masks,plates,llm,llm_streams,recording,
faces,describer,classify} [--quick]
[--out DIR]` (`soak` and `differential` also take `--minutes N`; `differential` `--seed S`;
`soak` `--plant-leak MB`).

Benchmarks are the operator's and the developer's tool, not the device's: they need the
tiny-model generator beside them in tools/ and the PP-OCR models of the rapidocr-onnxruntime
wheel, so they live here rather than in the installed package."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from tools.bench.assets import run_and_report

SUITES = ("core", "api", "instances", "streams", "gate", "live", "ota", "quantize", "post", "masks",
          "plates",
          "events", "soak", "instructions", "shmviews", "fleet", "differential",
          "gpu", "llm", "llm_streams", "recording", "faces", "describer", "classify")
TIMED = ("soak", "differential")  # the suites that take --minutes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench", description=__doc__)
    parser.add_argument("suite", choices=SUITES)
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="JSON folder")
    parser.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    parser.add_argument("--minutes", type=float,
                        help="soak, differential: how long (default 60, 30)")
    parser.add_argument("--seed", type=int, help="differential: the scenario's seed")
    parser.add_argument("--plant-leak", type=float, metavar="MB",
                        help="soak: run the daemon with a leak of MB an hour planted")
    args = parser.parse_args(argv)

    from edged.service.systemd import setup_logging

    setup_logging("warning", "stderr")
    suite = importlib.import_module(f"tools.bench.{args.suite}")
    # Every suite is a run_bench(workdir, quick=) that returns its results and a
    # format_table(results) that prints them; running and reporting is the same for all.
    extra: dict[str, float] = {} if args.minutes is None else {"minutes": args.minutes}
    if extra and args.suite not in TIMED:
        parser.error("--minutes is for the soak and the differential test")
    if args.seed is not None:
        if args.suite != "differential":
            parser.error("--seed is for the differential test")
        extra["seed"] = args.seed
    if args.plant_leak is not None:
        if args.suite != "soak":
            parser.error("--plant-leak is for the soak")
        extra["plant_leak"] = args.plant_leak
    return run_and_report(args.suite, lambda tmp: suite.run_bench(tmp, quick=args.quick, **extra),
                          suite.format_table, out_dir=args.out, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
