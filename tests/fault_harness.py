"""``fl-lightning fit`` with one fault struck at one phase of the fit (for test_fault_injection).

    python tests/fault_harness.py PHASE FAULT fit --model.num_rounds 6 ...

PHASE: ``store`` (while a new SQLite store is copied into place), ``round`` (in round
``ROUND``'s local training), ``checkpoint`` (half-way through writing a checkpoint file),
``flush`` (as round ``ROUND``'s metrics are written to the store), ``final`` (while the final
artefacts are logged). FAULT: ``sigkill`` (the process killed outright), ``enospc`` (a full disk:
the write raises ``ENOSPC``, or SQLite's "database or disk is full"), ``server`` (the tracking
store stops answering from then on: every MLflow call is refused as an HTTP store refuses it),
``hold`` (no fault: the fit waits there, alive, until the file ``$FL_HOLD_RELEASE`` exists, so that
a test can run a second process against the live fit, e.g. its own printed resume command).
Prints ``STRUCK <phase> <fault>`` to stderr when the fault strikes, then runs the console script.
"""

from __future__ import annotations

import errno
import os
import signal
import sqlite3
import sys

ROUND = 3
REFUSED = ("API request to http://127.0.0.1:5999/api/2.0/mlflow/runs/log-batch failed with exception "
           "HTTPConnectionPool(host='127.0.0.1', port=5999): Max retries exceeded (Caused by "
           "NewConnectionError('Failed to establish a new connection: [Errno 111] Connection refused'))")
PHASE, FAULT = sys.argv[1], sys.argv[2]
state = {"struck": False, "server_down": False, "checkpoints": 0}


def strike(where: str, store_write: bool = False) -> None:
    """The fault, once; ``server`` raises nothing here: the store's calls fail from now on."""
    if state["struck"]:
        return
    state["struck"] = True
    print(f"STRUCK {PHASE} {FAULT}", file=sys.stderr, flush=True)
    if FAULT == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif FAULT == "enospc":
        if store_write:
            raise sqlite3.OperationalError("database or disk is full")
        raise OSError(errno.ENOSPC, "No space left on device", where)
    elif FAULT == "server":
        state["server_down"] = True
    elif FAULT == "hold":
        import time

        release, deadline = os.environ["FL_HOLD_RELEASE"], time.time() + 600
        while not os.path.exists(release) and time.time() < deadline:
            time.sleep(0.05)


def install() -> None:
    from mlflow.tracking import MlflowClient

    from fl_lightning.callbacks import checkpointing, mlflow_run, mlflow_store, tracking_buffer
    from fl_lightning.core.module import FederatedModule

    attribute = MlflowClient.__getattribute__

    def refused_when_down(self: MlflowClient, name: str):  # every public call of a gone server fails
        value = attribute(self, name)
        if state["server_down"] and not name.startswith("_") and callable(value):
            def refused(*args, **kwargs):
                raise RuntimeError(REFUSED)
            return refused
        return value

    MlflowClient.__getattribute__ = refused_when_down  # type: ignore[method-assign]

    if PHASE == "store":
        copyfile = mlflow_store.shutil.copyfile

        def half_copied(source, target, *args, **kwargs):
            with open(source, "rb") as read, open(target, "wb") as write:
                write.write(read.read()[: os.path.getsize(source) // 2])
            strike(str(target))
            return copyfile(source, target, *args, **kwargs)

        mlflow_store.shutil.copyfile = half_copied
    elif PHASE == "round":
        training_step = FederatedModule.training_step

        def training_step_struck(self, *args, **kwargs):
            if self.current_epoch + 1 == ROUND:
                strike("a round's local training")
            return training_step(self, *args, **kwargs)

        FederatedModule.training_step = training_step_struck
    elif PHASE == "checkpoint":
        replace_synced = checkpointing.replace_synced

        def half_written(partial, path):
            state["checkpoints"] += 1
            if state["checkpoints"] == 2:  # the second checkpoint file, cut off half-way
                if FAULT != "server":  # a lost server cuts no file short: it goes away as the file is written
                    with open(partial, "rb+") as file:
                        file.truncate(os.path.getsize(partial) // 2)
                strike(str(partial))
            return replace_synced(partial, path)

        checkpointing.replace_synced = half_written
    elif PHASE == "flush":
        flush = tracking_buffer.BufferedClient.flush

        def flush_struck(self):
            if any(getattr(metric, "step", 0) >= ROUND for _, metric in self.held):
                strike("the MLflow store", store_write=True)
            return flush(self)

        tracking_buffer.BufferedClient.flush = flush_struck
    elif PHASE == "final":
        log_client_metrics = mlflow_run.MLflowRunInfo._log_client_metrics

        def final_struck(self, trainer, pl_module, status):
            if status == "finished":
                strike("clients/final_client_metrics.json")
            return log_client_metrics(self, trainer, pl_module, status)

        mlflow_run.MLflowRunInfo._log_client_metrics = final_struck
    else:
        raise SystemExit(f"unknown phase {PHASE!r}")


if __name__ == "__main__":
    install()
    from fl_lightning.cli import main

    sys.argv = ["fl-lightning", *sys.argv[3:]]
    main()
