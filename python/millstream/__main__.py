"""``python -m millstream``: the command-line interface."""

import sys

from millstream.cli import main

sys.exit(main())
