"""``python -m tokenwire``: the command line."""

import sys

from tokenwire.cli import main

sys.exit(main())
