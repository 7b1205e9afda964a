"""``python -m playground.bench``: see :mod:`playground.bench.cli`."""

import sys

from .cli import main

sys.exit(main())
