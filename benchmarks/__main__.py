"""``python -m benchmarks run <suite> [--seeds ...] [--jobs N] [--tracking-uri ...]``."""

import sys

from benchmarks.command_line import cli

sys.exit(cli())
