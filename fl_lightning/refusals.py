"""The error of a setting refused before anything runs: the CLI, the runner and the fit lock raise
it, and the CLI says it in one line (what is wrong and what to do), with no traceback. Its own
module, torch-free and importing nothing, so that readers of a store (the fit lock's liveness check,
which the leaderboard uses) need not reach the preflight checks, some of which load torch."""


class PreflightError(ValueError):
    """A setting that cannot work, found before anything ran."""
