"""The algorithm of the docs' "Writing an algorithm" section, written to a file exactly as
printed there, runs through the CLI by class path, and a run interrupted after round 2 and
resumed from its checkpoint ends bit for bit like an uninterrupted one."""

import re
from pathlib import Path

import pytest
import torch

from fl_lightning.cli import main
from tests.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

DOCS = REPO / "docs"
ROUNDS = 4
CRASH = '''
from lightning.pytorch.callbacks import Callback


class CrashAtRound(Callback):
    """Dies when round ``round`` (1-based) starts: the previous round's checkpoint is on disk."""

    def __init__(self, round: int = 3):
        self.round = round

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch + 1 == self.round:
            raise RuntimeError("simulated crash")
'''


def docs_block(start: str) -> str:
    """The documentation's one fenced python block that starts with ``start``."""
    blocks = [block for page in sorted(DOCS.rglob("*.md"))
              for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)]
    matching = [b for b in blocks if b.startswith(start)]
    assert len(matching) == 1, f"the docs have {len(matching)} python blocks starting {start!r}"
    return matching[0]


def fit(workdir: Path, monkeypatch, *extra: str) -> Path:
    """A fit of the docs' algorithm in ``workdir`` (its own MLflow store); returns last.ckpt."""
    workdir.mkdir(exist_ok=True)
    monkeypatch.chdir(workdir)
    main([
        "fit", f"--trainer.logger.init_args.tracking_uri=sqlite:///{workdir / 'runs.db'}",
        "--model", "my_algorithms.LossWeightedAvg", "--model.smoothing=0.3", f"--model.num_rounds={ROUNDS}",
        "--model.fraction=0.5", "--model.dropout_prob=0.2", "--model.momentum=0.5", "--model.backbone=fl_logreg",
        "--model.batch_size=16", "--data.source=digits", "--data.num_clients=6", "--data.partition=iid",
        "--data.partition_params={}", "--seed_everything=3", *extra,
    ])
    return max(workdir.rglob("last.ckpt"), key=lambda path: path.stat().st_mtime_ns)


def test_docs_algorithm_runs_by_class_path_and_resumes_bit_for_bit(tmp_path, monkeypatch):
    code = tmp_path / "code"
    code.mkdir()
    (code / "my_algorithms.py").write_text(docs_block("# my_algorithms.py"))
    (code / "crash_at_round.py").write_text(CRASH)
    monkeypatch.syspath_prepend(str(code))

    uninterrupted = torch.load(fit(tmp_path / "whole", monkeypatch), map_location="cpu", weights_only=False)
    with pytest.raises(RuntimeError, match="simulated crash"):
        fit(tmp_path / "parts", monkeypatch, "--trainer.callbacks+=crash_at_round.CrashAtRound",
            "--trainer.callbacks.init_args.round=3")
    checkpoint = next((tmp_path / "parts").rglob("last.ckpt"))
    assert torch.load(checkpoint, map_location="cpu", weights_only=False)["epoch"] == 1  # rounds 1-2 done
    resumed = torch.load(fit(tmp_path / "parts", monkeypatch, "--ckpt_path", str(checkpoint)),
                         map_location="cpu", weights_only=False)

    assert uninterrupted["epoch"] == resumed["epoch"] == ROUNDS - 1
    state, state_resumed = uninterrupted["state_dict"], resumed["state_dict"]
    assert "running_loss" in state and state["running_loss"].shape == (6,)  # the declared per-client state
    assert not torch.equal(state["running_loss"], torch.ones(6))  # ... which the rounds changed
    assert state.keys() == state_resumed.keys()
    for name in state:
        assert torch.equal(state[name], state_resumed[name]), name


def test_docs_python_snippet_runs_quietly_and_writes_nothing(tmp_path, monkeypatch, recwarn):
    """The docs' "From Python" block, as printed: no Lightning warning about the fit's length,
    and no checkpoints/ (or any other file) left in the working folder."""
    monkeypatch.chdir(tmp_path)
    snippet = docs_block("import lightning.pytorch as pl\nfrom fl_lightning.algorithms import FedAvg\n")
    exec(compile(snippet.replace("num_rounds=50", "num_rounds=3"), "trainer-scripts.md", "exec"), {})
    assert list(tmp_path.iterdir()) == []
    assert not [w for w in recwarn if "max_epochs" in str(w.message)], [str(w.message) for w in recwarn]


def test_docs_algorithm_setting_is_checked_by_its_type(tmp_path, monkeypatch, capsys):
    """The docs' algorithm declares ``smoothing: Probability`` and no check of its own: a value
    outside [0, 1) is refused in Python and, in one line, by the CLI before any run exists."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "my_algorithms.py").write_text(docs_block("# my_algorithms.py"))
    monkeypatch.syspath_prepend(str(code))
    import my_algorithms

    with pytest.raises(ValueError, match=r"^smoothing must be in \[0, 1\), got 1\.5$"):
        my_algorithms.LossWeightedAvg(smoothing=1.5)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--model", "my_algorithms.LossWeightedAvg", "--model.smoothing=1.5",
              f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path / 'runs.db'}"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: smoothing must be in [0, 1), got 1.5"
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "runs.db").exists()
