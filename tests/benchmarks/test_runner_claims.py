"""Issue 50, one runner per cell and exit statuses that tell the truth: runners of one suite on one
store claim each cell (a live runner's cell is left to it, waited for, and run only if it did not
finish); a new store is made by one runner while the others wait; the runner exits non-zero when
a cell ended FAILED or KILLED and stops scheduling after SIGINT even where it inherited SIGINT
ignored; the newest unfinished run of a cell is the one resumed, never a live one; an empty grid
is refused."""

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from benchmarks import runner
from benchmarks.launchers import STOPPED
from benchmarks.suite_store import (
    claims_folder,
    ensure_experiment,
    latest_unfinished_run,
    record_failure,
    resumable_checkpoint,
)
from benchmarks.suites import expand_algorithms, load_suite
from fl_lightning.records.fit_lock import read_lock, this_host
from fl_lightning.records.vocabulary import Tag
from tests.benchmarks.test_runner import SUITE
from tests.paths import REPO

ROOT = REPO


class FakeLauncher:
    """A launcher that runs nothing: each cell answers ``answers(cell_number)`` (0: finished)."""

    def __init__(self, answer=lambda number: 0):
        self.answer, self.calls, self.stopped = answer, [], []

    def run(self, config_path, log_path):
        if STOPPED.is_set():
            return runner.NOT_STARTED
        self.calls.append(Path(config_path).name)
        return self.answer(len(self.calls))

    def stop(self, signum):
        self.stopped.append(signum)

    def close(self):
        pass


def fake(monkeypatch, launcher):
    monkeypatch.setattr(runner, "WarmWorkers", lambda jobs, threads: launcher)
    return launcher


def logged_store(config_path):
    """The MLflow store the cell's config file at ``config_path`` logs its fit to."""
    return yaml.safe_load(Path(config_path).read_text())["trainer"]["logger"]["init_args"]["tracking_uri"]


def test_a_cell_claimed_by_a_live_runner_is_waited_for_then_run_here_once_its_claim_is_gone(suite_file, tmp_path,
                                                                                            monkeypatch, capsys):
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    cells = load_suite(str(suite_file))
    claims = claims_folder(uri, cells[0].suite, tmp_path / "benchmark_logs" / cells[0].suite)
    assert claims == Path(f"{tmp_path / 'runs.db'}.claims") / "tiny-offline"  # beside the store
    claims.mkdir(parents=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(8)"])  # the other runner, alive
    threading.Thread(target=other.wait, daemon=True).start()  # reaped as it ends (a zombie would look alive)
    claim = claims / f"{runner.cell_file_name(cells[0])}.claim"
    claim.write_text(f'{{"host": "{this_host()}", "pid": {other.pid}, "started": "now"}}')
    stores = []

    class StoreReading(FakeLauncher):
        def run(self, config_path, log_path):
            stores.append(logged_store(config_path))
            return super().run(config_path, log_path)

    launcher = fake(monkeypatch, StoreReading())
    monkeypatch.setattr(runner, "WAIT_S", 0.2)
    try:
        assert runner.run_suite(str(suite_file), tracking_uri=uri) == 0
    finally:
        other.kill()
        other.wait()
    assert stores == [uri] * 3  # the cell looked at again logs to the store too
    out = capsys.readouterr().out
    assert "ELSEWHERE" in out and f"process {other.pid} on {this_host()}" in out and "waiting for it" in out
    first = f"{runner.cell_file_name(cells[0])}.yaml"
    assert launcher.calls[-1] == first and launcher.calls.count(first) == 1  # run once, after the others
    assert not list(claims.iterdir())  # every claim released
    assert "suite tiny-offline done" in out


def test_a_cell_is_claimed_while_it_runs_left_alone_when_another_holds_it_and_skipped_when_done_meanwhile(
        suite_file, tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    cell = load_suite(str(suite_file))[0]
    claims, logs = tmp_path / "claims", tmp_path / "logs"
    logs.mkdir()
    held = {}

    class Looking(FakeLauncher):
        def run(self, config_path, log_path):
            held.update(read_lock(claims / f"{runner.cell_file_name(cell)}.claim"))
            held["store"] = logged_store(config_path)
            return super().run(config_path, log_path)

    ensure_experiment(uri, cell.suite)
    assert runner.run_cell(cell, uri, logs, Looking(), claims)[1] == "FINISHED"
    assert held["pid"] == os.getpid() and held["store"] == uri and not list(claims.iterdir())
    (claims / f"{runner.cell_file_name(cell)}.claim").write_text(
        f'{{"host": "{this_host()}", "pid": {os.getppid()}, "started": "now"}}')
    launcher = FakeLauncher()
    status = runner.run_cell(cell, uri, logs, launcher, claims)
    assert status[1] == runner.ELSEWHERE and not launcher.calls
    assert not list(logs.glob(f"{runner.cell_file_name(cell)}*.log"))  # its log is the other runner's
    (claims / f"{runner.cell_file_name(cell)}.claim").unlink()
    # another runner finished the cell meanwhile: its FINISHED run in the store (one of another seed
    # is not it)
    from mlflow.tracking import MlflowClient

    from fl_lightning.records.vocabulary import Tag

    store = MlflowClient(uri)
    experiment = store.get_experiment_by_name(cell.suite).experiment_id
    for seed in (str(cell.seed + 1), str(cell.seed)):
        assert runner.run_cell(cell, uri, logs, launcher, claims)[1] != "SKIPPED (done)"  # not done yet
        tags = {Tag.CELL: cell.cell, Tag.SEED: seed, Tag.CELL_CONFIG: cell.config_tag}
        done = store.create_run(experiment, tags=tags)
        store.set_terminated(done.info.run_id, "FINISHED")
    launcher.calls.clear()
    assert runner.run_cell(cell, uri, logs, launcher, claims) == (cell, "SKIPPED (done)", 0.0, "")
    assert not launcher.calls


def test_each_way_a_cell_can_end_without_running_is_one_exact_outcome(suite_file, tmp_path):
    """``run_cell``: without a claims folder the cell runs, its config logging to the store; a
    claims folder that cannot be made, a cell another live runner holds (named, or "another
    process" when its claim cannot be read yet), a suite stopped meanwhile: each its status, no
    seconds, and the words the summary shows."""

    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    cell = load_suite(str(suite_file))[0]
    logs = tmp_path / "logs"
    ensure_experiment(uri, cell.suite)
    launcher = FakeLauncher()
    ran, status, seconds, error = runner.run_cell(cell, uri, logs, launcher)  # no claims folder
    assert (ran, status, error) == (cell, "FINISHED", "") and seconds >= 0
    assert logged_store(logs / f"{runner.cell_file_name(cell)}.yaml") == uri and launcher.calls
    (tmp_path / "a-file").write_text("")
    assert runner.run_cell(cell, uri, logs, launcher, tmp_path / "a-file" / "claims")[1:] == (
        "NOT-RUN", 0.0, f"cannot claim the cell in {tmp_path / 'a-file' / 'claims'} (Not a directory)")
    claims = tmp_path / "claims"
    claims.mkdir()
    claim = claims / f"{runner.cell_file_name(cell)}.claim"
    claim.write_text(f'{{"host": "{this_host()}", "pid": {os.getppid()}, "started": "now"}}')
    assert runner.run_cell(cell, uri, logs, launcher, claims)[1:] == (
        runner.ELSEWHERE, 0.0, f"being run by another runner of this store (process {os.getppid()} on "
                               f"{this_host()}; claim {claim})")
    claim.write_text("")  # being written by the other runner: not readable yet
    assert runner.run_cell(cell, uri, logs, launcher, claims)[1:] == (
        runner.ELSEWHERE, 0.0, f"being run by another runner of this store (another process; claim {claim})")
    claim.unlink()
    STOPPED.set()
    try:
        assert runner.run_cell(cell, uri, logs, launcher, claims)[1:] == ("NOT-RUN", 0.0, runner.NOT_STARTED)
    finally:
        STOPPED.clear()
    assert not claim.exists()


def test_a_cell_that_ran_ends_finished_killed_or_failed_and_the_store_says_what_its_fit_could_not(
        suite_file, tmp_path):
    """``_run_claimed_cell``, by what the launcher answered: 0 is FINISHED; a fit stopped by a
    signal ended its run KILLED itself; a worker that died while the suite stopped, or a fit that
    failed (an exit code, or a launcher's own words), has its run ended in the store, with the
    last 3,000 characters of the cell's log."""
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    cells = load_suite(str(suite_file))
    logs = tmp_path / "logs"
    client = MlflowClient(uri)
    experiment = ensure_experiment(uri, cells[0].suite)

    asked = []

    def run(cell, answer):  # a launcher that answers whatever the suite's state (a worker dying as it stops)
        from types import SimpleNamespace

        def launch(config_path, log_path):
            asked.append((config_path, log_path))
            return answer

        return runner.run_cell(cell, uri, logs, SimpleNamespace(run=launch))

    def log_of(cell):
        return logs / f"{runner.cell_file_name(cell)}.log"

    ended = run(cells[0], 0)
    assert ended[:2] == (cells[0], "FINISHED") and 0 <= ended[2] < 60 and ended[3] == ""
    stem = logs / runner.cell_file_name(cells[0])
    assert asked == [(str(Path(f"{stem}.yaml").resolve()), f"{stem}.log")]
    assert run(cells[0], runner.NOT_STARTED)[1:] == ("NOT-RUN", pytest.approx(0, abs=60), runner.NOT_STARTED)
    assert run(cells[0], 128 + signal.SIGTERM)[1::2] == ("KILLED", "stopped with the suite; the next run of the "
                                                                   "suite resumes it")
    assert client.search_runs([experiment]) == []  # each fit ended its own run (or never started one)
    STOPPED.set()
    try:
        assert run(cells[1], -9)[1] == "KILLED"
    finally:
        STOPPED.clear()
    [killed] = client.search_runs([experiment])
    assert killed.info.status == "KILLED" and killed.data.tags[Tag.CELL] == cells[1].cell
    assert killed.data.tags[Tag.ERROR] == f"the suite was stopped (-9); log {log_of(cells[1])}"
    log_of(cells[2]).write_text("x" * 1000 + "y" * 3000)
    failed = run(cells[2], 1)
    assert failed[1::2] == ("FAILED", f"exit code 1; log {log_of(cells[2])}:\n" + "y" * 3000)
    log_of(cells[2]).unlink()
    [first] = client.search_runs([experiment], "attributes.status = 'FAILED'")
    assert first.data.tags[Tag.ERROR] == failed[3]
    lost = run(cells[2], "the worker was lost")[3]
    assert lost == f"the worker was lost; log {log_of(cells[2])}:\n"
    [again] = client.search_runs([experiment], "attributes.status = 'FAILED'")  # the same run, ended again
    assert again.info.run_id == first.info.run_id and again.data.tags[Tag.ERROR] == lost


def test_the_runner_exits_1_when_a_cell_ended_killed(suite_file, tmp_path, monkeypatch, capsys):
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    fake(monkeypatch, FakeLauncher(lambda number: 130 if number == 2 else 0))  # one fit stopped by a signal
    handlers = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL,
                signal.SIGHUP: signal.SIG_DFL}
    before = {number: signal.signal(number, handler) for number, handler in handlers.items()}
    try:
        assert runner.run_suite(str(suite_file), tracking_uri=uri) == 1
        assert {number: signal.getsignal(number) for number in handlers} == handlers  # put back as found
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
    out = capsys.readouterr().out
    assert "KILLED" in out and "done in" not in out
    assert f"`{runner.program_name()} run {suite_file}` again resumes them" in out  # the suite as it was named


def test_a_suite_runs_at_most_jobs_cells_at_once_logging_to_its_store_and_may_run_in_a_thread(
        suite_file, tmp_path, monkeypatch, capsys):
    """``--jobs 1`` claims and runs one cell at a time (a second runner sees the others unclaimed);
    every cell's config logs to the suite's store; a suite run from a thread other than the main
    one (a notebook's, a GUI's) installs no signal handlers and runs to its end."""
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    running, most, stores = [], [], set()

    class Counting(FakeLauncher):
        def run(self, config_path, log_path):
            running.append(config_path)
            most.append(len(running))
            stores.add(logged_store(config_path))
            time.sleep(0.05)
            running.remove(config_path)
            return super().run(config_path, log_path)

    fake(monkeypatch, Counting())
    codes = []
    worker = threading.Thread(target=lambda: codes.append(runner.run_suite(str(suite_file), tracking_uri=uri, jobs=1)))
    worker.start()
    worker.join(timeout=120)
    assert codes == [0] and len(most) == 3 and max(most) == 1 and stores == {uri}


def test_sigint_inherited_ignored_still_stops_the_suite_and_no_cell_starts_after(suite_file, tmp_path,
                                                                                 monkeypatch, capsys):
    """A background job of a script starts with SIGINT ignored: a SIGINT to its process group
    still stops the suite (exit 130), the cells not started are not run."""
    uri = f"sqlite:///{tmp_path / 'runs.db'}"

    def interrupted(number):
        os.kill(os.getpid(), signal.SIGINT)  # the process group's SIGINT reaches the runner...
        time.sleep(0.5)
        return 130  # ...and the fit in flight, which ends its run KILLED

    launcher = fake(monkeypatch, FakeLauncher(interrupted))
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert runner.run_suite(str(suite_file), tracking_uri=uri) == 128 + signal.SIGINT
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # put back as it was found
    finally:
        signal.signal(signal.SIGINT, previous)
        STOPPED.clear()
    assert len(launcher.calls) == 1
    captured = capsys.readouterr()
    assert "suite tiny-offline stopped" in captured.out and "interrupted (SIGINT)" in captured.err
    assert f"`{runner.program_name()} run {suite_file}` again runs them" in captured.err  # the suite as it was named
    assert captured.out.count("NOT-RUN") == 0 or "done" not in captured.out
    # the cell in flight ends 0.5 s after the stop: the runner waits for it and reports it KILLED
    assert "[1/3] KILLED" in captured.out and "killed" in table_line(captured.out, suite_file, launcher.calls[0])
    assert sum(" 1 not-run " in line and line.endswith(" 0s") for line in captured.out.splitlines()) == 2


def table_line(out, suite_file, config_name):
    """The summary table's line of the suite's cell whose config file is ``config_name``."""
    (cell,) = [c for c in load_suite(str(suite_file)) if f"{runner.cell_file_name(c)}.yaml" == config_name]
    lines = [line for line in out.splitlines() if line.split()[:1] == [cell.cell]]
    assert len(lines) == 1, out
    return lines[0]


def test_sighup_stops_the_suite_and_is_passed_on_as_sigterm(suite_file, tmp_path, monkeypatch, capsys):
    uri = f"sqlite:///{tmp_path / 'runs.db'}"

    def hung_up(number):
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.5)
        return 143

    launcher = fake(monkeypatch, FakeLauncher(hung_up))
    try:
        assert runner.run_suite(str(suite_file), tracking_uri=uri) == 128 + signal.SIGHUP
    finally:
        STOPPED.clear()
    assert launcher.stopped == [signal.SIGTERM] and len(launcher.calls) == 1
    assert "hung up (SIGHUP)" in capsys.readouterr().err


def test_a_confirmatory_pass_stopped_says_the_command_with_its_flag(suite_file, tmp_path, capsys):
    """``_run_cells`` of a confirmatory pass: the stop's line gives the command that runs the pass
    again, ``--confirmatory`` included."""
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    cells = load_suite(str(suite_file))

    def terminated(number):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)
        return 143

    progress = runner._Progress(len(cells))
    try:
        stopped_by = runner._run_cells(cells, FakeLauncher(terminated), progress, jobs=1, tracking_uri=uri,
                                       log_dir=tmp_path / "logs", claims=None, name="tiny.yaml", confirmatory=True)
    finally:
        STOPPED.clear()
    assert stopped_by == signal.SIGTERM
    assert f"`{runner.program_name()} run tiny.yaml --confirmatory` again runs them" in capsys.readouterr().err


def test_a_worker_that_dies_while_the_suite_stops_is_recorded_killed_not_failed(suite_file, tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    cell = load_suite(str(suite_file))[0]
    recorded = []
    monkeypatch.setattr(runner, "record_failure", lambda uri, cell, error, status="FAILED": recorded.append(status))

    def dies_as_the_suite_stops(number):
        STOPPED.set()
        return "its worker process was killed by SIGKILL"

    try:
        outcome = runner._run_claimed_cell(cell, uri, tmp_path, FakeLauncher(dies_as_the_suite_stops))
    finally:
        STOPPED.clear()
    assert outcome[1] == "KILLED" and recorded == ["KILLED"]
    recorded.clear()
    outcome = runner._run_claimed_cell(cell, uri, tmp_path, FakeLauncher(lambda n: "its worker process died"))
    assert outcome[1] == "FAILED" and recorded == ["FAILED"]


def test_the_newest_unfinished_run_of_a_cell_is_resumed_and_never_a_live_one(suite_file, tmp_path):
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    cell = load_suite(str(suite_file))[0]
    client = MlflowClient(uri)
    experiment = ensure_experiment(uri, cell.suite)
    older = client.create_run(experiment, start_time=1_000, tags=cell.tags)
    client.set_terminated(older.info.run_id, "KILLED")
    newer = client.create_run(experiment, start_time=2_000, tags=cell.tags)
    client.set_terminated(newer.info.run_id, "FAILED")
    others = load_suite(str(suite_file))[1:]  # newer unfinished runs of other cells and configs: not this cell's
    for number, other in enumerate([*others, replace(cell, seed=cell.seed + 1)]):
        client.create_run(experiment, start_time=5_000 + number, tags=other.tags)
    assert latest_unfinished_run(uri, cell).info.run_id == newer.info.run_id
    assert resumable_checkpoint(uri, cell) is None  # no checkpoint written yet: the cell starts again
    for run in (older, newer):
        folder = tmp_path / "checkpoints" / experiment / run.info.run_id / "checkpoints"
        folder.mkdir(parents=True)
        (folder / "last.ckpt").write_bytes(b"x")
    assert newer.info.run_id in resumable_checkpoint(uri, cell)
    live = client.create_run(experiment, start_time=3_000, tags={
        **cell.tags, Tag.FIT_HOST: this_host(), Tag.FIT_PID: str(os.getppid())})  # a fit that still runs
    folder = tmp_path / "checkpoints" / experiment / live.info.run_id / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "last.ckpt").write_bytes(b"x")
    assert resumable_checkpoint(uri, cell) is None
    client.set_tag(live.info.run_id, Tag.FIT_PID, "999999999")  # its fit is gone: resumed
    assert live.info.run_id in resumable_checkpoint(uri, cell)
    done = client.create_run(experiment, start_time=9_000, tags=cell.tags)  # the cell finished after all
    client.set_terminated(done.info.run_id, "FINISHED")
    assert latest_unfinished_run(uri, cell) is None and resumable_checkpoint(uri, cell) is None


def test_a_cell_whose_process_died_gets_its_newest_unfinished_run_ended_or_one_made_saying_why(suite_file, tmp_path):
    """``record_failure``: a cell with no run yet gets one, named by its config, seed, benchmark
    and ending (not MLflow's random name), with the cell's tags, the error's last 5,000
    characters and the status asked for; a cell with an unfinished run has that run ended so."""
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    first, second = load_suite(str(suite_file))[:2]
    client = MlflowClient(uri)
    error = "x" * 6000 + "the worker died"
    record_failure(uri, first, error)
    [made] = client.search_runs([ensure_experiment(uri, first.suite)])
    assert made.info.run_name == f"{first.algorithm_config} seed {first.seed} | {first.benchmark} | failed"
    assert made.info.status == "FAILED" and made.data.tags[Tag.ERROR] == error[-5000:]
    assert {key: made.data.tags.get(key) for key in first.tags} == first.tags
    experiment = ensure_experiment(uri, second.suite)
    unfinished = client.create_run(experiment, tags=second.tags)
    record_failure(uri, second, "stopped", status="KILLED")
    ended = client.get_run(unfinished.info.run_id)
    assert (ended.info.status, ended.data.tags[Tag.ERROR]) == ("KILLED", "stopped")
    assert len(client.search_runs([experiment])) == 2


@pytest.mark.parametrize(("signum", "stopped_by", "sent", "said", "confirmatory"), [
    (None, signal.SIGINT, [], "interrupted (SIGINT)", False),  # a KeyboardInterrupt raised by a cell's thread, say
    (signal.SIGINT, signal.SIGINT, [], "interrupted (SIGINT)", True),
    (signal.SIGTERM, signal.SIGTERM, [signal.SIGTERM], "terminated (SIGTERM)", False),
    (signal.SIGHUP, signal.SIGHUP, [signal.SIGTERM], "hung up (SIGHUP)", True),
])
def test_a_stop_names_its_signal_passes_sigterm_on_for_all_but_sigint_and_says_how_to_go_on(
        signum, stopped_by, sent, said, confirmatory, capsys):
    """``_stop_cells``: a KeyboardInterrupt that no signal handler raised is a SIGINT; the workers
    are sent SIGTERM unless the terminal's Ctrl-C reached them already; the line names the signal
    and the command that runs the cells again (a confirmatory pass's with its flag)."""
    stop = KeyboardInterrupt() if signum is None else runner.SuiteStopped(signum)
    launcher = FakeLauncher()
    try:
        assert runner._stop_cells(stop, {}, launcher, "tiny.yaml", confirmatory=confirmatory) == stopped_by
    finally:
        STOPPED.clear()
    assert launcher.stopped == sent
    again = f"{runner.program_name()} run tiny.yaml{' --confirmatory' if confirmatory else ''}"
    assert capsys.readouterr().err == (f"\n{said}: the cells in flight end KILLED; `{again}` again runs them, "
                                       "from their last checkpoint where the suite keeps checkpoints\n")
    if isinstance(stop, runner.SuiteStopped):
        assert str(stop) == signal.Signals(stopped_by).name


def test_the_summary_table_has_a_line_per_cell_with_its_seeds_endings_mean_accuracy_and_seconds():
    """A seed with no outcome this time was finished before (skipped); the mean is over the seeds
    the store has an accuracy for; the seconds are the runs' of this time, summed."""
    from types import SimpleNamespace

    cells = [SimpleNamespace(cell=cell, seed=seed) for cell in ("mnist/a|FedAvg", "b|FedFV") for seed in (0, 1)]
    outcomes = {("mnist/a|FedAvg", 0): ("FINISHED", 10.4), ("mnist/a|FedAvg", 1): ("FAILED", 5.0),
                ("b|FedFV", 1): ("FINISHED", 20.0)}
    accuracy = {("mnist/a|FedAvg", "0"): 0.5, ("b|FedFV", "0"): 0.75, ("b|FedFV", "1"): 0.5}
    assert runner.summary_table(cells, outcomes, accuracy).splitlines() == [
        "cell            runs                    mean acc     time",
        "mnist/a|FedAvg  1 finished, 1 failed      0.5000      15s",
        "b|FedFV         1 skipped, 1 finished     0.6250      20s",
    ]
    skipped = runner.summary_table(cells[2:], {}, {}).splitlines()[1]
    assert skipped == "b|FedFV  2 skipped                      —       0s"
    assert runner.summary_table([], {}, {}) == "cell        runs                    mean acc     time"


def test_progress_says_each_ending_once_numbers_the_cells_run_here_and_a_held_cell_once(capsys):
    """``_Progress``: a cell another runner holds is said once however often it is looked at, with
    ``-`` for its number, and given back to be looked at again; a cell that ends is numbered among
    the cells run here, with its error's first line; ``report_late`` says only the cells that ended
    unsaid (not a cancelled one, nor one whose thread raised)."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    def ended(cell, status, seconds, error=""):
        future = Future()
        future.set_result((cell, status, seconds, error))
        return future

    first, second, third = (SimpleNamespace(cell=name, seed=seed) for name, seed in (("a|FedAvg", 0), ("b|FedFV", 1),
                                                                                   ("c|CGSV", 2)))
    progress = runner._Progress(3)
    held = "being run by another runner of this store (process 7 on box; claim x.claim)"
    futures = [ended(first, runner.ELSEWHERE, 0.0, held), ended(first, runner.ELSEWHERE, 0.0, held),
               ended(second, "FAILED", 3.2, "exit code 1; log b.log:\nTraceback ..."), ended(first, "FINISHED", 12.0)]
    assert progress.report(futures[0]) is first and progress.outcomes == {("a|FedAvg", 0): (runner.ELSEWHERE, 0.0)}
    assert [progress.report(future) for future in futures[1:]] == [first, None, None]
    assert progress.outcomes == {("a|FedAvg", 0): ("FINISHED", 12.0), ("b|FedFV", 1): ("FAILED", 3.2)}
    assert capsys.readouterr().out.splitlines() == [
        f"[-/3] ELSEWHERE      0s  a|FedAvg seed 0  ({held}; waiting for it)",
        "[1/3] FAILED        3s  b|FedFV seed 1  (exit code 1; log b.log:)",
        "[2/3] FINISHED     12s  a|FedAvg seed 0",
    ]
    late, cancelled, raised = ended(third, "KILLED", 4.0, "stopped with the suite"), Future(), Future()
    cancelled.cancel()
    raised.set_exception(RuntimeError("the worker's thread failed"))
    progress.futures += [*futures, late, cancelled, raised]
    progress.report_late()
    assert capsys.readouterr().out.splitlines() == ["[3/3] KILLED        4s  c|CGSV seed 2  (stopped with the suite)"]


def test_each_progress_line_is_flushed_as_it_is_said(monkeypatch):
    """A runner's output in a log file or a pipe (block-buffered) shows each cell's line when the
    cell ends, not when the buffer fills."""
    import io
    from concurrent.futures import Future
    from types import SimpleNamespace

    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="utf-8", line_buffering=False))
    progress = runner._Progress(2)
    for status in (runner.ELSEWHERE, "FINISHED"):
        future = Future()
        future.set_result((SimpleNamespace(cell="a|FedAvg", seed=0), status, 1.0, "held"))
        before = raw.getvalue()
        progress.report(future)
        assert raw.getvalue().startswith(before) and raw.getvalue().endswith(b"\n") and raw.getvalue() != before


@pytest.mark.parametrize(("statuses", "stopped_by", "code"), [
    (["FINISHED", "SKIPPED (done)"], None, 0),
    (["FINISHED", "FAILED"], None, 1),
    (["KILLED"], None, 1),
    (["FINISHED", runner.ELSEWHERE], None, 1),  # left to another runner that stopped before finishing it
    (["FINISHED", "NOT-RUN"], None, 1),  # a cell that could not even be claimed
    (["FINISHED"], signal.SIGTERM, 128 + signal.SIGTERM),
    ([], signal.SIGINT, 128 + signal.SIGINT),
])
def test_the_exit_status_is_1_for_any_cell_not_done_and_128_plus_the_signal_that_stopped_the_suite(
        statuses, stopped_by, code):
    outcomes = {(f"cell{number}", 0): (status, 1.0) for number, status in enumerate(statuses)}
    assert runner.exit_status(outcomes, stopped_by) == code


def test_the_leaderboard_command_is_this_installations_fl_leaderboard_else_python_m(tmp_path, monkeypatch):
    """The summary's last line: the bare ``fl-leaderboard`` where ``PATH`` finds this installation's,
    its path where the environment was never activated, ``python -m leaderboard`` where it has none."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    uri = "sqlite:///runs.db"
    script = Path(sys.executable).parent / "fl-leaderboard"
    if not script.is_file():
        pytest.skip("this environment has no fl-leaderboard script beside its python")
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}/usr/bin")
    assert runner.leaderboard_command(uri) == "fl-leaderboard build --tracking-uri sqlite:///runs.db"
    monkeypatch.setenv("PATH", "/usr/bin")
    assert runner.leaderboard_command(uri) == f"{script.absolute()} build --tracking-uri sqlite:///runs.db"
    elsewhere = tmp_path / "bin" / "python"  # a Python with no console scripts beside it
    elsewhere.parent.mkdir()
    monkeypatch.setattr(sys, "executable", str(elsewhere))
    assert runner.leaderboard_command(uri) == f"{elsewhere} -m leaderboard build --tracking-uri sqlite:///runs.db"


def test_a_cells_file_name_keeps_its_parts_apart_and_drops_spaces():
    from types import SimpleNamespace

    cell = SimpleNamespace(cell="mnist5k/shards-200x2/p0.1/fl_mlp|FedProx(mu=0.1, beta=2)", seed=3)
    assert runner.cell_file_name(cell) == "mnist5k_shards-200x2_p0.1_fl_mlp__FedProx(mu=0.1,beta=2)__seed3"


def test_the_suites_closing_summary_says_how_it_ended_what_failed_and_how_to_go_on(monkeypatch, capsys):
    """``_print_summary``: done, ended (a cell failed or was killed) or stopped; the table with the
    store's accuracies; how many failed and where their errors are; how many a signal stopped and
    the command that resumes them (not after a stop, whose own line said it); the store and the
    leaderboard command."""
    from types import SimpleNamespace

    monkeypatch.setattr(runner, "time", SimpleNamespace(perf_counter=lambda: 112.0))
    asked = []

    def accuracies(tracking_uri, suite):
        asked.append((tracking_uri, suite))
        return {("a|FedAvg", "0"): 0.5}

    monkeypatch.setattr(runner, "final_metric", accuracies)
    cells = [SimpleNamespace(cell=name, seed=0) for name in ("a|FedAvg", "b|FedFV", "c|CGSV")]
    uri, logs = "sqlite:///runs.db", Path("benchmark_logs/tiny")
    ends = {("a|FedAvg", 0): ("FINISHED", 10.0), ("b|FedFV", 0): ("FAILED", 3.0), ("c|CGSV", 0): ("KILLED", 4.0)}
    table = ["cell      runs                    mean acc     time",
             "a|FedAvg  1 finished                0.5000      10s",
             "b|FedFV   1 failed                       —       3s",
             "c|CGSV    1 killed                       —       4s"]
    last = ["", f"Store: {uri}", f"Build the leaderboard from it:  {runner.leaderboard_command(uri)}"]
    runner._print_summary("tiny.yaml", "tiny", cells, ends, uri, logs, 0.4)
    assert capsys.readouterr().out.splitlines() == [
        "", "suite tiny ended in 112s; logs in benchmark_logs/tiny", "", *table, "",
        "1 run(s) failed: their errors are in the store (tag 'error') and in benchmark_logs/tiny", "",
        f"1 run(s) were stopped by a signal to their fits: `{runner.program_name()} run tiny.yaml` again resumes them",
        *last]
    assert asked == [(uri, "tiny")]
    STOPPED.set()
    try:
        runner._print_summary("tiny.yaml", "tiny", cells, ends, uri, logs, 100.0)
    finally:
        STOPPED.clear()
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "suite tiny stopped in 12s; logs in benchmark_logs/tiny"
    assert "were stopped by a signal" not in "".join(out)
    runner._print_summary("tiny.yaml", "tiny", cells[:1], {("a|FedAvg", 0): ("FINISHED", 10.0)}, uri, logs, 0.4)
    assert capsys.readouterr().out.splitlines() == ["", "suite tiny done in 112s; logs in benchmark_logs/tiny", "",
                                                    table[0], table[1], *last]


def test_an_empty_grid_list_is_refused(tmp_path):
    with pytest.raises(Exception, match="grid 'mu' is empty"):
        expand_algorithms([{"class_path": "fl_lightning.algorithms.FedProx", "grid": {"mu": []}}])
    path = tmp_path / "empty.yaml"
    path.write_text(yaml.safe_dump(dict(SUITE, algorithms=[{"class_path": "fl_lightning.algorithms.FedProx",
                                                            "grid": {"mu": []}}])))
    with pytest.raises(SystemExit, match="grid 'mu' is empty"):
        load_suite(str(path))


def test_runners_started_together_on_a_new_store_make_it_once(tmp_path):
    """Four processes set up the same new store at the same instant: none fails, one experiment."""
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    go = tmp_path / "go"
    code = ("import os, sys, time\n"
            "import mlflow.tracking, mlflow.store.tracking.sqlalchemy_store, fl_lightning.callbacks.mlflow_store\n"
            "from benchmarks.suite_store import check_store, ensure_experiment, finished_runs_or_exit\n"
            f"open(os.path.join({str(tmp_path)!r}, 'ready-' + sys.argv[1]), 'w').close()\n"
            f"while not os.path.exists({str(go)!r}): time.sleep(0.005)\n"
            f"check_store({uri!r}); ensure_experiment({uri!r}, 'tiny'); finished_runs_or_exit({uri!r}, 'tiny')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    children = [subprocess.Popen([sys.executable, "-c", code, str(number)], env=env, cwd=tmp_path,
                                 stderr=subprocess.PIPE, text=True) for number in range(4)]
    deadline = time.time() + 120
    while len(list(tmp_path.glob("ready-*"))) < 4 and time.time() < deadline:  # every child imported, waiting
        time.sleep(0.1)
    go.touch()
    errors = [child.communicate(timeout=120)[1] for child in children]
    assert [child.returncode for child in children] == [0] * 4, errors
    client = MlflowClient(uri)
    assert [e.name for e in client.search_experiments() if e.name == "tiny"] == ["tiny"]
