"""Where the tests find the repository: its root, wherever a test file sits under ``tests/``."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
