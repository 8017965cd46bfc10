"""``python -m confide``: the same as the ``confide`` command."""

import sys

from confide.cli import main

sys.exit(main())
