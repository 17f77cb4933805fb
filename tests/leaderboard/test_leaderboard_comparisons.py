"""What the leaderboard ranks together and the verdicts it gives, on the contract store.

``contract``: runs logged by hand with the tags ``fl-lightning fit`` and the benchmark runner write
(``task``, ``task_key``, ``client_test``, ``client_test_size``, ``per_client_models``,
``suite_description``, ``control``, ...) and chosen values: a clear separation with 3 seeds, a tie
within seed noise, a 20-round run beside 10-round ones, a seed run twice, a benchmark tested on
one shared set (client test ``global``) beside a local one, attack and dropout variants with
their declared controls, several code versions, older runs with params but no task tag.
"""

from __future__ import annotations

import re

import pytest
from mlflow.tracking import MlflowClient

from leaderboard.table_building import slugify
from leaderboard.tables import MISSING
from tests.leaderboard_builders import (
    CLIENT_TEST_SIZE,
    DESCRIPTION,
    OLD,
    SHA_A,
    SHA_B,
    Page,
    build,
    leaderboard_table,
    log_run,
    main_number,
    markdown_rows,
    page_path,
    read_page,
    record,
    rows_by_config,
    task_tags,
)

# --- the contract store: runs with the tags of fl-lightning fit and the runner ------------------

VERDICTS = "verdicts-offline"
ROBUSTNESS = "robustness-offline"
SHARDS = "mnist5k/shards-200x2/p0.1/fl_mlp"
CLA = "mnist5k/cla/full/fl_mlp"
ROBUST = "synthetic/natural/p0.2/fl_logreg"


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
