"""``python -m meshplan.cli``: the command line."""

import sys

from meshplan.cli import main

sys.exit(main())
