"""``python -m fl_lightning.cli``: the ``fl-lightning`` console script."""

from fl_lightning.cli.console import main

if __name__ == "__main__":
    main()
