"""What a dry run plans: the data files that are missing and the estimated time."""

import json
import statistics

import pytest
import yaml

from benchmarks import plan
from benchmarks.command_line import main
from benchmarks.suites import load_suite
from fl_lightning.data.sources import missing_files


def cell_config(source="mnist", data_dir="data", **init_args):
    args = {"backbone": "fl_mlp", "num_rounds": 10, "fraction": 0.1, "eval_every": 5} | init_args
    return {"model": {"init_args": args},
            "data": {"source": source, "data_dir": str(data_dir), "num_clients": 100, "test_mode": "global"}}


def test_missing_files_names_every_file_and_how_to_get_them(tmp_path):
    missing, obtain = missing_files("mnist", str(tmp_path))
    assert [p.rsplit("/", 1)[1] for p in missing] == [
        "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
    assert all(p.startswith(str(tmp_path / "MNIST" / "raw")) for p in missing) and "download=True" in obtain
    for path in missing[:2]:  # the files that are there are not listed
        (tmp_path / "MNIST" / "raw").mkdir(parents=True, exist_ok=True)
        open(path, "w").close()
    assert missing_files("mnist", str(tmp_path))[0] == missing[2:]
    assert missing_files("mnist5k", str(tmp_path)) == ([], "")  # offline: nothing to get
    with pytest.raises(ValueError, match="unknown data source 'mnits'.*did you mean 'mnist'"):
        missing_files("mnits", str(tmp_path))


def test_missing_data_is_reported_once_per_source_with_its_run_count(tmp_path):
    configs = [cell_config(data_dir=tmp_path)] * 3 + [cell_config("digits")] + [cell_config("cifar10", tmp_path)]
    entries = {entry.source: entry for entry in plan.missing_data(configs)}
    assert set(entries) == {"mnist", "cifar10"}
    assert entries["mnist"].runs == 3 and len(entries["mnist"].files) == 4
    assert entries["cifar10"].runs == 1 and any("data_batch_1" in f for f in entries["cifar10"].files)


def test_the_estimate_grows_with_rounds_participation_and_a_slower_model():
    speed = {"fl_mlp": 4000.0, "fl_cnn_cifar": 400.0}
    base = plan.estimate_seconds(cell_config(), speed)
    assert plan.training_samples(cell_config()) == pytest.approx(0.1 * 60_000)
    assert plan.estimate_seconds(cell_config(num_rounds=20), speed) > base
    assert plan.estimate_seconds(cell_config(fraction=1.0), speed) > base
    assert plan.estimate_seconds(cell_config(backbone="fl_cnn_cifar"), speed) > base
    assert plan.estimate_seconds(cell_config(backbone="fl_unmeasured"), speed) is None
    # a partition's own size wins over the published size of the source
    sized = cell_config()
    sized["data"]["partition_params"] = {"samples_per_client": 600}
    assert plan.training_samples(sized) == pytest.approx(0.1 * 600 * 100)


def test_throughput_is_read_from_every_cpu_results_file(tmp_path):
    rows = [
        {"model": "fl_a", "status": "ok", "variant": None, "engine": "vectorised", "client_samples_per_second": 5.0},
        {"model": "fl_a", "status": "ok", "variant": None, "engine": "vectorised", "client_samples_per_second": 7.0},
        {"model": "fl_a", "status": "ok", "variant": "bf16", "engine": "vectorised", "client_samples_per_second": 99.0},
        {"model": "fl_b", "status": "skipped", "variant": None, "engine": "vectorised"},
    ]
    (tmp_path / "perf_cpu.json").write_text(json.dumps({"throughput": rows[:2]}))
    (tmp_path / "perf_cpu_more.json").write_text(json.dumps({"throughput": rows[2:]}))
    (tmp_path / "perf_cuda.json").write_text(json.dumps({"throughput": [dict(rows[0], model="fl_c")]}))
    assert plan.model_throughput(tmp_path) == {"fl_a": 7.0}


def test_a_dry_run_prints_the_missing_data_and_the_estimate(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    suite = {"suite": "plan-test", "paper": "cgsv", "scale": "paper", "seeds": [0, 1],
             "base": {"model": {"init_args": {"backbone": "fl_mlp", "num_rounds": 5}},
                      "data": {"source": "mnist", "data_dir": str(tmp_path / "data"), "num_clients": 10}},
             "benchmarks": [{"name": "mnist/iid"}],
             "algorithms": [{"class_path": "fl_lightning.algorithms.FedAvg"}]}
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    assert len(load_suite(str(path))) == 2
    assert main(["run", str(path), "--dry-run", "--tracking-uri", f"sqlite:///{tmp_path / 'runs.db'}"]) == 0
    out = capsys.readouterr().out
    assert "data missing for 2 run(s): mnist needs " in out and "train-images-idx3-ubyte" in out
    assert "estimated time:" in out and "for 2 of 2 run(s) (2 from costs: the measured cost table" in out
    assert not (tmp_path / "runs.db").exists()


def test_gpu_figures_are_read_by_clients_per_round_and_named(tmp_path):
    rows = [{"model": "fl_a", "status": "ok", "variant": None, "engine": "vectorised", "clients": 10,
             "client_samples_per_second": 1000.0},
            {"model": "fl_a", "status": "ok", "variant": None, "engine": "vectorised", "clients": 100,
             "client_samples_per_second": 9000.0},
            {"model": "fl_a", "status": "ok", "variant": "bf16", "engine": "vectorised", "clients": 10,
             "client_samples_per_second": 5e6}]
    (tmp_path / "perf_cuda.json").write_text(json.dumps({"machine": {"gpu": "NVIDIA H200"}, "throughput": rows}))
    (tmp_path / "perf_cpu.json").write_text(json.dumps({"throughput": [dict(rows[0], model="fl_cpu")]}))
    figures, gpu = plan.gpu_throughput(tmp_path)
    assert figures == {"fl_a": {10: 1000.0, 100: 9000.0}} and gpu == "NVIDIA H200"
    ten_percent = cell_config(backbone="fl_a")  # 10 of 100 clients a round: the 10-client figure
    everyone = cell_config(backbone="fl_a", fraction=1.0)
    assert plan.gpu_estimate_seconds(ten_percent, figures) == plan.estimate_seconds(ten_percent, {"fl_a": 1000.0})
    assert plan.gpu_estimate_seconds(everyone, figures) == plan.estimate_seconds(everyone, {"fl_a": 9000.0})
    assert plan.gpu_estimate_seconds(cell_config(backbone="fl_b"), figures) is None
    assert plan.gpu_throughput(tmp_path / "none") == ({}, None)


def test_a_cell_is_estimated_from_the_store_then_the_published_ledger_then_the_perf_figures(tmp_path,
                                                                                         no_published_runs):
    """A clean re-run's dry run reads how long the published ledger's runs of each cell took;
    a store's own finished runs come first; a cell neither ran, of an algorithm without ledger runs
    or a cost-table row, falls back to its benchmark's runs, then to the perf figures."""
    published = tmp_path / "runs.csv"
    published.write_text(
        "run_id,suite,status,cell,start_time,end_time,task_ledger_pass\n"
        "a,plan-test,FINISHED,mnist/iid|FedAvg,2026-11-01T10:00:00,2026-11-01T10:00:30,\n"
        "b,plan-test,FINISHED,mnist/iid|FedAvg,2026-11-01T10:01:00,2026-11-01T10:01:50,\n"
        "c,plan-test,KILLED,mnist/iid|FedAvg,2026-11-01T10:02:00,2026-11-01T10:09:00,\n"
        "d,other-suite,FINISHED,mnist/iid|FedAvg,2026-11-01T10:00:00,2026-11-01T11:00:00,\n"
        "e,plan-test,FINISHED,mnist/iid|FedAvg,2026-11-01T10:00:00,2026-11-01T10:02:00,confirmatory\n")
    durations = plan.published_durations("plan-test", published)
    assert durations == {"mnist/iid|FedAvg": [30.0, 50.0]}  # this suite's finished exploratory runs only
    assert plan.published_durations("plan-test", tmp_path / "missing.csv") == {}

    class Cell:
        def __init__(self, cell):
            self.cell, self.config = cell, cell_config()

    cells = [Cell("mnist/iid|FedAvg"), Cell("mnist/iid|FedProx"), Cell("mnist/iid|FedFV"), Cell("cifar/iid|FedFV")]
    estimates = plan.cell_estimates(cells, {"mnist/iid|FedProx": [7.0, 9.0, 100.0]}, durations)
    assert estimates[0] == (40.0, "published") and estimates[1] == (9.0, "store")
    # no run of its own: the same benchmark's other configurations (store and published together)
    assert estimates[2] == (statistics.median([7.0, 9.0, 100.0, 30.0, 50.0]), "benchmark")
    assert estimates[3][1] == "perf" and estimates[3][0] == plan.estimate_seconds(
        cell_config(), plan.model_throughput()
    )
    lines = plan.plan_lines(cells, {"mnist/iid|FedProx": [7.0, 9.0, 100.0]}, 1, durations)
    assert any("(1 from store: this store's finished runs of the cell; 1 from published: the published ledger's "
               "runs of the cell (leaderboard_site/runs.csv); 1 from benchmark: the same benchmark's other "
               "configurations' runs, any algorithm; 1 from perf: a guess" in line for line in lines)
    assert any(line.startswith("  longest rows") and "mnist/iid|FedAvg 1 x 40 s = 40 s (published)" in line
               for line in lines)


# issue 50: a run's cost depends on its algorithm; the dry run names where each estimate came from

def algorithm_cell(label, source="mnist5k", batch_size=10, **init_args):
    class Cell:
        def __init__(self):
            self.cell = f"{source}/bench|{label}"
            self.config = cell_config(source, **({"backbone": "fl_mlp", "num_rounds": 60, "eval_every": 10,
                                                  "batch_size": batch_size} | init_args))
            self.config["model"]["class_path"] = f"fl_lightning.algorithms.{label.split('(')[0]}"
    return Cell()


def write_cost_table(path, rows):
    path.write_text(json.dumps({"date": "2026-12-07", "machine": {"cpu": "AMD EPYC", "cpu_cores": 2},
                                "eval_every": 10, "costs": rows}))
    return path


COSTS = [{"algorithm": "FedAvg", "model": "fl_mlp", "status": "ok", "per_round_s": 0.03, "start_s": 0.5,
          "train_samples_per_round": 500.0},
         {"algorithm": "FedLF", "model": "fl_mlp", "status": "ok", "per_round_s": 0.12, "start_s": 0.5,
          "train_samples_per_round": 500.0},
         {"algorithm": "FedFV", "model": "fl_mlp", "status": "failed (exit 1)"}]


@pytest.fixture
def no_published_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(plan, "PUBLISHED_RUNS", tmp_path / "no-runs.csv")
    monkeypatch.setattr(plan, "COST_TABLE", write_cost_table(tmp_path / "costs.json", COSTS))


def test_fedavg_and_fedlf_cells_are_estimated_from_their_own_costs_and_say_so(no_published_runs):
    """Issue 50: the quickstart's dry run gave every cell 3 x 15 s, FedAvg's and FedLF's alike; the
    real runs differ by 3-5 times. A cell without runs of its own takes its algorithm's measured
    cost, and each line names the source."""
    fedavg, fedlf = algorithm_cell("FedAvg"), algorithm_cell("FedLF")
    (avg, avg_source), (lf, lf_source) = plan.cell_estimates([fedavg, fedlf], {}, {})
    assert avg_source == lf_source == "costs"
    # 100 clients x 10% of mnist5k's 5,000 samples = 500 a round, as measured: no size scaling
    assert avg == pytest.approx(0.5 + 60 * 0.03) and lf == pytest.approx(0.5 + 60 * 0.12)
    lines = plan.plan_lines([fedavg] * 3 + [fedlf] * 3, {}, 2, {})
    text = "\n".join(lines)
    assert "estimated time: 25 s with 2 job(s) for 6 of 6 run(s) (6 from costs: the measured cost table " \
           "(2-core AMD EPYC, 2026-12-07;" in text
    assert "by algorithm (runs x median run at --jobs 1, source): FedLF 3 x 8 s (cost table); " \
           "FedAvg 3 x 2 s (cost table)" in text
    # an algorithm the table could not measure falls back to the guess, named as one
    (_, fv_source), = plan.cell_estimates([algorithm_cell("FedFV(alpha=0.1,tau=1)")], {}, {})
    assert fv_source == "perf"
    assert "a guess from the model's CPU throughput" in "\n".join(
        plan.plan_lines([algorithm_cell("FedFV(alpha=0.1,tau=1)")], {}, 1, {}))


def test_the_cost_table_is_scaled_to_the_cells_rounds_evaluations_and_samples(no_published_runs):
    base = plan.cell_estimates([algorithm_cell("FedLF")], {}, {})[0][0] - 0.5
    assert base == pytest.approx(60 * 0.12)
    longer, = plan.cell_estimates([algorithm_cell("FedLF", num_rounds=120)], {}, {})
    assert longer[0] - 0.5 == pytest.approx(2 * base)
    every_round, = plan.cell_estimates([algorithm_cell("FedLF", eval_every=1)], {}, {})
    assert every_round[0] - 0.5 == pytest.approx(10 * base)  # ten times the evaluations: an upper bound
    everyone, = plan.cell_estimates([algorithm_cell("FedLF", fraction=0.2)], {}, {})
    assert everyone[0] - 0.5 == pytest.approx(2 * base)  # twice the client samples a round
    assert plan.cost_table_estimate(algorithm_cell("FedLF"), {}) is None
    assert plan.cost_table(plan.COST_TABLE.parent / "missing.json") == ({}, "")


def test_the_published_runs_of_the_same_algorithm_model_and_data_come_before_the_cost_table(
        tmp_path, monkeypatch, no_published_runs):
    """Another suite's published runs of FedLF on the same model and data (here 100 rounds, one
    evaluation every 10) are rescaled to the cell's 60 rounds; a different batch size is not the
    same data; the algorithm's class is matched where its label is not."""
    header = ("run_id,suite,status,cell,start_time,end_time,algorithm,algorithm_config,task,params,task_model,"
              "task_source,task_num_clients,task_fraction,task_batch_size,task_local_epochs,rounds_planned\n")

    def row(algorithm, label, seconds, batch=10):
        task = json.dumps({"partition_params": {"samples_per_client": None}, "test_mode": "global"})
        params = json.dumps({"eval_every": "10"})
        end = f"2026-11-01T10:{seconds // 60:02d}:{seconds % 60:02d}"
        quoted_task, quoted_params = task.replace(chr(34), 2 * chr(34)), params.replace(chr(34), 2 * chr(34))
        return (f'x,other,FINISHED,"b|{label}",2026-11-01T10:00:00,{end},'
                f'{algorithm},"{label}","{quoted_task}","{quoted_params}",'
                f"fl_mlp,mnist5k,100,0.1,{batch},1,100\n")

    runs = tmp_path / "runs.csv"
    runs.write_text(header + row("FedLF", "FedLF", 40) + row("FedLF", "FedLF", 60)
                    + row("FedAvg", "FedAvg", 10, batch=50) + row("FedFV", "FedFV(alpha=0.5,tau=0)", 20))
    monkeypatch.setattr(plan, "PUBLISHED_RUNS", runs)
    plan._published_runs_by_setting.cache_clear()
    cells = [algorithm_cell("FedLF"), algorithm_cell("FedAvg"), algorithm_cell("FedFV(alpha=0.1,tau=1)")]
    (lf, lf_source), (avg, avg_source), (fv, fv_source) = plan.cell_estimates(cells, {}, {})
    assert lf_source == "ledger" and lf == pytest.approx(0.6 + (50 - 0.6) * 0.6)
    assert avg_source == "costs"  # the ledger's FedAvg ran batches of 50
    assert fv_source == "ledger" and fv == pytest.approx(0.6 + (20 - 0.6) * 0.6)
    assert "1 from costs" in plan.plan_lines(cells, {}, 1, {})[0]
    # the cell's own runs come first: here, then published
    assert plan.cell_estimates(cells[:1], {cells[0].cell: [99.0]}, {cells[0].cell: [5.0]}) == [(99.0, "store")]
    assert plan.cell_estimates(cells[:1], {}, {cells[0].cell: [5.0]}) == [(5.0, "published")]
    plan._published_runs_by_setting.cache_clear()


def test_the_shipped_cost_table_gives_the_quickstart_s_fedlf_more_time_than_its_fedavg():
    """The committed table (python -m benchmarks.perf.algorithm_costs) covers every algorithm that
    the offline suites run on the MLP, and FedLF's round costs more than FedAvg's there."""
    table, where = plan.cost_table()
    assert "core" in where and table
    cells = [cell for cell in load_suite("quickstart/offline", [0])]
    estimates = dict(zip((cell.cell.split("|")[1] for cell in cells), plan.cell_estimates(cells, {}, {})))
    assert estimates["FedLF"][1] in ("ledger", "costs") and estimates["FedLF"][0] > 2 * estimates["FedAvg"][0]


def test_the_stores_run_times_are_every_finished_runs_of_each_cell_read_page_by_page(tmp_path, monkeypatch):
    """``run_durations``: end minus start of the suite's finished runs, per cell, in seconds, through
    MLflow's pages (of 1,000 runs; here of 2) to the last; failed runs, runs without a cell and a
    suite the store lacks give none."""
    from mlflow.tracking import MlflowClient

    from benchmarks.plan import run_durations
    from fl_lightning.records.vocabulary import Tag
    from tests.benchmarks.test_suite_store import pages_of_two

    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    client = MlflowClient(uri)
    suite = client.create_experiment("tiny")
    start = 1_700_000_000_000

    def run(cell, seconds, status="FINISHED"):
        made = client.create_run(suite, start_time=start, tags={Tag.CELL: cell} if cell else {})
        client.set_terminated(made.info.run_id, status, end_time=start + int(seconds * 1000))

    for seconds in (10, 20, 30.5, 40, 50):
        run("a", seconds)
    run("b", 7)
    run("a", 99, "FAILED")
    run("", 5)
    client.create_run(suite, start_time=start, tags={Tag.CELL: "c"})  # still running: no end
    calls = pages_of_two(monkeypatch)
    durations = run_durations(uri, "tiny")
    assert {cell: sorted(values) for cell, values in durations.items()} == {"a": [10, 20, 30.5, 40, 50], "b": [7]}
    assert len(calls) == 4 and calls[0] is None
    assert run_durations(uri, "another suite") == {}
