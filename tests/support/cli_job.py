"""A processor for the CLI tests, configured by environment variables.

``MILLSTREAM_TEST_DATA``: the ParquetLog directory; ``MILLSTREAM_TEST_STATE``: the SQLite file.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.jobs import keyed_processor

processor = keyed_processor(
    Path(os.environ["MILLSTREAM_TEST_DATA"]), Path(os.environ["MILLSTREAM_TEST_STATE"])
)
