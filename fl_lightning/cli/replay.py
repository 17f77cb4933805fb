"""``fl-lightning replay``: run a stored run again from its logged settings and check every number.

A run's numbers depend only on its logged settings (its ``config.yaml`` artifact, which the CLI
and the benchmark runner log). ``replay`` fits that config again into a scratch MLflow store and
compares every metric of every round with the stored run, except wall-clock times (any metric
with ``time`` in its name). It prints ``identical: N rounds, M metrics`` or the first divergence
(round, metric, both values), and records the verdict on the stored run (tags ``replay_result``,
``replay_date``; ``--no-record`` leaves the run untouched). ``--sample K`` replays K finished runs
of an experiment (a suite), chosen with a fixed seed. The leaderboard shows, per benchmark, how
many runs were replayed and how many were identical.

An extended run (resumed with a larger ``--model.num_rounds``) is replayed along the route it took,
which it records in its ``fit_lengths`` tag: a 3-round fit, then extended to 5. A fit evaluates
at its last round, so the 3-round fit's evaluation at round 3 is part of the run, and a straight
5-round fit would not make it.

    fl-lightning replay 3f2a...                      # a run id (or a run name) in ./mlruns.db
    fl-lightning replay --experiment fedfv-offline --sample 5 --tracking-uri sqlite:///runs.db
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import random
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fl_lightning.records.errors import OneLineParser
from fl_lightning.records.store_uri import sqlite_file, sqlite_uri
from fl_lightning.records.vocabulary import DEFAULT_TRACKING_URI, REPLAY_IDENTICAL, Tag, fit_lengths

REPLAY_EXPERIMENT = "replay"
RESULT_TAG, DATE_TAG = Tag.REPLAY_RESULT, Tag.REPLAY_DATE
CONFIG_ARTIFACT = "config.yaml"


class ReplayError(Exception):
    """A run that cannot be replayed; the message says why and what to do."""


@dataclass
class Outcome:
    run_id: str
    name: str
    identical: bool
    rounds: int
    metrics: int
    divergence: str = ""  # "round 3: train_loss stored 1.02 replayed 1.03"
    route: tuple[int, ...] = ()  # an extended run's fit lengths, replayed in turn; () for one fit

    @property
    def verdict(self) -> str:
        return REPLAY_IDENTICAL if self.identical else f"diverged: {self.divergence}"

    def line(self) -> str:
        route = (f" (fitted to {self.route[0]} rounds, then extended to "
                 f"{', then '.join(map(str, self.route[1:]))}, as the run was)") if self.route else ""
        if self.identical:
            return f"{self.name}: identical: {self.rounds} rounds, {self.metrics} metrics{route}"
        return f"{self.name}: diverged at {self.divergence}{route}"


def compared(name: str) -> bool:
    """Every metric but wall-clock times (client_time_s, server_time_s, shapley time ratios, ...)
    and the CLI's copies of the accuracy metrics for the MLflow UI's first chart section
    (``Accuracy and fairness/test_acc_mean``: the same values as ``test_acc_mean``, which is
    compared; a Trainer script's run has no copies)."""
    from fl_lightning.callbacks.mlflow_ui import CHART_SECTION  # here: the package imports Lightning

    return "time" not in name and name != "epoch" and not name.startswith(f"{CHART_SECTION}/")


def histories(client: Any, run_id: str, names: Sequence[str]) -> dict[str, dict[int, float]]:
    """{metric: {step: value}}; where a step was logged twice the later value counts."""
    out: dict[str, dict[int, float]] = {}
    for name in names:
        entries = sorted(client.get_metric_history(run_id, name), key=lambda m: (m.step, m.timestamp))
        out[name] = {int(m.step): float(m.value) for m in entries}
    return out


def _equal(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or (math.isnan(a) and math.isnan(b))


def first_divergence(stored: Mapping[str, Mapping[int, float]],
                     replayed: Mapping[str, Mapping[int, float]]) -> tuple[int, str, float | None, float | None] | None:
    """(round, metric, stored value, replayed value) of the earliest difference, or None."""
    found = []
    for name in sorted(set(stored) | set(replayed)):
        mine, theirs = stored.get(name, {}), replayed.get(name, {})
        for step in sorted(set(mine) | set(theirs)):
            if not _equal(mine.get(step), theirs.get(step)):
                found.append((step, name, mine.get(step), theirs.get(step)))
                break
    return min(found, key=lambda f: (f[0], f[1])) if found else None


def _text(value: float | None) -> str:
    return "(not logged)" if value is None else repr(value)


def replay_config(text: str, tracking_uri: str, folder: Path, checkpoints: bool = False) -> Path:
    """The stored config with its logger pointed at the scratch store (a new run; a checkpoint only
    where a route of fits needs one to continue from)."""
    import yaml

    config = yaml.safe_load(text)
    if not isinstance(config, dict) or "model" not in config:
        raise ReplayError("its config.yaml holds no model: it was not logged by fl-lightning fit")
    trainer = config.setdefault("trainer", {})
    trainer["logger"] = {"class_path": "lightning.pytorch.loggers.MLFlowLogger",
                         "init_args": {"experiment_name": REPLAY_EXPERIMENT, "tracking_uri": tracking_uri}}
    for length in ("max_epochs", "min_epochs", "max_steps", "min_steps"):  # the model's num_rounds decides
        trainer.pop(length, None)
    trainer["enable_checkpointing"] = checkpoints
    trainer["enable_progress_bar"] = False
    trainer["default_root_dir"] = str(folder / "checkpoints")
    trainer["callbacks"] = None
    config.pop("ckpt_path", None)
    # the CLI's --threads of runs older than the per-run setting (model.threads): gone; such a run
    # replays at the default count, and the comparison shows whether its numbers depended on it
    config.pop("threads", None)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def find_run(client: Any, key: str) -> Any:
    """A run by id, else by its name (``mlflow.runName``) in any experiment."""
    try:
        return client.get_run(key)
    except Exception:  # not an id: look for a name
        pass
    ids = [e.experiment_id for e in client.search_experiments()]
    # MLflow's filter strings have no escapes (a \' inside '...' matched nothing): a name holding '
    # is quoted with ", and one holding both quote marks cannot be written as a filter at all
    if "'" in key and '"' in key:
        raise ReplayError(f"no run with id {key!r}, and a run name holding both ' and \" cannot be searched for; "
                          "give the run id instead")
    quote = '"' if "'" in key else "'"
    runs = client.search_runs(ids, filter_string=f"tags.`mlflow.runName` = {quote}{key}{quote}") if ids else []
    if not runs:
        raise ReplayError(f"no run with id or name {key!r} in the store; `mlflow ui` lists them")
    if len(runs) > 1:
        raise ReplayError(f"{len(runs)} runs are named {key!r}; give the run id instead")
    return runs[0]


def sample_runs(client: Any, experiment: str, count: int, seed: int = 0) -> list[Any]:
    found = client.get_experiment_by_name(experiment)
    if found is None:
        names = ", ".join(sorted(e.name for e in client.search_experiments()))
        raise ReplayError(f"no experiment {experiment!r} in the store; it has: {names}")
    runs = [r for r in client.search_runs([found.experiment_id], filter_string="attributes.status = 'FINISHED'",
                                          max_results=50_000)]
    runs.sort(key=lambda r: r.info.run_id)
    return random.Random(seed).sample(runs, min(count, len(runs)))


def route_fit(folder: Path, config: Path, length: int | None, continues: bool) -> list[str]:
    """The ``fit`` words of one fit of a replay: the stored config; on a route, ``length`` rounds,
    and a fit that ``continues`` resumes from the previous fit's ``last.ckpt``."""
    words = ["fit", "--config", str(config)]
    if length is None:
        return words
    words.append(f"--model.num_rounds={length}")
    if continues:
        found = sorted((folder / "checkpoints").rglob("last.ckpt"))
        if len(found) != 1:
            raise ReplayError(f"the replay's fit before {length} rounds left {len(found)} last.ckpt files in "
                              f"{folder / 'checkpoints'}, not one to continue from")
        words += ["--ckpt_path", str(found[0])]
    return words


def fit_in(folder: Path, name: str, words: list[str]) -> None:
    """One fit of a replay, run in ``folder`` with its output in ``fit.log``; a failed fit is a
    ``ReplayError`` with the log's last lines."""
    from fl_lightning.cli.lightning_cli import run as fit

    here = os.getcwd()
    os.chdir(folder)
    log = folder / "fit.log"
    try:
        with open(log, "a") as out, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            fit(words)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            tail = " | ".join(log.read_text().strip().splitlines()[-3:])
            raise ReplayError(f"run {name}: the replay's fit failed (exit {exit_.code}): {tail}") from None
    finally:
        os.chdir(here)


def replay_run(client: Any, run: Any, record: bool = True, progress: Any = print) -> Outcome:
    """Fit ``run``'s config again in a scratch store and compare; records the verdict unless told not to."""
    from mlflow.tracking import MlflowClient

    run_id, name = run.info.run_id, run.data.tags.get("mlflow.runName", run.info.run_id)
    if run.info.status != "FINISHED":
        raise ReplayError(f"run {name} is {run.info.status}: only a finished run has every number to check")
    names = [key for key in run.data.metrics if compared(key)]
    with tempfile.TemporaryDirectory(prefix="fl-replay-") as scratch:
        folder = Path(scratch)
        try:
            text = Path(client.download_artifacts(run_id, CONFIG_ARTIFACT, scratch)).read_text()
        except Exception:
            raise ReplayError(f"run {name} has no {CONFIG_ARTIFACT} artifact (a Trainer script's run): only runs of "
                              "`fl-lightning fit` and the benchmark runner log the settings to replay") from None
        uri = sqlite_uri(folder / "replay.db")
        route = tuple(fit_lengths(run.data.tags, run.data.params))
        config = replay_config(text, uri, folder, checkpoints=bool(route))
        progress(f"replaying {name} ...")
        for index, length in enumerate(route or (None,)):
            fit_in(folder, name, route_fit(folder, config, length, continues=index > 0))
        scratch_client = MlflowClient(uri)
        experiment = scratch_client.get_experiment_by_name(REPLAY_EXPERIMENT)
        if experiment is None:
            raise ReplayError(f"run {name}: the replay's fit logged no run")
        (again,) = scratch_client.search_runs([experiment.experiment_id])
        stored = histories(client, run_id, names)
        replayed = histories(scratch_client, again.info.run_id, [k for k in again.data.metrics if compared(k)])
    divergence = first_divergence(stored, replayed)
    rounds = max((max(steps) for steps in stored.values() if steps), default=0)
    if divergence is None:
        outcome = Outcome(run_id, name, True, rounds, len(stored), route=route)
    else:
        step, metric, mine, theirs = divergence
        outcome = Outcome(run_id, name, False, rounds, len(stored),
                          f"round {step}: {metric} stored {_text(mine)}, replayed {_text(theirs)}", route)
    if record:
        client.set_tag(run_id, RESULT_TAG, outcome.verdict)
        client.set_tag(run_id, DATE_TAG, datetime.date.today().isoformat())
    return outcome


def check_existing_store(uri: str) -> None:
    """A SQLite store must exist already: replay reads runs, it never creates a store."""

    path = sqlite_file(uri)
    if path is not None and not path.is_file():
        raise ReplayError(f"no MLflow store at {path}: give the store that holds the run with --tracking-uri")


def main(argv: Sequence[str] | None = None) -> int:
    """``fl-lightning replay``: fits the given runs (or ``--sample`` K finished runs
    of ``--experiment``) again into a scratch store and prints one line per run;
    returns 0 when every replay is identical, 1 when one differs, 2 after an error."""
    parser = OneLineParser(prog="fl-lightning replay", description=(
        "Fit a stored run again from its logged settings (its config.yaml) into a scratch store and compare "
        "every metric of every round with the stored run, wall-clock times aside."), epilog=(
        "Exit status: 0 when every run replayed was identical, 1 when one diverged, 2 when a run could not "
        "be replayed."))
    parser.add_argument("runs", nargs="*", help="run ids or run names (a name several runs share, or one holding "
                        "both ' and \", is refused: give the id)")
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_TRACKING_URI),
                        help="the store holding the runs (default: $MLFLOW_TRACKING_URI, else %(default)s); a "
                        "SQLite store must exist already")
    parser.add_argument("--experiment", help="with --sample: the experiment (a suite's name) to sample")
    parser.add_argument("--sample", type=int, help="replay this many finished runs of --experiment, chosen with "
                        "seed 0")
    parser.add_argument("--no-record", action="store_true", help="leave the stored runs untouched (no "
                        "replay_result / replay_date tags)")
    args = parser.parse_args(argv)
    if bool(args.sample) != bool(args.experiment) or (not args.runs and not args.sample):
        parser.error("give run ids or names, or --experiment NAME --sample K")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from mlflow.tracking import MlflowClient

    from fl_lightning.cli.preflight import PreflightError, check_tracking_store

    try:
        check_existing_store(args.tracking_uri)
        check_tracking_store(args.tracking_uri)
        client = MlflowClient(args.tracking_uri)
        runs = ([find_run(client, key) for key in args.runs] if args.runs
                else sample_runs(client, args.experiment, args.sample))
        outcomes = [replay_run(client, run, record=not args.no_record) for run in runs]
    except (ReplayError, PreflightError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for outcome in outcomes:
        print(outcome.line())
    same = sum(o.identical for o in outcomes)
    if len(outcomes) > 1:
        print(f"{same} of {len(outcomes)} runs identical")
    return 0 if same == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
