"""``python -m benchmarks.perf [--quick] [--device cpu|cuda] [--models ...] [--clients ...] [--out ...]``."""

import sys

from benchmarks.perf.suite import main

sys.exit(main())
