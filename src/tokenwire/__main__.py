"""``python -m tokenwire``: the command line."""

import sys

from tokenwire.entrypoints.cli import main

sys.exit(main())
