"""Run the streams benchmark from a source checkout: `python tools/bench/streams.py [--quick]`
(the same as `edged bench streams`)."""

import sys

from edged.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "streams", *sys.argv[1:]]))
