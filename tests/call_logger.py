"""A Lightning logger that keeps every ``log_metrics`` call in memory (no MLflow: it also runs
where only torch and Lightning are installed)."""

from lightning.pytorch.loggers import Logger


class CallLogger(Logger):
    """Records every ``log_metrics`` call: (step, metrics)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    @property
    def name(self):
        return "calls"

    @property
    def version(self):
        return 0

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.calls.append((step, dict(metrics)))
