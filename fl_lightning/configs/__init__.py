"""The embedded default run (``default.yaml``): what ``fl-lightning fit`` runs without ``--config``."""

from pathlib import Path

DEFAULT_CONFIG = Path(__file__).parent / "default.yaml"
