"""The timing driver (``python -m benchmarks.timing``, issue 48): timing claims read a dedicated run made
alone on an idle machine, the arms alternated per seed (A B, B A, ...) and repeated. No real fit here:
the runner's ``run_suite`` and the store are replaced."""

from __future__ import annotations

import pytest
import yaml

import benchmarks.timing as timing
from benchmarks.suites import load_suite
from benchmarks.timing import Arm, MachineBusy, arm_order, run_timing, suite_arms, wait_until_idle
from tests.paths import REPO

ROOT = REPO
FEDLF, CGSV = "fedlf/timing_offline", "cgsv/timing_offline"
FEDFV = "FedFV(alpha=0.1,tau=1)"


class Clock:
    """time.monotonic and time.sleep of a machine where only sleeping takes time."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(timing.time, "monotonic", fake.monotonic)
    monkeypatch.setattr(timing.time, "sleep", fake.sleep)
    return fake


def loads(monkeypatch, values: list[float]) -> list[float]:
    """os.getloadavg giving ``values`` one after the other (the last one from then on)."""
    seen: list[float] = []

    def getloadavg() -> tuple[float, float, float]:
        value = values[min(len(seen), len(values) - 1)]
        seen.append(value)
        return value, value, value

    monkeypatch.setattr(timing.os, "getloadavg", getloadavg)
    return seen


class FakeRunner:
    """``run_suite`` that records its calls and returns ``status`` (or the next of ``statuses``)."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.calls: list[dict] = []
        self.statuses = statuses or []

    def __call__(self, name: str, **options) -> int:
        self.calls.append({"name": name, **options})
        return self.statuses[len(self.calls) - 1] if len(self.calls) <= len(self.statuses) else 0

    def order(self) -> list[tuple[int, str, str]]:
        return [(c["seeds"][0], c["benchmarks"][0], c["configs"][0]) for c in self.calls]


@pytest.fixture
def no_store(monkeypatch, tmp_path):
    """The store replaced: nothing finished, every finished fit's value 1.0 (by arm, see ``values``)."""
    done: set[tuple[str, str, str]] = set()
    values: dict[str, float] = {}
    monkeypatch.setattr(timing, "check_store", lambda uri: None)
    monkeypatch.setattr(timing, "finished_runs", lambda uri, suite: set(done))
    monkeypatch.setattr(timing, "run_value",
                        lambda uri, cell, reading, tags=None: ("run-" + cell.cell, values.get(cell.cell, 1.0)))
    return {"done": done, "values": values, "uri": f"sqlite:///{tmp_path / 'runs.db'}", "tmp": tmp_path}


# ----------------------------------------------------------------------------- ABBA


def test_the_arm_order_is_reversed_on_every_other_seed():
    a, b, c = Arm("x", "A"), Arm("x", "B"), Arm("x", "C")
    assert [arm_order([a, b], p) for p in range(4)] == [[a, b], [b, a], [a, b], [b, a]]
    assert arm_order([a, b, c], 1) == [c, b, a]


def test_the_driver_runs_one_fit_at_a_time_in_abba_order(monkeypatch, clock, no_store):
    loads(monkeypatch, [0.1])
    run = FakeRunner()
    assert run_timing(FEDLF, tracking_uri=no_store["uri"], seeds=[0, 1, 2, 3], run=run) == 0
    bench = "mnist5k/pat-1/p0.1/fl_mlp"
    forward = ["FedLF", FEDFV, "FedLF(qp_solver=cvxopt)"]
    expected = [(seed, bench, config) for seed in range(4)
                for config in (forward if seed % 2 == 0 else forward[::-1])]
    assert run.order() == expected
    assert all(c["jobs"] == 1 and c["tracking_uri"] == no_store["uri"] and len(c["seeds"]) == 1 for c in run.calls)
    assert all(c["name"] == FEDLF for c in run.calls)


def test_cgsv_arms_are_its_two_benchmarks_alternated(monkeypatch, clock, no_store):
    loads(monkeypatch, [0.1])
    run = FakeRunner()
    assert run_timing(CGSV, tracking_uri=no_store["uri"], seeds=[5, 6], run=run) == 0
    config = "CGSV(beta=1.0)"
    assert run.order() == [(5, "mnist5k/pow/full/fl_mlp", config), (5, "mnist5k/pow-5/full/fl_mlp", config),
                           (6, "mnist5k/pow-5/full/fl_mlp", config), (6, "mnist5k/pow/full/fl_mlp", config)]


# ----------------------------------------------------------------------------- the load gate


def test_the_load_gate_waits_for_an_idle_machine_saying_why_once(monkeypatch, clock):
    seen = loads(monkeypatch, [1.8, 1.2, 0.7, 0.3])
    said: list[str] = []
    load, waited = wait_until_idle(0.5, 600, say=said.append)
    assert load == 0.3 and waited == sum(clock.sleeps) and len(clock.sleeps) == 3 and len(seen) == 4
    assert len(said) == 1 and "\n" not in said[0]
    assert "1-minute load 1.80 >= --max-load 0.5" in said[0]


def test_an_idle_machine_is_not_waited_for(monkeypatch, clock):
    loads(monkeypatch, [0.2])
    said: list[str] = []
    assert wait_until_idle(0.5, 600, say=said.append) == (0.2, 0.0)
    assert said == [] and clock.sleeps == []


def test_the_load_gate_gives_up_after_max_wait_in_one_line(monkeypatch, clock):
    loads(monkeypatch, [1.9])
    with pytest.raises(MachineBusy) as busy:
        wait_until_idle(0.5, 120, say=lambda line: None)
    assert clock.now == pytest.approx(120) and "\n" not in str(busy.value)
    assert "stayed at or above --max-load 0.5 for 120 s" in str(busy.value)


def test_a_busy_machine_stops_the_driver_with_status_1_before_any_fit(monkeypatch, clock, no_store, capsys):
    loads(monkeypatch, [3.0])
    run = FakeRunner()
    assert run_timing(FEDLF, tracking_uri=no_store["uri"], seeds=[0], max_wait_s=60, run=run) == 1
    assert run.calls == []
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("timing: the machine is busy")


def test_the_load_before_and_after_and_the_machine_are_recorded(monkeypatch, clock, no_store):
    loads(monkeypatch, [0.25, 0.9])  # before the first fit, then after it (and from then on)
    run = FakeRunner()
    assert run_timing(CGSV, tracking_uri=no_store["uri"], seeds=[0], max_load=1.0, run=run) == 0
    path = no_store["tmp"] / "runs.db.cgsv-timing-offline.timing.json"
    record = yaml.safe_load(path.read_text())  # JSON is YAML
    first = record["runs"]["0|mnist5k/pow/full/fl_mlp|CGSV(beta=1.0)"]
    assert first["load_1min_before"] == 0.25 and first["load_1min_after"] == 0.9 and first["arm_number"] == 1
    assert first["machine"]["cpu"] and first["machine"]["cores"] >= 1 and first["status"] == "FINISHED"
    assert first["run_id"] == "run-mnist5k/pow/full/fl_mlp|CGSV(beta=1.0)" and first["value"] == 1.0
    assert not list(no_store["tmp"].glob("*.partial"))  # written beside, then renamed


# ----------------------------------------------------------------------------- resume and stop


def test_a_finished_seed_and_arm_is_not_run_again(monkeypatch, clock, no_store, capsys):
    loads(monkeypatch, [0.1])
    cells = load_suite(FEDLF, [0, 1])
    finished = [c for c in cells if (c.seed, c.algorithm_config) in ((0, FEDFV), (1, "FedLF"))]
    no_store["done"].update((c.cell, str(c.seed), c.config_tag) for c in finished)
    run = FakeRunner()
    assert run_timing(FEDLF, tracking_uri=no_store["uri"], seeds=[0, 1], run=run) == 0
    ran = [(seed, config) for seed, _, config in run.order()]
    assert ran == [(0, "FedLF"), (0, "FedLF(qp_solver=cvxopt)"), (1, "FedLF(qp_solver=cvxopt)"), (1, FEDFV)]
    assert "2 already finished, 4 to run" in capsys.readouterr().out


def test_an_edited_cell_counts_as_not_finished(monkeypatch, clock, no_store):
    loads(monkeypatch, [0.1])
    cell = load_suite(FEDLF, [0])[0]
    no_store["done"].add((cell.cell, "0", "an-older-config"))
    run = FakeRunner()
    run_timing(FEDLF, tracking_uri=no_store["uri"], seeds=[0], run=run)
    assert len(run.calls) == 3


def test_ctrl_c_in_a_fit_stops_the_driver_with_the_runners_status(monkeypatch, clock, no_store, capsys):
    loads(monkeypatch, [0.1])
    run = FakeRunner(statuses=[0, 130])  # the runner stopped by SIGINT: its fit ended KILLED
    assert run_timing(FEDLF, tracking_uri=no_store["uri"], seeds=[0, 1], run=run) == 130
    assert len(run.calls) == 2
    assert "no fit is left running" in capsys.readouterr().err


def test_ctrl_c_while_waiting_for_the_machine_stops_between_fits(monkeypatch, no_store, capsys):
    loads(monkeypatch, [2.0])

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(timing.time, "sleep", interrupted)
    run = FakeRunner()
    assert run_timing(FEDLF, tracking_uri=no_store["uri"], seeds=[0], run=run) == 130
    assert run.calls == [] and "between fits" in capsys.readouterr().err


def test_a_failed_fit_is_reported_and_the_others_still_run(monkeypatch, clock, no_store):
    loads(monkeypatch, [0.1])
    run = FakeRunner(statuses=[1, 0, 0])
    assert run_timing(FEDLF, tracking_uri=no_store["uri"], seeds=[0], run=run) == 1
    assert len(run.calls) == 3


# ----------------------------------------------------------------------------- the suites and the claims


def claim(paper: str, claim_id: str) -> dict:
    claims = yaml.safe_load((ROOT / "benchmarks" / paper / "claims.yaml").read_text())["claims"]
    return next(c for c in claims if c["id"] == claim_id)


def test_the_fedlf_timing_suite_runs_exactly_the_arms_of_fedlf_t9_time():
    cells = load_suite(FEDLF)
    assert {c.suite for c in cells} == {"fedlf-timing-offline"} and {c.scale for c in cells} == {"offline"}
    found = claim("fedlf", "fedlf-t9-time")
    labels = {side for comparison in found["comparisons"] for side in (comparison["treatment"], comparison["baseline"])}
    labels |= {side for ablation in found.get("ablations", []) for comparison in ablation["comparisons"]
               for side in (comparison["treatment"], comparison["baseline"])}
    assert {a.config for a in suite_arms(cells)} == labels == {"FedLF", FEDFV, "FedLF(qp_solver=cvxopt)"}
    assert {a.benchmark for a in suite_arms(cells)} == {found["offline"]["benchmark"]} == {"mnist5k/pat-1/p0.1/fl_mlp"}
    assert sorted({c.seed for c in cells}) == list(range(10))


def test_the_cgsv_timing_suite_runs_exactly_the_arms_of_cgsv_fig1_shapley_time():
    cells = load_suite(CGSV)
    assert {c.suite for c in cells} == {"cgsv-timing-offline"}
    found = claim("cgsv", "cgsv-fig1-shapley-time")
    wanted = {(comparison["benchmark"], comparison["treatment"]) for comparison in found["comparisons"]}
    assert {(a.benchmark, a.config) for a in suite_arms(cells)} == wanted
    assert sorted({c.seed for c in cells}) == list(range(10))


@pytest.mark.parametrize(("timed", "source"), [(FEDLF, "fedlf/offline"), (CGSV, "cgsv/shapley_offline")])
def test_a_timing_cell_is_its_source_cell_but_for_the_rounds(timed, source):
    def settings(cell) -> dict:
        config = yaml.safe_load(yaml.safe_dump(cell.config))
        rounds = config["model"]["init_args"].pop("num_rounds")
        return {"config": config, "rounds": rounds}

    sources = {(c.benchmark, c.algorithm_config): settings(c) for c in load_suite(source, [0])}
    timed_cells = load_suite(timed, [0])
    for cell in timed_cells:
        mine = settings(cell)
        if (cell.benchmark, cell.algorithm_config) in sources:  # FedLF(qp_solver=cvxopt) is only in the ablation
            assert mine["config"] == sources[(cell.benchmark, cell.algorithm_config)]["config"]
        assert 20 <= mine["rounds"] <= 30  # steady-state rounds, not convergence
    assert any((c.benchmark, c.algorithm_config) in sources for c in timed_cells)


def test_the_timing_suites_are_known_as_such_with_their_readings():
    assert timing.is_timing_suite(FEDLF) and timing.is_timing_suite(CGSV)
    assert not timing.is_timing_suite("fedlf/offline") and not timing.is_timing_suite("cgsv/shapley_offline")
    for name in (FEDLF, CGSV):
        arms = suite_arms(load_suite(name, [0]))
        reading = timing.READINGS[load_suite(name, [0])[0].suite]
        assert reading.baseline in {a.cell for a in arms}


def test_the_summary_gives_median_min_max_per_arm_and_the_ratio_per_seed():
    a, b = Arm("x", "FedLF"), Arm("x", FEDFV)
    reading = timing.Reading("server_time_s", "server time per round", "ms", 1000.0, b.cell)
    values = {(0, a): 300.0, (0, b): 100.0, (1, a): 200.0, (1, b): 50.0, (2, a): 250.0}
    text = timing.summary_lines(values, [a, b], reading, {"suite": "s", "runs": {}}, [0, 1, 2])
    lines = text.splitlines()
    row = next(line for line in lines if line.strip().startswith("FedLF ") and "250" in line)
    assert row.split()[1:] == ["3", "250", "200", "300"]
    assert any(line.split() == ["0", "3"] for line in lines) and any(line.split() == ["1", "4"] for line in lines)
    assert "FedLF: 3.5 [3, 4]" in lines[-1]


def test_main_refuses_a_non_positive_max_load(capsys):
    with pytest.raises(SystemExit) as stop:
        timing.main([FEDLF, "--max-load", "0"])
    assert stop.value.code == 2 and "--max-load" in capsys.readouterr().err


def test_the_summary_names_fits_that_ended_on_a_busy_machine():
    a = Arm("x", "FedLF")
    reading = timing.Reading("server_time_s", "server time per round", "ms", 1000.0, "")
    entry = {"seed": 3, "benchmark": "x", "algorithm_config": "FedLF", "load_1min_before": 0.2,
             "max_load": 0.5, "machine": {"cpu": "AMD EPYC", "cores": 2}}
    quiet = {"suite": "s", "runs": {"3|x|FedLF": {**entry, "load_1min_after": 1.1}}}
    busy = {"suite": "s", "runs": {"3|x|FedLF": {**entry, "load_1min_after": 2.4}}}
    assert "other work may have run" not in timing.summary_lines({(3, a): 1.0}, [a], reading, quiet, [3])
    text = timing.summary_lines({(3, a): 1.0}, [a], reading, busy, [3])
    assert "1 fit(s) ended with a 1-minute load above" in text and "seed 3 x|FedLF" in text
    assert "machine: AMD EPYC (2 cores)" in text


def test_the_ledger_hook_runs_one_fit_at_a_time_and_passes_the_runners_options_on(monkeypatch, clock, no_store):
    loads(monkeypatch, [0.1])
    run = FakeRunner()
    monkeypatch.setattr("benchmarks.runner.run_suite", run)
    assert timing.run_timing_suite(CGSV, jobs=2, tracking_uri=no_store["uri"], seeds=[40], isolate=True) == 0
    assert [c["seeds"] for c in run.calls] == [[40], [40]]
    assert all(c["jobs"] == 1 and c["isolate"] is True for c in run.calls)
    with pytest.raises(ValueError):
        run_timing(CGSV, tracking_uri=no_store["uri"], run=run, runner_options={"jobs": 2})


@pytest.fixture
def registered(monkeypatch):
    """A registration (its hash) and a confirmatory pass of two fresh seeds that lists the timing suites."""
    import benchmarks.confirmatory as ledger

    lengths = {"fedlf-timing-offline": {"mnist5k/pat-1/p0.1/fl_mlp": {"num_rounds": 30, "eval_every": 10}}}
    monkeypatch.setattr(ledger, "registered_hash_or_exit", lambda root=None: "f" * 64)
    monkeypatch.setattr(ledger, "load_confirmatory",
                        lambda root=None: ledger.Confirmatory([1000, 1001], 1000, 2, "fresh", lengths))
    return ledger


def test_the_confirmatory_pass_runs_the_registered_seeds_one_at_a_time(monkeypatch, clock, no_store, registered):
    loads(monkeypatch, [0.1])
    cells = timing.timing_cells(FEDLF, None, True, None)
    assert {c.seed for c in cells} == {1000, 1001} and all(c.plan_hash == "f" * 64 for c in cells)
    done = next(c for c in cells if c.seed == 1001 and c.algorithm_config == FEDFV)
    no_store["done"].add((done.cell, "1001", done.config_tag))  # finished under this registration
    no_store["done"].add((done.cell, "1000", load_suite(FEDLF, [1000])[1].config_tag))  # exploratory: not it
    run = FakeRunner()
    assert run_timing(FEDLF, tracking_uri=no_store["uri"], confirmatory=True, run=run) == 0
    assert [(s, c) for s, _, c in run.order()] == [
        (1000, "FedLF"), (1000, FEDFV), (1000, "FedLF(qp_solver=cvxopt)"),
        (1001, "FedLF(qp_solver=cvxopt)"), (1001, "FedLF")]
    assert all(c["confirmatory"] is True and c["jobs"] == 1 for c in run.calls)
    with pytest.raises(SystemExit, match="--seeds and --confirmatory"):
        run_timing(FEDLF, tracking_uri=no_store["uri"], confirmatory=True, seeds=[1000], run=run)
