"""`python -m edged`: the same command line as the `edged` script."""

from edged.cli import main

raise SystemExit(main())
