"""The export's ``--tag KEY=VALUE`` filters: parsed, matched against a run's tags, and checked
to select some run (on the runs' tags alone before the histories are read, and again after)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from fl_lightning.records.errors import first_line
from fl_lightning.records.read_only_store import NO_EXPERIMENTS
from fl_lightning.records.store_uri import without_credentials
from leaderboard.runs import (
    LeaderboardError,
    check_store_exists,
    reading,
    select_experiments,
    using_tracking_uri,
)


def parse_tags(texts: Iterable[str] | None) -> dict[str, set[str]]:
    """``["suite=fedfv-offline", "seed=0", "seed=1"]`` -> ``{"suite": {"fedfv-offline"}, "seed": {"0", "1"}}``."""
    wanted: dict[str, set[str]] = {}
    for text in texts or ():
        key, sep, value = text.partition("=")
        key = key.strip()
        if not sep or not key:
            raise LeaderboardError(f"--tag {text!r} is not KEY=VALUE; pass e.g. --tag suite=fedfv-offline "
                                   "(repeat --tag for several)")
        wanted.setdefault(key, set()).add(value)
    return wanted


def matches(tags: Mapping[str, str], wanted: Mapping[str, set[str]]) -> bool:
    return all(tags.get(key) in values for key, values in wanted.items())


def _listing(values: Iterable[str], limit: int = 12) -> str:
    values = sorted(values)
    shown = ", ".join(values[:limit])
    return shown + (f", ... ({len(values) - limit} more)" if len(values) > limit else "")


def check_tags_match(tagged: list[Mapping[str, str]], wanted: Mapping[str, set[str]]) -> None:
    """Every ``--tag`` KEY is a tag of some run and selects some run: else say which values there are."""
    for key, values in wanted.items():
        present = {tags[key] for tags in tagged if key in tags}
        if not present:
            known = {k for tags in tagged for k in tags if not k.startswith("mlflow.")}
            raise LeaderboardError(f"--tag {key}=...: no run read has a tag {key!r}; tags of these runs: "
                                   f"{_listing(known) or '(none: no runs)'}")
        if not values & present:
            raise LeaderboardError(f"--tag {key}={_listing(values)}: no run read has that value; values of "
                                   f"{key!r}: {_listing(present)}")
    if wanted and not any(matches(tags, wanted) for tags in tagged):
        given = " ".join(f"--tag {k}={v}" for k, values in wanted.items() for v in sorted(values))
        raise LeaderboardError(f"no run read has all of {given} (each matches some run, not together)")


def precheck_tags(tracking_uri: str, experiments: Sequence[str] | None, wanted: Mapping[str, set[str]]) -> None:
    """``check_tags_match`` on the runs' tags alone (one search, no histories): a typo in --tag is
    reported before the long read of the histories. A missing store or an unknown experiment is
    refused here as ``load_runs`` refuses it; a store without experiments is left to ``load_runs``."""
    if not wanted or check_store_exists(tracking_uri) == NO_EXPERIMENTS:
        return
    with reading(tracking_uri) as read_uri:
        try:
            _, _, ids = select_experiments(MlflowClient(tracking_uri=read_uri), experiments)
            with using_tracking_uri(read_uri):
                found = mlflow.search_runs(experiment_ids=ids, output_format="list") if ids else []
        except MlflowException as error:
            raise LeaderboardError(f"cannot read the MLflow store {without_credentials(tracking_uri)}: "
                                   f"{first_line(error.message)}") from None
    check_tags_match([dict(run.data.tags) for run in found], wanted)
