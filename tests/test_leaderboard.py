"""The leaderboard end to end: runs in temporary MLflow stores -> the site -> what a reader sees.

Two stores, both written with the real MLflow client into a temporary SQLite file:

* ``store``: real ``fl-lightning fit`` runs through the CLI (FedAvg and FedProx(mu=1.0) on 6 clients
  of the digits, logistic regression, 3 rounds of 5 full-batch local epochs, two seeds each; plus
  FedAvg with 2 rounds, which must never be ranked with the 3-round runs), a FAILED and a RUNNING
  run made by hand, and a sparse second benchmark. Expected numbers and verdicts are recomputed
  here from the MLflow API.
* ``contract``: runs logged by hand with the tags ``fl-lightning fit`` and the benchmark runner write
  (``task``, ``task_key``, ``client_test``, ``client_test_size``, ``per_client_models``,
  ``suite_description``, ``control``, ...) and chosen values: a clear separation with 3 seeds, a tie
  within seed noise, a 20-round run beside 10-round ones, a seed run twice, a benchmark tested on
  one shared set (client test ``global``) beside a local one, attack and dropout variants with
  their declared controls, several code versions, older runs with params but no task tag.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import statistics
import sys
from contextlib import redirect_stdout
from html.parser import HTMLParser
from io import StringIO
from pathlib import Path

import mlflow
import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from scipy.stats import t as scipy_t

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the leaderboard package lives at the repository root

from leaderboard.__main__ import main as leaderboard_main  # noqa: E402
from leaderboard.runs import using_tracking_uri  # noqa: E402
from leaderboard.stats import welch_test  # noqa: E402
from leaderboard.table_building import slugify  # noqa: E402
from leaderboard.tables import COLUMNS, MISSING  # noqa: E402

SUITE = "demo-offline"
BENCHMARK = "digits/iid/full/fl_logreg"
SPARSE_BENCHMARK = "digits/iid/full/fl_mlp"
CONFIGS = {"FedAvg": [], "FedProx(mu=1.0)": ["--model=FedProx", "--model.mu=1.0"]}
SEEDS = (0, 1)
FAILED_ERROR = "RuntimeError: client losses became NaN at round 2"
JUDGED = {c.key: c.better for c in COLUMNS if c.better}


def runner_tags(config: str, seed: int, benchmark: str = BENCHMARK) -> dict[str, str]:
    return {"suite": SUITE, "scale": "offline", "paper": "fedfv", "benchmark": benchmark,
            "cell": f"{benchmark}/{config}", "algorithm_config": config, "seed": str(seed)}


def fit(uri: str, config: str, seed: int, rounds: int = 3) -> None:
    from fl_lightning.cli import main as fit_main

    tags = ", ".join(f"{k}: '{v}'" for k, v in runner_tags(config, seed).items())
    fit_main([
        "fit",
        f"--trainer.logger.init_args.tracking_uri={uri}",
        f"--trainer.logger.init_args.experiment_name={SUITE}",
        f"--trainer.logger.init_args.tags={{{tags}}}",
        *CONFIGS[config],
        f"--model.num_rounds={rounds}", "--model.eval_every=1", "--model.fraction=1.0",
        "--model.backbone=fl_logreg", "--model.batch_size=null", "--model.local_epochs=5", "--model.lr=0.5",
        f"--model.seed={seed}",
        f"--seed_everything={seed}",
        "--data.source=digits", "--data.num_clients=6", "--data.partition=iid", "--data.partition_params={}",
        f"--data.seed={seed}",
    ])


PAPER_YAML = """\
- benchmark_setting: "digits, 6 clients, IID, full participation, logistic regression (test fixture)"
  matches_benchmark: digits/iid/full/fl_logreg
  algorithm_config: FedAvg
  metrics: {test_acc_mean: 0.9, test_acc_var_percent2: 12.57}
  source: Fixture Table 1
- benchmark_setting: "CIFAR-10, 100 clients, 200 shards x 2, FFN, 10% sampled, 2000 rounds"
  matches_benchmark: null
  algorithm_config: FedFV(alpha=0.1,tau=10)
  metrics: {test_acc_mean: 0.5042, test_acc_worst5: 0.3224}
  source: FedFV Table 2
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real MLflow store: the fits, a FAILED run, a RUNNING run, a sparse second benchmark."""
    import torch

    tmp = tmp_path_factory.mktemp("leaderboard")
    uri = f"sqlite:///{tmp / 'runs.db'}"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is faster on a busy CPU
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)  # checkpoints and artifacts land in the temporary folder
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        for config in CONFIGS:
            for seed in SEEDS:
                fit(uri, config, seed)
        fit(uri, "FedAvg", 0, rounds=2)  # another task: never ranked with the 3-round runs
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(SUITE).experiment_id

        failed = client.create_run(experiment, tags={**runner_tags("FedProx(mu=1.0)", 2), "algorithm": "FedProx",
                                                     "error": FAILED_ERROR})
        client.log_metric(failed.info.run_id, "test_acc_mean", 0.0123, step=1)  # must not enter the mean
        client.log_metric(failed.info.run_id, "client_time_s", 0.5, step=1)
        client.set_terminated(failed.info.run_id, "FAILED")

        running = client.create_run(experiment, tags={**runner_tags("FedAvg", 2), "algorithm": "FedAvg"})
        client.log_metric(running.info.run_id, "test_acc_mean", 0.99, step=1)

        sparse = client.create_run(experiment, tags={**runner_tags("FedAvg", 0, SPARSE_BENCHMARK),
                                                     "algorithm": "FedAvg"})
        client.log_metric(sparse.info.run_id, "test_acc_mean", 0.75, step=3)
        client.set_terminated(sparse.info.run_id, "FINISHED")

        papers = tmp / "papers"
        (papers / "fixture").mkdir(parents=True)
        (papers / "fixture" / "paper_numbers.yaml").write_text(PAPER_YAML)
    torch.set_num_threads(threads)
    return {"uri": uri, "tmp": tmp, "papers": papers, "failed": failed.info.run_id,
            "running": running.info.run_id, "sparse": sparse.info.run_id}


def build(uri: str, out: Path, papers: Path) -> str:
    printed = StringIO()
    with redirect_stdout(printed):
        code = leaderboard_main(["build", "--tracking-uri", uri, "--out", str(out), "--paper-numbers", str(papers)])
    assert code == 0
    return printed.getvalue()


@pytest.fixture(scope="module")
def site(store):
    out = store["tmp"] / "site"
    return {"out": out, "stdout": build(store["uri"], out, store["papers"])}


# --- the contract store: runs with the tags of fl-lightning fit and the runner ------------------

VERDICTS = "verdicts-offline"
ROBUSTNESS = "robustness-offline"
SHARDS = "mnist5k/shards-200x2/p0.1/fl_mlp"
CLA = "mnist5k/cla/full/fl_mlp"
OLD = "digits/iid/full/fl_logreg"
ROBUST = "synthetic/natural/p0.2/fl_logreg"
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


# per-seed (headline, worst 10%): FedFV clearly above FedAvg (3 seeds), their worst 10% within noise
SEPARATED = {
    "FedFV(alpha=0.1,tau=1)": [(0.90, 0.52), (0.91, 0.41), (0.89, 0.62)],
    "FedAvg": [(0.80, 0.50), (0.81, 0.60), (0.79, 0.40)],
    "QFedAvg(q=1.0)": [(0.70, 0.10), (0.71, 0.11), (0.69, 0.09)],
}
CONTRACT_PAPERS = f"""\
- benchmark_setting: "CIFAR-10, 100 clients, 200 shards x 2, FFN (fixture)"
  matches_benchmark: null
  offline_counterpart: {SHARDS}
  algorithm_config: FedAvg
  metrics: {{test_acc_mean: 0.50}}
  source: Fixture Table 2
- benchmark_setting: "CIFAR-10, 100 clients, 200 shards x 2, FFN (fixture)"
  matches_benchmark: null
  offline_counterpart: {SHARDS}
  algorithm_config: FedFV(alpha=0.1,tau=10)
  counterpart_config: FedFV(alpha=0.1,tau=1)
  metrics: {{test_acc_mean: 0.55}}
  source: Fixture Table 2
"""


def log_verdict_runs(client, experiment_id: str) -> dict[str, str]:
    ids = {}
    for config, values in SEPARATED.items():
        for seed, (headline, worst10) in enumerate(values):
            sha = SHA_B if (config, seed) == ("QFedAvg(q=1.0)", 2) else SHA_A
            ids[f"{config}/{seed}"] = log_run(
                client, experiment_id, VERDICTS, SHARDS, config, seed, minute=10 + seed,
                tags={"git_sha": sha},
                metrics={"test_acc_mean": headline, "test_acc_worst10": worst10, "test_acc_std": 0.1 + 0.01 * seed,
                         "test_acc_best5": 1.0, "test_acc_jain": 0.95, "global_test_acc": headline - 0.01})
    # the same seed run earlier: superseded by the newer run above, never in the mean
    ids["superseded"] = log_run(client, experiment_id, VERDICTS, SHARDS, "FedAvg", 0, minute=1,
                                metrics={"test_acc_mean": 0.10, "test_acc_worst10": 0.0})
    # FedFV run for 20 rounds: a better number that must never be ranked with the 10-round runs
    for seed in (0, 1):
        ids[f"rounds20/{seed}"] = log_run(client, experiment_id, VERDICTS, SHARDS, "FedFV(alpha=0.1,tau=1)", seed,
                                          minute=20 + seed, rounds=20, tags=task_tags(num_rounds=20),
                                          metrics={"test_acc_mean": 0.99, "test_acc_worst10": 0.9})

    # one shared test set (client test global): DW's identical models would give std 0 and Jain 1
    cla_global = task_tags(drop=("local_test_fraction",), partition="linspace_classes", partition_params={},
                           num_clients=10, fraction=1.0, test_mode="global", global_test_fraction=0.2)
    global_tags = {**cla_global, "client_test": "global", "client_test_size": "global: 1,000-sample shared test set"}
    for seed in (0, 1, 2):
        log_run(client, experiment_id, VERDICTS, CLA, "DW", seed, minute=30 + seed,
                tags={**global_tags, "per_client_models": "true"},
                metrics={"test_acc_mean": 0.75 + 0.01 * seed, "test_acc_std": 0.0, "test_acc_jain": 1.0,
                         "test_acc_worst10": 0.75 + 0.01 * seed, "global_test_acc": 0.75 + 0.01 * seed,
                         "cgsv_rho": 40.0 + 10 * seed})
        log_run(client, experiment_id, VERDICTS, CLA, "FedAvg", seed, minute=30 + seed, tags=global_tags,
                metrics={"global_test_acc": 0.82 + 0.01 * seed})
        log_run(client, experiment_id, VERDICTS, CLA, "QFedAvg(q=1.0)", seed, minute=30 + seed, tags=global_tags,
                metrics={"conflicts_model": 1.0})
    # the same benchmark with each client's own test: another task, never ranked with the global one
    cla_local = task_tags(partition="linspace_classes", partition_params={}, num_clients=10, fraction=1.0)
    for seed in (0, 1):
        log_run(client, experiment_id, VERDICTS, CLA, "FedAvg", seed, minute=40 + seed, tags=cla_local,
                metrics={"test_acc_mean": 0.60, "test_acc_std": 0.2, "test_acc_worst10": 0.2})

    # older runs: no task tag, the task rebuilt from their params (rounds differ)
    for rounds in (10, 20):
        log_run(client, experiment_id, VERDICTS, OLD, "FedAvg", 0, minute=50 + rounds, rounds=rounds,
                tags={"task": None, "task_key": None, "client_test": None, "client_test_size": None,
                      "per_client_models": None, "git_sha": None},
                params={"num_rounds": str(rounds), "num_clients": "6", "source": "digits", "partition": "iid",
                        "test_mode": "local", "local_test_fraction": "0.2", "global_test_fraction": "0.2",
                        "fraction": "1.0", "attack": "None", "lr": "0.5"},
                metrics={"test_acc_mean": 0.5 + rounds / 100})
    return ids


# robustness: (no-attack, client0-every-round, bias-attack-10, dropout-0.5) headline per configuration
ROBUST_VALUES = {"FedAvg": (0.84, 0.80, 0.70, 0.83), "FedMGDAPlus(epsilon=0.1)": (0.85, 0.84, 0.82, 0.80)}
ROBUST_VARIANTS = (("no-attack", None, {}), ("client0-every-round", None, {"attack": "bias", "attack_client": 0,
                                                                             "attack_strength": 0.0}),
                   ("bias-attack-10", "client0-every-round", {"attack": "bias", "attack_client": 0,
                                                              "attack_strength": 10.0}),
                   ("dropout-0.5", "no-attack", {"dropout_prob": 0.5}))


def log_robustness_runs(client, experiment_id: str) -> None:
    for index, (variant, control, changes) in enumerate(ROBUST_VARIANTS):
        for config, values in ROBUST_VALUES.items():
            for seed in (0, 1):
                log_run(client, experiment_id, ROBUSTNESS, f"{ROBUST}/{variant}", config, seed, minute=60 + index,
                        tags={**task_tags(source="synthetic", partition="natural", partition_params={},
                                          num_clients=30, fraction=0.2, model="fl_logreg", **changes),
                              "control": f"{ROBUST}/{control}" if control else None,
                              "suite_description": "One malicious client; its control takes part honestly.",
                              "paper": "fedmgda_plus"},
                        metrics={"test_acc_mean": values[index] + 0.002 * seed,
                                 "test_acc_worst10": values[index] / 2 + 0.002 * seed})


@pytest.fixture(scope="module")
def contract(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("contract")
    uri = f"sqlite:///{tmp / 'contract.db'}"
    client = MlflowClient(tracking_uri=uri)
    verdicts = client.create_experiment(VERDICTS, artifact_location=(tmp / "artifacts").as_uri())
    robustness = client.create_experiment(ROBUSTNESS, artifact_location=(tmp / "artifacts").as_uri())
    ids = log_verdict_runs(client, verdicts)
    log_robustness_runs(client, robustness)
    papers = tmp / "papers" / "fedfv"  # the suite's paper tag: its gains are compared
    papers.mkdir(parents=True)
    (papers / "paper_numbers.yaml").write_text(CONTRACT_PAPERS)
    out = tmp / "site"
    stdout = build(uri, out, tmp / "papers")
    return {"uri": uri, "tmp": tmp, "out": out, "ids": ids, "stdout": stdout}


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


def benchmark_page(site, key=BENCHMARK) -> tuple[Path, Page]:
    path = page_path(site["out"], key)
    return path, read_page(path)


def leaderboard_table(page: Page) -> tuple[list[str], list[dict[str, dict]]]:
    table = next(t for name, t in page.tables.items() if name.startswith("leaderboard-"))
    keys = [h["key"] for h in table["headers"][0]]
    return keys, [dict(zip(keys, row)) for row in table["rows"]]


def rows_by_config(page: Page) -> dict[str, dict[str, dict]]:
    return {row["config"]["text"]: row for row in leaderboard_table(page)[1]}


def main_number(cell: dict) -> str:
    """The value of a cell without its marks, rank and ± line."""
    return cell["text"].split()[0]


def final_value(client: MlflowClient, run_id: str, name: str) -> float | None:
    history = client.get_metric_history(run_id, name)
    return max(history, key=lambda m: (m.step, m.timestamp)).value if history else None


def search(uri: str, filter_string: str = "") -> list:
    """The runs of the suite, read with mlflow.search_runs from this store (not the global URI)."""
    with using_tracking_uri(uri):
        return mlflow.search_runs(experiment_names=[SUITE], filter_string=filter_string, output_format="list")


def three_round_runs(uri: str) -> list:
    return [r for r in search(uri, f"tags.benchmark = '{BENCHMARK}'")
            if r.info.status == "FINISHED" and r.data.params.get("num_rounds") == "3"]


def per_seed_values(uri: str) -> dict[str, dict[str, list[float]]]:
    """Per configuration, each column's per-seed values, recomputed from the MLflow API."""
    client = MlflowClient(tracking_uri=uri)
    expected: dict[str, dict[str, list[float]]] = {}
    for run in three_round_runs(uri):
        per_column = expected.setdefault(run.data.tags["algorithm_config"], {})
        run_id = run.info.run_id
        for column in ("test_acc_mean", "test_acc_std", "test_acc_var", "test_acc_angle",
                       "test_acc_worst5", "test_acc_worst10", "test_acc_best5", "test_acc_jain"):
            per_column.setdefault(column, []).append(final_value(client, run_id, column))
        conflicts = [m.value for m in client.get_metric_history(run_id, "conflicts_model")]
        per_column.setdefault("conflicts_model", []).append(statistics.fmean(conflicts))
        times = {}
        for name in ("client_time_s", "server_time_s"):
            for m in client.get_metric_history(run_id, name):
                times[m.step] = times.get(m.step, 0.0) + m.value
        per_column.setdefault("time_per_round", []).append(statistics.fmean(times.values()))
    assert sorted(expected) == sorted(CONFIGS) and all(len(v["test_acc_mean"]) == len(SEEDS) for v in expected.values())
    return expected


def expected_marks(values: dict[str, list[float]], better: str) -> dict[str, str]:
    """The verdict rule, recomputed: ★ when the top row is separated from every other (Welch p <
    0.05), else ≈ on the top row and the rows not separated from it."""
    sign = 1 if better == "max" else -1
    order = sorted(values, key=lambda c: -sign * statistics.fmean(values[c]))
    top, others = order[0], order[1:]
    tied = {c for c in others if (test := welch_test(values[top], values[c])) is None or test.p >= 0.05}
    return {top: "★" if not tied else "≈", **{c: "≈" if c in tied else "" for c in others}}


# --- the Welch test ------------------------------------------------------------------------------

def test_welch_p_matches_known_values():
    result = welch_test([1, 2, 3], [4, 5, 6])
    assert result.t == pytest.approx(-3.674235, abs=1e-6) and result.df == pytest.approx(4.0)
    assert result.p == pytest.approx(0.021312, abs=1e-6)
    unequal = welch_test([0.80, 0.81, 0.79, 0.80], [0.70, 0.75, 0.65])  # unequal variances: fractional df
    se2 = (0.0001 / 1.5 / 4, 0.0025 / 3)  # the samples' variance / n, by hand
    t = 0.1 / math.sqrt(sum(se2))
    df = sum(se2) ** 2 / (se2[0] ** 2 / 3 + se2[1] ** 2 / 2)  # 2.08
    assert unequal.t == pytest.approx(t) and unequal.df == pytest.approx(df)
    assert unequal.p == pytest.approx(2 * scipy_t.sf(t, df), rel=1e-9)
    assert unequal.p < 1 - t / math.sqrt(t * t + 2)  # df = 2 has a closed form; more df, smaller p
    assert welch_test([0.8], [0.7, 0.71]) is None  # one seed: no test
    assert welch_test([0.5, 0.5], [0.4, 0.4]).p == 0.0 and welch_test([0.5, 0.5], [0.5, 0.5]).p == 1.0
    assert welch_test([0.1, 0.1, 0.1], [0.1, 0.1]).p == 1.0  # no spread, same mean: never separated


# --- the real store: fl-lightning fit runs -------------------------------------------------------

def test_runner_tags_land_on_the_runs(store):
    runs = search(store["uri"])
    fitted = [r for r in runs if r.data.tags.get("mlflow.source.type")]  # made by the CLI, not by hand
    assert len(fitted) == len(CONFIGS) * len(SEEDS) + 1
    for run in fitted:
        tags = run.data.tags
        assert tags["suite"] == SUITE and tags["scale"] == "offline" and tags["paper"] == "fedfv"
        assert tags["benchmark"] == BENCHMARK and tags["cell"] == f"{BENCHMARK}/{tags['algorithm_config']}"
        assert tags["algorithm_config"] in CONFIGS
        assert tags["algorithm"] == ("FedAvg" if tags["algorithm_config"] == "FedAvg" else "FedProx")
        assert tags["seed"] in {str(s) for s in SEEDS} and tags["dataset"] == "digits"
        assert tags["participation"] == "full" and tags["model"] == "fl_logreg"


def test_build_prints_progress_and_where_to_open(site):
    out = site["stdout"]
    assert "Read 8 runs from 1 experiment(s)" in out
    assert "Wrote 3 benchmark page(s) from 8 runs" in out  # 3-round, 2-round, sparse
    assert (site["out"] / "index.html").resolve().as_uri() in out


def test_fits_with_other_rounds_are_never_ranked_with_them(site, store):
    """FedAvg for 2 rounds is another task: its own table, not a row of the 3-round table."""
    _, page = benchmark_page(site)
    rows = rows_by_config(page)
    expected = per_seed_values(store["uri"])
    assert math.isclose(float(rows["FedAvg"]["test_acc_mean"]["sort"]),
                        statistics.fmean(expected["FedAvg"]["test_acc_mean"]), rel_tol=1e-9)
    others = [p for p in (site["out"] / "benchmarks").glob("*task-*.html")]
    assert len(others) == 1
    other = read_page(others[0])
    (row,) = leaderboard_table(other)[1]
    assert row["config"]["text"] == "FedAvg" and row["rounds"]["text"].startswith("2")
    assert "rounds 2" in others[0].read_text() and "rounds 3" in others[0].read_text()
    assert not any("best" in c["classes"] or "tie" in c["classes"] for c in row.values())  # alone: no verdict


def test_one_row_per_configuration_with_mean_std_and_n(site, store):
    _, page = benchmark_page(site)
    keys, rows = leaderboard_table(page)
    assert sorted(r["config"]["text"] for r in rows) == sorted(CONFIGS)
    expected = per_seed_values(store["uri"])
    columns = {c.key: c for c in COLUMNS}
    for row in rows:
        config = row["config"]["text"]
        for key, values in expected[config].items():
            cell, column = row[key], columns[key]
            mean, std = statistics.fmean(values), statistics.stdev(values)
            assert math.isclose(float(cell["sort"]), mean, rel_tol=1e-9), (config, key)
            assert main_number(cell) == f"{mean * column.scale:.{column.decimals}f}", (config, key)
            assert f"± {std * column.scale:.{column.decimals}f} · n={len(SEEDS)}" in cell["text"], (config, key)
        # FedProx: + the FAILED seed; FedAvg: + the RUNNING seed (runs with no task record join the main table)
        assert row["seeds"]["text"] == f"{len(SEEDS)} / {len(SEEDS) + 1}"
        assert row["rounds"]["text"] == "3 / 3"


def test_verdicts_follow_welch_on_the_fitted_runs(site, store):
    _, page = benchmark_page(site)
    rows = rows_by_config(page)
    expected = per_seed_values(store["uri"])
    for key, better in JUDGED.items():
        if key not in expected["FedAvg"]:
            continue
        marks = expected_marks({config: values[key] for config, values in expected.items()}, better)
        for config, mark in marks.items():
            cell = rows[config][key]
            shown = "★" if "best" in cell["classes"] else "≈" if "tie" in cell["classes"] else ""
            assert shown == mark, (key, config, cell)
            assert (mark in cell["text"]) if mark else ("★" not in cell["text"] and "≈" not in cell["text"])


def test_failed_and_unfinished_runs_are_listed(site, store):
    _, page = benchmark_page(site)
    problems = next(t for name, t in page.tables.items() if name.startswith("problems-"))
    listed = {row[0]["text"]: row for row in problems["rows"]}
    assert set(listed) == {store["failed"], store["running"]}
    failed = [c["text"] for c in listed[store["failed"]]]
    assert "FAILED" in failed and FAILED_ERROR in failed and "2" in failed
    assert any("RUNNING" in c["text"] for c in listed[store["running"]])


def test_missing_metrics_are_shown_as_a_dash(site):
    _, page = benchmark_page(site, SPARSE_BENCHMARK)
    keys, rows = leaderboard_table(page)
    assert len(rows) == 1
    row = rows[0]
    assert main_number(row["test_acc_mean"]) == "75.00" and "n=1" in row["test_acc_mean"]["text"]
    assert "±" not in row["test_acc_mean"]["text"]  # one seed: no std
    assert "test_acc_std" not in keys  # never logged by any run of the table
    assert row["conflicts_model"]["text"] == MISSING if "conflicts_model" in keys else True
    assert not any("best" in cell["classes"] or "tie" in cell["classes"] for cell in row.values())  # one row


def test_index_has_provenance_tables_and_offline_label(site, store):
    text = (site["out"] / "index.html").read_text()
    page = Page(text)
    assert "OFFLINE-SCALE" in text and SUITE in text and "Built" in text
    shas = {r.data.tags["git_sha"] for r in search(store["uri"]) if r.data.tags.get("git_sha")}
    assert shas and all(sha in text for sha in shas)
    assert "without a <code>machine</code> tag" in text  # falls back to the builder's CPU
    rows = page.tables["benchmarks"]["rows"]
    assert sorted(r[0]["text"] for r in rows) == sorted([BENCHMARK, BENCHMARK, SPARSE_BENCHMARK])
    main = next([c["text"] for c in r] for r in rows if r[0]["text"] == BENCHMARK and r[3]["text"].startswith("main"))
    assert "2" in main and "6" in main  # configurations, runs (with the failed and the running one)
    assert any("FAILED 1" in c and "RUNNING 1" in c for c in main)
    for link in page.links:
        if link.startswith("benchmarks/"):
            assert (site["out"] / link).exists(), link


def test_store_is_named_never_by_its_local_path(site, store):
    for path in (site["out"] / "index.html", site["out"] / "index.md", *sorted((site["out"] / "benchmarks").glob("*"))):
        if path.is_file():
            text = path.read_text()
            assert str(store["tmp"]) not in text, path
    assert "<code id=\"store\">runs.db</code>" in (site["out"] / "index.html").read_text()


def test_paper_numbers_beside_ours_and_unmatched_ones_apart(site):
    _, page = benchmark_page(site)
    comparison = next(t for name, t in page.tables.items() if name.startswith("papers-"))
    headers = [h["text"] for h in comparison["headers"][0]]
    row = {h: c["text"] for h, c in zip(headers, comparison["rows"][0])}
    assert row["Configuration"] == "FedAvg" and row["Source"] == "Fixture Table 1"
    assert row["Mean client acc. (%) paper"] == "90.00" and row["Variance (pp²) paper"] == "12.57"  # %² converted back
    assert row["Mean client acc. (%) ours"].count("±") == 1 and "n=2" in row["Mean client acc. (%) ours"]
    index = (site["out"] / "index.html").read_text()
    assert "Reported in the papers" in index and "FedFV Table 2" in index and "paper-scale" in index
    # the papers' tables no run here matches are folded below the user's own (closed: a <details> without open)
    assert '<details class="reported">' in index and index.index('<details class="reported">') < index.index(
        "FedFV Table 2"
    )
    assert "offline-scale" in index
    assert "Fixture Table 1" not in index  # matched entries live on their benchmark's page


def test_every_referenced_figure_exists(site):
    pages = [site["out"] / "index.html", *sorted((site["out"] / "benchmarks").glob("*.html"))]
    images = 0
    for path in pages:
        for src in read_page(path).images:
            assert not src.startswith(("/", "http")), src  # relative: works from file://
            assert (path.parent / src).is_file(), src
            images += 1
    assert images >= 3
    _, page = benchmark_page(site)
    assert {Path(s).name for s in page.images} == {"curves.png", "clients.png", "pareto.png"}
    for md in [site["out"] / "index.md", *sorted((site["out"] / "benchmarks").glob("*.md"))]:
        for src in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md.read_text()):
            assert (md.parent / src).is_file(), src


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


def test_markdown_twin_has_the_same_rows_and_marks(site):
    path, page = benchmark_page(site)
    table = next(t for name, t in page.tables.items() if name.startswith("leaderboard-"))
    md = markdown_rows(path.with_suffix(".md").read_text(), "Configuration")
    assert len(md) == len(table["rows"])
    for html_row, md_row in zip(table["rows"], md):
        for cell, text in zip(html_row, md_row):
            assert ("★" in text) == ("best" in cell["classes"]) and ("**" in text) == ("best" in cell["classes"])
            assert ("≈" in text) == ("tie" in cell["classes"])
            assert text.replace("**", "").split()[0] == cell["text"].split()[0]
    index_md = (site["out"] / "index.md").read_text()
    assert "OFFLINE-SCALE" in index_md
    linked = set(re.findall(r"\]\((benchmarks/[^)]+\.md)\)", index_md))
    assert len(linked) == 3 and all((site["out"] / link).is_file() for link in linked)


def test_unknown_experiment_lists_the_experiments_in_the_store(store, tmp_path, capsys):
    code = leaderboard_main(["build", "--tracking-uri", store["uri"], "--out", str(tmp_path / "site"),
                             "--experiments", "no-such-suite"])
    assert code == 2
    err = capsys.readouterr().err
    assert "no-such-suite" in err and SUITE in err
    assert not (tmp_path / "site").exists()


def test_empty_store_gives_a_page_that_says_so(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'empty.db'}"
    MlflowClient(tracking_uri=uri).search_experiments()  # creates the (empty) store
    code = leaderboard_main(["build", "--tracking-uri", uri, "--out", str(tmp_path / "site"),
                             "--paper-numbers", str(tmp_path / "none")])
    assert code == 0
    assert "No runs found" in (tmp_path / "site" / "index.html").read_text()
    assert "No runs found" in (tmp_path / "site" / "index.md").read_text()
    assert "file://" in capsys.readouterr().out


def test_missing_store_and_foreign_output_folder_are_refused(store, tmp_path, capsys):
    code = leaderboard_main(["build", "--tracking-uri", f"sqlite:///{tmp_path / 'typo.db'}",
                             "--out", str(tmp_path / "site")])
    assert code == 2 and "does not exist" in capsys.readouterr().err
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    code = leaderboard_main(["build", "--tracking-uri", store["uri"], "--out", str(foreign)])
    assert code == 2 and "not a leaderboard site" in capsys.readouterr().err
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_rebuild_replaces_the_previous_site(site, store):
    """A page an earlier build wrote (in its marker's manifest) and no longer writes goes away."""
    from leaderboard.site import MARKER

    stale = site["out"] / "benchmarks" / "stale.html"
    stale.write_text("old")
    marker = site["out"] / MARKER
    marker.write_text(marker.read_text() + "- benchmarks/stale.html\n")
    code = leaderboard_main(["build", "--tracking-uri", store["uri"], "--out", str(site["out"]),
                             "--experiments", SUITE, "--paper-numbers", str(store["papers"])])
    assert code == 0 and not stale.exists() and (site["out"] / "index.html").exists()
    assert (site["out"].stat().st_mode & 0o777) == 0o777 & ~current_umask()  # not mkdtemp's 0700


def current_umask() -> int:
    import os

    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_a_rebuild_refuses_to_lose_a_file_it_did_not_write(site, store, capsys):
    mine = site["out"] / "my-notes.md"
    mine.write_text("a reader's notes")
    code = leaderboard_main(["build", "--tracking-uri", store["uri"], "--out", str(site["out"]),
                             "--experiments", SUITE, "--paper-numbers", str(store["papers"])])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "my-notes.md" in err and "did not write" in err
    assert mine.read_text() == "a reader's notes" and (site["out"] / "index.html").exists()
    mine.unlink()  # the shared site fixture stays as built


# --- the contract store: like with like, verdicts, fairness, controls ----------------------------

def contract_page(contract, key: str) -> Page:
    return read_page(page_path(contract["out"], key))


def verdict_of(cell: dict) -> str:
    return "★" if "best" in cell["classes"] else "≈" if "tie" in cell["classes"] else ""


def test_runs_with_different_rounds_are_never_ranked_together(contract):
    rows = rows_by_config(contract_page(contract, SHARDS))
    fedfv = rows["FedFV(alpha=0.1,tau=1)"]
    assert float(fedfv["test_acc_mean"]["sort"]) == pytest.approx(0.90)  # the 10-round seeds only
    assert fedfv["seeds"]["text"] == "3 / 3"
    others = sorted((contract["out"] / "benchmarks").glob(f"{slugify(SHARDS, set())}__task-*.html"))
    assert len(others) == 1
    (row,) = leaderboard_table(read_page(others[0]))[1]
    assert row["config"]["text"] == "FedFV(alpha=0.1,tau=1)" and main_number(row["test_acc_mean"]) == "99.00"
    assert "rounds 20" in others[0].read_text()
    main_text = page_path(contract["out"], SHARDS).read_text()
    assert "rounds 10" in main_text and "never ranked together" in main_text
    index = (contract["out"] / "index.html").read_text()
    assert "Not comparable with the main table" in index and "rounds 20" in index


def test_older_runs_without_task_tags_split_by_their_params(contract):
    tables = [p for p in (contract["out"] / "benchmarks").glob("*.html") if p.name.startswith(slugify(OLD, set()))]
    assert len(tables) == 2
    texts = " ".join(p.read_text() for p in tables)
    assert "rebuilt from the runs&#39; MLflow params" in texts and "rounds 10" in texts and "rounds 20" in texts


def test_different_test_modes_are_never_ranked_together(contract):
    rows = rows_by_config(contract_page(contract, CLA))  # the main table: client test global, 3 configurations
    assert sorted(rows) == ["DW", "FedAvg", "QFedAvg(q=1.0)"]
    assert float(rows["FedAvg"]["test_acc_mean"]["sort"]) == pytest.approx(0.83)  # not the local runs' 0.60
    local = sorted((contract["out"] / "benchmarks").glob(f"{slugify(CLA, set())}__task-*.html"))
    assert len(local) == 1
    (row,) = leaderboard_table(read_page(local[0]))[1]
    assert main_number(row["test_acc_mean"]) == "60.00" and main_number(row["test_acc_std"]) == "20.00"


def test_a_clear_separation_with_three_seeds_is_not_starred_below_the_plans_seeds(contract):
    rows = rows_by_config(contract_page(contract, SHARDS))
    headline = {config: row["test_acc_mean"] for config, row in rows.items()}
    assert verdict_of(headline["FedFV(alpha=0.1,tau=1)"]) == ""  # separated, but 3 < STAR_MIN_SEEDS (10)
    assert (
        "★" not in headline["FedFV(alpha=0.1,tau=1)"]["text"] and "#1/3" in headline["FedFV(alpha=0.1,tau=1)"]["text"]
    )
    assert verdict_of(headline["FedAvg"]) == "" and verdict_of(headline["QFedAvg(q=1.0)"]) == ""
    assert "p < 0.001" in headline["FedFV(alpha=0.1,tau=1)"]["title"]


def test_a_tie_within_seed_noise_is_not_starred(contract):
    rows = rows_by_config(contract_page(contract, SHARDS))
    worst = {config: row["test_acc_worst10"] for config, row in rows.items()}
    assert verdict_of(worst["FedFV(alpha=0.1,tau=1)"]) == "≈" and verdict_of(worst["FedAvg"]) == "≈"
    assert verdict_of(worst["QFedAvg(q=1.0)"]) == ""  # clearly below the tied leaders
    assert not any("★" in cell["text"] for cell in worst.values())
    # best 5% is on every row (100 %): shown, never judged
    assert all(verdict_of(row["test_acc_best5"]) == "" and "★" not in row["test_acc_best5"]["text"]
               for row in rows.values())


def test_a_clear_separation_on_the_plans_seeds_is_starred():
    from leaderboard.table_building import build_tables
    from leaderboard.tables import BEST_MARK, STAR_MIN_SEEDS
    runs = [record(f"{c}{s}", c, s, "FINISHED", s, 0.9 + 0.001 * s if c == "A" else 0.5 + 0.002 * s)
            for c in "AB" for s in range(STAR_MIN_SEEDS)]
    row = next(r for r in build_tables(runs, [])[0].rows if r.config == "A")
    assert row.verdicts["test_acc_mean"].mark == "best" and BEST_MARK == "★"


def test_one_seed_gives_no_star(contract):
    from leaderboard.runs import RunRecord
    from leaderboard.table_building import build_tables

    def one(config, value):
        return RunRecord(config, VERDICTS, "FINISHED", None, None,
                         {"benchmark": SHARDS, "algorithm_config": config, "seed": "0", **task_tags()}, {},
                         {"test_acc_mean": value})

    (table,) = build_tables([one("A", 0.9), one("B", 0.1)])
    assert [row.verdicts["test_acc_mean"].mark for row in table.rows] == ["tie", "tie"]


def test_superseded_runs_are_counted_not_silently_dropped(contract):
    text = page_path(contract["out"], SHARDS).read_text()
    page = Page(text)
    rows = rows_by_config(page)
    assert rows["FedAvg"]["superseded"]["text"] == "1"
    assert float(rows["FedAvg"]["test_acc_mean"]["sort"]) == pytest.approx(0.80)  # not the old 0.10
    assert "1 superseded" in text
    runs = next(t for name, t in page.tables.items() if name.startswith("runs-"))
    old = next(row for row in runs["rows"] if row[0]["text"] == contract["ids"]["superseded"])
    newer = contract["ids"]["FedAvg/0"]
    assert old[6]["text"] == f"no: superseded by {newer[:8]}"
    index = (contract["out"] / "index.html").read_text()
    assert "1 superseded run" in index


def test_fairness_is_a_dash_under_a_global_client_test(contract):
    text = page_path(contract["out"], CLA).read_text()
    rows = rows_by_config(Page(text))
    for key in ("test_acc_std", "test_acc_jain", "test_acc_worst10"):
        for config in ("DW", "FedAvg"):
            cell = rows[config][key]
            assert cell["text"] == f"{MISSING} ‡" and cell["sort"] == "", (config, key)
    assert "1.0000" not in text  # DW's Jain of identical models is not shown
    assert "every client is tested on one shared test set" in text
    # FedAvg's shared model: its clients' accuracy on the shared set is its global accuracy, ranked (†)
    fedavg = rows["FedAvg"]["test_acc_mean"]
    # separated, but 3 seeds: no ★
    assert main_number(fedavg) == "83.00" and "†" in fedavg["text"] and verdict_of(fedavg) == ""
    # QFedAvg logged neither: shown, not ranked, with a note
    assert rows["QFedAvg(q=1.0)"]["test_acc_mean"]["text"] == MISSING
    assert "QFedAvg(q=1.0): not ranked" in text
    matrix = Page((contract["out"] / "index.html").read_text()).tables["matrix-2"]
    keys = [h["key"] for h in matrix["headers"][0]]
    dw = dict(zip(keys, next(r for r in matrix["rows"] if r[0]["text"] == "DW")))
    fedavg_cell = dict(zip(keys, next(r for r in matrix["rows"] if r[0]["text"] == "FedAvg")))
    # CGSV's rho compares each agent's own models: defined on the shared test set, so shown and judged
    assert "CGSV ρ 50.00" in dw[slugify(CLA, set())]["text"] and "CGSV ρ" in fedavg_cell[slugify(CLA, set())]["text"]
    rho = rows["DW"]["cgsv_rho"]
    assert main_number(rho) == "50.00" and "‡" not in rho["text"]


def test_index_matrix_ranks_benchmarks_by_suite(contract):
    page = Page((contract["out"] / "index.html").read_text())
    robustness, verdicts = page.tables["matrix-1"], page.tables["matrix-2"]  # suites by name
    keys = [h["key"] for h in verdicts["headers"][0]]
    assert keys[0] == "config" and slugify(SHARDS, set()) in keys and slugify(CLA, set()) in keys
    cells = {row[0]["text"]: dict(zip(keys, row)) for row in verdicts["rows"]}
    shards = slugify(SHARDS, set())
    fedfv = cells["FedFV(alpha=0.1,tau=1)"][shards]
    assert fedfv["text"].startswith("90.00") and "★" not in fedfv["text"] and "#1/3" in fedfv["text"]
    assert "n=3" in fedfv["text"] and "worst 10% 51.67 ≈ #1/3" in fedfv["text"]
    assert "#2/3" in cells["FedAvg"][shards]["text"] and "worst 10% 50.00 ≈ #2/3" in cells["FedAvg"][shards]["text"]
    assert (
        cells["QFedAvg(q=1.0)"][shards]["text"].startswith("70.00")
        and "#3/3" in cells["QFedAvg(q=1.0)"][shards]["text"]
    )
    # rows by average headline rank: FedFV #1; FedAvg #2 and #1; DW #2; QFedAvg #3 (unranked on CLA)
    assert list(cells) == ["FedFV(alpha=0.1,tau=1)", "FedAvg", "DW", "QFedAvg(q=1.0)"]
    assert len(robustness["rows"]) == 2
    index = (contract["out"] / "index.html").read_text()
    assert DESCRIPTION in index and "its control takes part honestly" in index


def test_mixed_code_versions_are_flagged(contract):
    text = page_path(contract["out"], SHARDS).read_text()
    assert "several code versions" in text and SHA_A[:10] in text and SHA_B[:10] in text
    index = Page((contract["out"] / "index.html").read_text())
    header = next(h for h in index.tables["matrix-2"]["headers"][0] if h["key"] == slugify(SHARDS, set()))
    assert "⚠" in header["text"] and SHA_B[:10] in header["title"]
    cla = page_path(contract["out"], CLA).read_text()
    assert "several code versions" not in cla


def test_benchmark_page_shows_description_task_and_client_test(contract):
    text = page_path(contract["out"], SHARDS).read_text()
    assert DESCRIPTION in text and CLIENT_TEST_SIZE in text
    facts = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text.split('id="task-facts"')[1].split("</dl>")[0]))
    for fact in ("rounds 10", "clients 100", "partition shards", "partition parameters num_shards=200, "
                 "shards_per_client=2", "fraction sampled per round 0.1", "batch size none", "n = 3"):
        assert fact in facts, fact


def test_paper_gains_over_fedavg_beside_ours(contract):
    page = Page((contract["out"] / "index.html").read_text())
    gains = page.tables["gains-2"]
    (row,) = gains["rows"]
    texts = [c["text"] for c in row]
    assert texts[0] == SHARDS and texts[1] == "FedFV(alpha=0.1,tau=1)"
    assert texts[2].startswith("+12.5 %") and "p < 0.001" in texts[2]  # (0.90 - 0.80) / 0.80
    assert texts[3] == "+10.0 %"  # (0.55 - 0.50) / 0.50


def test_variants_show_delta_against_their_declared_control(contract):
    page = Page((contract["out"] / "index.html").read_text())
    views = {name: table for name, table in page.tables.items() if name.startswith("controls-1-")}
    assert len(views) == 2
    by_control = {}
    for table in views.values():
        labels = [h["text"] for h in table["headers"][0]]
        by_control[labels[1].split(":")[0]] = (
            labels,
            {row[0]["text"]: [c["text"] for c in row] for row in table["rows"]},
        )
    labels, rows = by_control["control client0-every-round"]
    bias = labels.index("bias-attack-10: Mean client acc. (%) (Δ vs client0-every-round)")
    assert rows["FedAvg"][bias].startswith("70.10 (Δ -10.00)")  # against the control, not -14.00 against no-attack
    assert rows["FedMGDAPlus(epsilon=0.1)"][bias].startswith("82.10 (Δ -2.00)")
    labels, rows = by_control["control no-attack"]
    dropout = labels.index("dropout-0.5: Mean client acc. (%) (Δ vs no-attack)")
    assert rows["FedAvg"][dropout].startswith("83.10 (Δ -1.00)")
    index_md = (contract["out"] / "index.md").read_text()
    assert "Δ vs client0-every-round" in index_md and "70.10 (Δ -10.00)" in index_md


def test_markdown_index_carries_the_same_verdicts(contract):
    md = (contract["out"] / "index.md").read_text()
    matrix = markdown_rows(md.split("## verdicts-offline")[1], "Configuration")
    fedfv = next(row for row in matrix if row[0] == "FedFV(alpha=0.1,tau=1)")
    assert any(cell.startswith("90.00 #1/3") and "worst 10% 51.67 ≈ #1/3" in cell for cell in fedfv)
    assert "a t-test, two-sided p < 0.05, paired by seed" in md and "Headline metric" in md
    assert "mlruns" not in md and str(contract["tmp"]) not in md and "`contract.db`" in md


# --- units: seeds run again, the Pareto front, the papers' YAML, tasks ----------------------------

def record(run_id: str, config: str, seed: int, status: str, minute: int, accuracy: float | None = None):
    from datetime import datetime, timezone

    from leaderboard.runs import RunRecord

    return RunRecord(run_id=run_id, experiment=SUITE, status=status,
                     start_time=datetime(2026, 1, 1, 0, minute, tzinfo=timezone.utc), end_time=None,
                     tags={"suite": SUITE, "scale": "offline", "benchmark": BENCHMARK, "algorithm_config": config,
                           "seed": str(seed)},
                     params={}, metrics={} if accuracy is None else {"test_acc_mean": accuracy})


def test_a_seed_run_again_counts_once_with_its_newest_finished_run():
    from leaderboard.table_building import build_tables
    from leaderboard.views import problem_runs_view, runs_view

    runs = [record("a", "FedAvg", 0, "FAILED", 1), record("b", "FedAvg", 0, "FINISHED", 2, 0.5),
            record("c", "FedAvg", 1, "FINISHED", 3, 0.1), record("d", "FedAvg", 1, "FINISHED", 4, 0.7)]
    (table,) = build_tables(runs)
    (row,) = table.rows
    assert [r.run_id for r in row.used_runs] == ["b", "d"]
    assert (row.seeds_finished, row.seeds_total) == (2, 2)
    assert list(row.superseded) == ["c"] and table.superseded_count == 1
    assert math.isclose(row.stats["test_acc_mean"].mean, 0.6)
    (problem,) = problem_runs_view(table).rows
    assert problem[0].text == "a" and "also has a FINISHED run" in problem[3].text
    used = {cells[0].text: cells[6].text for cells in runs_view(table).rows}
    assert used == {"a": "no", "b": "yes", "c": "no: superseded by d", "d": "yes"}


def test_task_rebuilt_from_params_keeps_what_defines_the_task():
    from leaderboard.tasks import FROM_PARAMS, TAGGED, task_of

    params = {"num_rounds": "10", "partition_params/alpha": "0.5", "partition_params/min_size": "10",
              "test_mode": "local", "local_test_fraction": "0.2", "global_test_fraction": "0.3", "attack": "None",
              "attack_strength": "10.0", "backbone": "fl_mlp", "lr": "0.1"}
    task = task_of({}, params)
    assert task.source == FROM_PARAMS
    assert dict(task.fields) == {"num_rounds": 10, "partition_params": {"alpha": 0.5, "min_size": 10},
                                 "test_mode": "local", "local_test_fraction": 0.2, "model": "fl_mlp"}
    assert task_of({}, {**params, "lr": "0.5"}).key == task.key  # an algorithm setting is not the task
    assert task_of({}, {**params, "num_rounds": "20"}).key != task.key
    tagged = task_of(task_tags(), {})
    assert tagged.source == TAGGED and tagged.key == task_tags()["task_key"]


def test_pareto_front():
    from leaderboard.figures import pareto_front

    # (unfairness, accuracy): lower x and higher y are better
    points = [(1.0, 0.9), (2.0, 0.95), (1.5, 0.85), (0.5, 0.7), (2.0, 0.9)]
    assert pareto_front(points) == [True, True, False, True, False]


def test_paper_numbers_units_and_bad_entries(tmp_path):
    from leaderboard.papers import load_paper_numbers

    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "paper_numbers.yaml").write_text(
        "- {benchmark_setting: s, matches_benchmark: null, algorithm_config: A, source: T1,\n"
        "   offline_counterpart: x/y, counterpart_config: 'A(k=1)',\n"
        "   metrics: {test_acc_mean: 0.5, test_acc_var_percent2: 12.57, test_acc_std_percent: 13.74}}\n"
        "- {benchmark_setting: s, algorithm_config: B, source: T1, metrics: {test_acc_mean: 50.4}}\n"
        "- {benchmark_setting: s, source: T1, metrics: {test_acc_mean: 0.5}}\n")
    numbers, warnings = load_paper_numbers(tmp_path)
    assert len(numbers) == 1 and numbers[0].paper == "p"
    assert numbers[0].metrics == pytest.approx({"test_acc_mean": 0.5, "test_acc_var": 0.001257, "test_acc_std": 0.1374})
    assert numbers[0].offline_counterpart == "x/y" and numbers[0].our_config == "A(k=1)"
    assert len(warnings) == 2 and "0.5042" in warnings[0] and "algorithm_config" in warnings[1]


def test_store_names():
    from leaderboard.runs import store_name

    assert store_name("sqlite:///mlruns.db") == "mlruns.db"
    assert store_name("export:/home/me/a-offline,/home/me/b-offline/") == "2 exports: a-offline, b-offline"
    assert store_name("export:results") == "1 export: results"
    assert store_name("sqlite:////home/someone/work/mlruns.db") == "mlruns.db"
    assert store_name("file:///home/someone/mlruns") == "mlruns"
    assert store_name("http://user:secret@mlflow.example.org:5000") == "http://mlflow.example.org:5000"


def test_code_version_is_the_library_source_tree_at_the_commit():
    """Commits that changed only docs, tests or the leaderboard ran the same library code."""
    import subprocess

    from leaderboard.runs import library_tree

    def git(*args):
        done = subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True)
        return done.stdout.split() if done.returncode == 0 else None

    commits = git("log", "--format=%H", "-n", "200")
    if not commits or len(commits) < 2:
        pytest.skip("no git history in this checkout")
    trees = {sha: git("rev-parse", f"{sha}:fl_lightning") for sha in commits}
    assert library_tree(commits[0]) == f"fl_lightning@{trees[commits[0]][0][:10]}"
    assert library_tree("f" * 40) == "" and library_tree("unknown") == ""
    same = [(a, b) for a, b in zip(commits, commits[1:]) if trees[a] == trees[b]]
    other = [(a, b) for a, b in zip(commits, commits[1:]) if trees[a] != trees[b]]
    if same:
        assert library_tree(same[0][0]) == library_tree(same[0][1])
    if other:
        assert library_tree(other[0][0]) != library_tree(other[0][1])


# --- a build only reads the store, and writes leaderboard_build/ unless asked to publish -------------

OLD_MLFLOW_SCHEMA = "451aebb31d03"  # the revision of the stores MLflow 1.x wrote


def snapshot(path: Path) -> tuple[bytes, int]:
    """The file as it is: bytes and modification time (a write changes one or the other)."""
    return path.read_bytes(), path.stat().st_mtime_ns


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def mlflow_store(path: Path, runs: int = 0) -> str:
    """A store written by this MLflow, with ``runs`` finished runs in the experiment SUITE."""
    uri = f"sqlite:///{path}"
    client = MlflowClient(tracking_uri=uri)
    client.search_experiments()  # creates the tables and the Default experiment
    if runs:
        experiment = client.create_experiment(SUITE)
        for seed in range(runs):
            run = client.create_run(experiment, tags={**runner_tags("FedAvg", seed), "algorithm": "FedAvg"})
            client.log_metric(run.info.run_id, "test_acc_mean", 0.5 + seed / 100, step=3)
            client.set_terminated(run.info.run_id, "FINISHED")
    return uri


def sql(path: Path, *statements: str) -> None:
    import sqlite3

    connection = sqlite3.connect(path)
    for statement in statements:
        connection.execute(statement)
    connection.commit()
    connection.close()


def test_build_never_creates_a_missing_store(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert leaderboard_main(["build", "--tracking-uri", "sqlite:///mlruns.db"]) == 2
    line = one_line(capsys.readouterr().err)
    assert re.search(r"no MLflow store at sqlite:///mlruns\.db: the file .*mlruns\.db does not exist\. "
                     r"Pass the store the runs were logged to with --tracking-uri", line), line
    assert list(tmp_path.iterdir()) == []  # no store, no site, no artifact folder


@pytest.mark.parametrize("kind", ["empty file", "older schema", "another database", "no experiment", "runs"])
def test_build_leaves_an_existing_store_as_it_was(kind, tmp_path, monkeypatch, capsys):
    """MLflow's client would make the empty file a store, migrate the older schema, add its tables
    to the other database and a Default experiment to the store without one: a build does none of
    it. It refuses the first three in one line and reads the others without a write."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "mlruns.db"
    if kind == "empty file":
        path.touch()
    elif kind == "another database":
        sql(path, "CREATE TABLE notes (text TEXT)", "INSERT INTO notes VALUES ('keep me')")
    else:
        mlflow_store(path, runs=2 if kind == "runs" else 0)
        if kind == "older schema":
            sql(path, f"UPDATE alembic_version SET version_num = '{OLD_MLFLOW_SCHEMA}'")
        elif kind == "no experiment":
            sql(path, "DELETE FROM experiment_tags", "DELETE FROM experiments")
    before = snapshot(path)
    present = sorted(p.name for p in tmp_path.iterdir())  # MLflow 2.16 makes ./mlruns beside a new store
    capsys.readouterr()  # MLflow's log lines from making the store
    code = leaderboard_main(["build", "--tracking-uri", "sqlite:///mlruns.db", "--paper-numbers", str(tmp_path)])
    captured = capsys.readouterr()
    assert snapshot(path) == before, f"{kind}: the store was altered"
    if kind in ("no experiment", "runs"):
        assert code == 0
        index = (tmp_path / "leaderboard_build" / "index.md").read_text()
        assert ("No runs found" in index) == (kind == "no experiment")
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*present, "leaderboard_build"])
        return
    assert code == 2
    line = one_line(captured.err)
    expected = {
        "empty file": r"the store sqlite:///mlruns\.db is an empty file .*a build does not make it a store\. "
                      r"Pass the store the runs were logged to with --tracking-uri",
        "older schema": rf"has the schema of another MLflow version \(revision {OLD_MLFLOW_SCHEMA}; this MLflow .*"
                        r"back it up, then run `mlflow db upgrade sqlite:///mlruns\.db`",
        "another database": r"is an SQLite database of something else \(tables notes\), not an MLflow store; "
                            r"pass the store .* --tracking-uri",
    }[kind]
    assert re.search(expected, line), line
    assert sorted(p.name for p in tmp_path.iterdir()) == present  # no site, no artifact folder


def test_default_output_is_git_ignored_and_only_publish_writes_the_published_site(tmp_path, monkeypatch, capsys):
    from leaderboard import site as site_module

    published_index = site_module.PUBLISHED_SITE / "index.html"
    published_before = snapshot(published_index) if published_index.exists() else None
    monkeypatch.chdir(tmp_path)
    uri = mlflow_store(tmp_path / "mlruns.db", runs=1)
    assert leaderboard_main(["build", "--tracking-uri", uri, "--paper-numbers", str(tmp_path)]) == 0
    assert (tmp_path / "leaderboard_build" / "index.html").is_file()
    assert (snapshot(published_index) if published_index.exists() else None) == published_before

    stand_in = tmp_path / "published"  # the repository's leaderboard_site/ is not rebuilt by a test
    monkeypatch.setattr(site_module, "PUBLISHED_SITE", stand_in)
    assert leaderboard_main(["build", "--tracking-uri", uri, "--paper-numbers", str(tmp_path), "--publish"]) == 0
    assert (stand_in / "index.html").is_file()
    capsys.readouterr()

    with pytest.raises(SystemExit) as stop:
        leaderboard_main(["build", "--tracking-uri", uri, "--out", "elsewhere", "--publish"])
    assert stop.value.code == 2
    line = one_line(capsys.readouterr().err)
    assert re.search(r"error: argument --publish: not allowed with argument --out \(see python -m leaderboard "
                     r"build --help\)$", line), line


def test_generated_outputs_are_git_ignored():
    import subprocess

    outputs = ["benchmark_logs/fedfv-offline/x.log", "leaderboard_build/index.html",
               ".leaderboard_build-build-x1/index.html", ".leaderboard_site-build-x1/index.html"]
    try:
        done = subprocess.run(["git", "check-ignore", "--no-index", *outputs, "leaderboard_site/index.html"],
                              cwd=ROOT, capture_output=True, text=True, timeout=30)
    except OSError:
        pytest.skip("no git")
    if done.returncode == 128:
        pytest.skip("not a git checkout")
    assert done.stdout.split() == outputs  # every generated output; never the published site


def test_a_user_error_is_one_line_without_a_traceback(tmp_path):
    """Through the real command line: the message, exit code 2, nothing else on stderr."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "leaderboard", "build", "--tracking-uri",
                           f"sqlite:///{tmp_path / 'typo.db'}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2
    assert re.fullmatch(r"error: no MLflow store at sqlite:///.*typo\.db: the file .* does not exist\. Pass the "
                        r"store the runs were logged to with --tracking-uri \(.*\)\.\n", done.stderr), done.stderr
    assert not (tmp_path / "typo.db").exists()


KILLED_MID_WRITE = """
import os, sqlite3
connection = sqlite3.connect("mlruns.db", isolation_level=None)
connection.execute("PRAGMA cache_size = 1")  # pages reach the file before the commit
connection.execute("BEGIN")
connection.execute("UPDATE runs SET status = 'FAILED'")
connection.execute("CREATE TABLE junk (x)")
connection.executemany("INSERT INTO junk VALUES (?)", [(os.urandom(500),) for _ in range(2000)])
os._exit(0)  # killed before the commit: the journal stays beside the store
"""


def test_a_store_left_mid_write_is_read_as_last_committed_and_left_as_it_is(tmp_path, monkeypatch, capsys):
    """A reader must roll a killed writer's journal back, which a read-only connection cannot: the
    build rolls it back in a copy, reads the committed runs, and leaves the store and journal alone."""
    import subprocess

    monkeypatch.chdir(tmp_path)
    uri = mlflow_store(tmp_path / "mlruns.db", runs=2)
    subprocess.run([sys.executable, "-c", KILLED_MID_WRITE], cwd=tmp_path, check=True, timeout=120)
    store, journal = tmp_path / "mlruns.db", tmp_path / "mlruns.db-journal"
    assert journal.stat().st_size > 0
    before = snapshot(store), snapshot(journal)
    capsys.readouterr()
    assert leaderboard_main(["build", "--tracking-uri", uri, "--paper-numbers", str(tmp_path)]) == 0
    assert (snapshot(store), snapshot(journal)) == before
    out = capsys.readouterr().out
    assert f"Read 2 runs from 1 experiment(s) ({SUITE})" in out
    index = (tmp_path / "leaderboard_build" / "index.md").read_text()
    assert "FAILED" not in index  # the uncommitted write is not read


def test_an_attacked_configuration_is_compared_with_the_same_algorithm_unattacked():
    from leaderboard.suite_views import without_attack

    assert without_attack("QFedAvg(attack_strength=30.0,q=5.0)") == "QFedAvg(q=5.0)"
    assert without_attack("FedMGDAPlus(attack=bias,attack_client=0,attack_strength=30.0)") == "FedMGDAPlus"
    assert without_attack("FedFV(alpha=0.1,tau=1)") == "FedFV(alpha=0.1,tau=1)"
    assert without_attack("FedAvg") == "FedAvg"


@pytest.mark.usefixtures("one_thread")
def test_plain_fits_are_grouped_as_your_fits_without_a_scale_badge(tmp_path, monkeypatch):
    """A run no suite made (``fl-lightning fit`` alone: experiment fl-lightning, no suite or scale
    tag) is listed under "Your fits (not from a suite)" with no scale badge, never as a suite
    called fl-lightning of unknown scale; a plain run in another experiment says that experiment."""
    from fl_lightning.cli import main as fit_main

    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    monkeypatch.chdir(tmp_path)
    fit_main(["fit", f"--trainer.logger.init_args.tracking_uri={uri}", "--model.num_rounds=1",
              "--model.backbone=fl_logreg", "--model.fraction=1.0", "--data.source=digits", "--data.num_clients=6",
              "--data.partition=iid", "--data.partition_params={}"])
    client = MlflowClient(tracking_uri=uri)
    other = client.create_run(client.create_experiment("my-study"), tags={"algorithm": "FedAvg"})
    client.log_metric(other.info.run_id, "test_acc_mean", 0.5, step=1)
    client.set_terminated(other.info.run_id, "FINISHED")

    out = tmp_path / "site"
    build(uri, out, tmp_path / "no-paper-numbers")
    index, html = (out / "index.md").read_text(), (out / "index.html").read_text()
    assert index.splitlines()[0] == "# fl-lightning leaderboard"  # no scale badge
    assert "## Your fits (not from a suite)\n" in index and "## Your fits in my-study (not from a suite)\n" in index
    assert "| Your fits (not from a suite) | — |" in index and "| fl-lightning |" not in index
    pages = "".join(page.read_text() for page in (out / "benchmarks").glob("*.*"))
    for text in (index, html, pages):
        assert not re.search(r"unknown[- ]scale|scale unknown", text, flags=re.I)
    assert 'id="suite-Your-fits-not-from-a-suite"' in html and 'href="#suite-Your-fits-not-from-a-suite"' in html
    assert "Suite **Your fits (not from a suite)**" in pages
