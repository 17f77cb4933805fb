"""Builders the leaderboard's tests share: runs logged as the benchmark runner and ``fl-lightning
fit`` leave them, a site built from a store, and a reader of the built pages.

* ``runner_tags``, ``task_tags``, ``log_run``: the tags the runner writes (``suite``, ``benchmark``,
  ``cell``, ``algorithm_config``, ``seed``, ``task`` / ``task_key``, ``client_test``, ...) and one
  run logged by hand with them and chosen final metrics.
* ``build``: ``python -m leaderboard build`` from a store into a folder; what it printed.
* ``Page``, ``read_page``, ``page_path``, ``leaderboard_table``, ``rows_by_config``, ``main_number``,
  ``markdown_rows``: the tables, images and links of a built page, read back.
* ``record``: one ``RunRecord`` made by hand, for the table rules without a store.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from contextlib import redirect_stdout
from html.parser import HTMLParser
from io import StringIO
from pathlib import Path

from mlflow.entities import Metric, Param

from tests.paths import REPO

ROOT = REPO
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the leaderboard package lives at the repository root

from leaderboard.__main__ import main as leaderboard_main  # noqa: E402
from leaderboard.table_building import slugify  # noqa: E402

SUITE = "demo-offline"
BENCHMARK = "digits/iid/full/fl_logreg"


def runner_tags(config: str, seed: int, benchmark: str = BENCHMARK) -> dict[str, str]:
    return {"suite": SUITE, "scale": "offline", "paper": "fedfv", "benchmark": benchmark,
            "cell": f"{benchmark}/{config}", "algorithm_config": config, "seed": str(seed)}


def build(uri: str, out: Path, papers: Path) -> str:
    printed = StringIO()
    with redirect_stdout(printed):
        code = leaderboard_main(["build", "--tracking-uri", uri, "--out", str(out), "--paper-numbers", str(papers)])
    assert code == 0
    return printed.getvalue()


# --- the contract: the tags of fl-lightning fit and the runner on runs logged by hand ---------------

OLD = "digits/iid/full/fl_logreg"
SHA_A, SHA_B = "a" * 40, "b" * 40
DESCRIPTION = "Verdict fixtures: 100 clients of mnist5k with McMahan shards (200 x 2), 10% sampled."
CLIENT_TEST_SIZE = "local: 2-40 samples per client (median 10)"
BASE_TASK = {"source": "mnist5k", "source_params": {}, "partition": "shards",
             "partition_params": {"num_shards": 200, "shards_per_client": 2}, "num_clients": 100,
             "fraction": 0.1, "model": "fl_mlp", "num_rounds": 10, "local_epochs": 1, "batch_size": None,
             "test_mode": "local", "local_test_fraction": 0.2, "dropout_prob": 0.0}


def task_tags(drop: tuple[str, ...] = (), **changes) -> dict[str, str]:
    """The ``task`` / ``task_key`` tags of the contract: canonical JSON and a 12-hex digest of it."""
    fields = {k: v for k, v in {**BASE_TASK, **changes}.items() if k not in drop}
    text = json.dumps(fields, sort_keys=True)
    return {"task": text, "task_key": hashlib.sha256(text.encode()).hexdigest()[:12]}


def log_run(client, experiment_id: str, suite: str, benchmark: str, config: str, seed: int,
            metrics: dict[str, float], *, tags: dict[str, str] | None = None, status: str = "FINISHED",
            minute: int = 0, rounds: int = 10, params: dict[str, str] | None = None) -> str:
    """One run as the runner and fl-lightning fit leave it: tags, final metrics at step = rounds."""
    base = {"suite": suite, "scale": "offline", "paper": "fedfv", "benchmark": benchmark,
            "cell": f"{benchmark}/{config}", "algorithm_config": config, "algorithm": config.split("(")[0],
            "seed": str(seed), "git_sha": SHA_A, "suite_description": DESCRIPTION,
            "client_test": "local", "client_test_size": CLIENT_TEST_SIZE, "per_client_models": "false",
            **task_tags()}
    merged = {k: v for k, v in {**base, **(tags or {})}.items() if v is not None}
    start = 1_767_225_600_000 + minute * 60_000  # 2026-01-01 + minutes: the order runs were made
    run_id = client.create_run(experiment_id, start_time=start, tags=merged).info.run_id
    logged = [Metric(name, float(value), start + 1000, rounds) for name, value in metrics.items()]
    logged += [Metric("client_time_s", 0.1, start + 1000, step) for step in range(1, rounds + 1)]
    client.log_batch(run_id, metrics=logged, params=[Param(k, v) for k, v in (params or {}).items()])
    client.set_terminated(run_id, status, end_time=start + 30_000)
    return run_id


# --- reading the built pages ---------------------------------------------------------------

class Page(HTMLParser):
    """Tables (by id: headers, rows of cells with text, classes, data-sort) and images of a page."""

    def __init__(self, text: str):
        super().__init__()
        self.tables: dict[str, dict] = {}
        self.images: list[str] = []
        self.links: list[str] = []
        self._table = None
        self._cell = None
        self._in_head = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self._table = self.tables.setdefault(attrs.get("id", f"table{len(self.tables)}"),
                                                 {"headers": [], "rows": []})
        elif tag == "thead":
            self._in_head = True
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._table is not None:
            self._cell = {"text": "", "classes": (attrs.get("class") or "").split(), "sort": attrs.get("data-sort"),
                          "key": attrs.get("data-key"), "title": attrs.get("title") or ""}
        elif tag == "img":
            self.images.append(attrs["src"])
        elif tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._cell["text"] = " ".join(self._cell["text"].split())
            self._row.append(self._cell)
            self._cell = None
        elif tag == "thead":
            self._in_head = False
        elif tag == "tr" and self._table is not None and self._row:
            (self._table["headers"] if self._in_head else self._table["rows"]).append(self._row)
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data + " "


def read_page(path: Path) -> Page:
    return Page(path.read_text())


def page_path(out: Path, key: str, suite: str | None = None) -> Path:
    return out / "benchmarks" / f"{slugify(key, set())}.html"


def leaderboard_table(page: Page) -> tuple[list[str], list[dict[str, dict]]]:
    table = next(t for name, t in page.tables.items() if name.startswith("leaderboard-"))
    keys = [h["key"] for h in table["headers"][0]]
    return keys, [dict(zip(keys, row)) for row in table["rows"]]


def rows_by_config(page: Page) -> dict[str, dict[str, dict]]:
    return {row["config"]["text"]: row for row in leaderboard_table(page)[1]}


def main_number(cell: dict) -> str:
    """The value of a cell without its marks, rank and ± line."""
    return cell["text"].split()[0]


def markdown_rows(text: str, first_header: str) -> list[list[str]]:
    """The rows of the first Markdown table whose header row starts with ``first_header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


# --- a run record made by hand -------------------------------------------------------------------

def record(run_id: str, config: str, seed: int, status: str, minute: int, accuracy: float | None = None):
    from datetime import datetime, timezone

    from leaderboard.runs import RunRecord

    return RunRecord(run_id=run_id, experiment=SUITE, status=status,
                     start_time=datetime(2026, 1, 1, 0, minute, tzinfo=timezone.utc), end_time=None,
                     tags={"suite": SUITE, "scale": "offline", "benchmark": BENCHMARK, "algorithm_config": config,
                           "seed": str(seed)},
                     params={}, metrics={} if accuracy is None else {"test_acc_mean": accuracy})
