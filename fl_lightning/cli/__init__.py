"""The command line: the ``fl-lightning`` console script and everything it reads before a fit.

- :mod:`~fl_lightning.cli.console`: the console script (``main``), its top-level help and the
  kept ``fit --help`` texts, answered without importing torch or Lightning;
- :mod:`~fl_lightning.cli.lightning_cli`: the LightningCLI subclass that runs ``fit``;
- :mod:`~fl_lightning.cli.settings`: what a command line gives, read apart from LightningCLI's parse;
- :mod:`~fl_lightning.cli.parse_errors`: the parser's errors, one line each;
- :mod:`~fl_lightning.cli.preflight`: the checks made before anything is created;
- :mod:`~fl_lightning.cli.replay`: ``fl-lightning replay``, a stored run fitted again and compared.

``python -m fl_lightning.cli`` is the console script.
"""

from fl_lightning.cli.console import main

__all__ = ["main"]
