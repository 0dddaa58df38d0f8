"""Run the core benchmark from a source checkout: `python tools/bench/core.py [--quick]`
(the same as `edged bench core`)."""

import sys

from edged.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "core", *sys.argv[1:]]))
