"""``python -m benchmarks run <suite> [--seeds ...] [--jobs N] [--tracking-uri ...]``."""

import sys

from benchmarks.runner import cli

sys.exit(cli())
