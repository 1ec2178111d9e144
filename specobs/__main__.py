"""``python -m specobs``: the same command line as ``specobs``."""

import sys

from specobs.cli import main

sys.exit(main())
