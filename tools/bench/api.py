"""Run the api benchmark from a source checkout: `python tools/bench/api.py [--quick]`
(the same as `edged bench api`)."""

import sys

from edged.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "api", *sys.argv[1:]]))
