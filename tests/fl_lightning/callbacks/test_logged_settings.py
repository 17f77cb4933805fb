"""Issue 33: what a run logs is what ran: a participation rounded to whole clients is logged as the
one that ran, and a Trainer's own length that disagrees with num_rounds is refused, not ignored."""

import json

import mlflow
import pytest

from fl_lightning.algorithms import FedAvg
from tests.builders import trainer
from tests.fl_lightning.core.test_module import digits_data, module_for

pytestmark = pytest.mark.filterwarnings("ignore:The number of training batches")


@pytest.mark.parametrize("length", [{"max_epochs": 5}, {"max_epochs": 25}, {"max_steps": 2}])
def test_a_trainer_length_that_disagrees_with_num_rounds_is_refused(length):
    data = digits_data()
    module = module_for(data, num_rounds=10)
    with pytest.raises(ValueError, match=r"the module runs num_rounds=10 rounds .*: set num_rounds on the module"):
        trainer(**length).fit(module, datamodule=data)


@pytest.mark.parametrize("length", [{}, {"max_epochs": 3}, {"max_epochs": -1}, {"max_steps": 3}])
def test_a_trainer_length_that_agrees_or_is_unset_runs_num_rounds(length):
    data = digits_data()
    module = module_for(data, num_rounds=3)
    fit = trainer(**length)
    fit.fit(module, datamodule=data)
    assert fit.current_epoch == 3


@pytest.mark.integration
def test_a_rounded_participation_is_logged_as_the_one_that_ran(tmp_path, monkeypatch, capsys):
    from fl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    main(["fit", f"--trainer.logger.init_args.tracking_uri={uri}", "--trainer.enable_checkpointing=false",
          "--data.num_clients=3", "--model.fraction=0.1", "--model.num_rounds=2", "--model.eval_every=2"])
    assert "fraction 0.1 of 3 clients is 1 client a round: participation 0.333" in capsys.readouterr().out
    mlflow.set_tracking_uri(uri)
    run = mlflow.search_runs(experiment_names=["fl-lightning"]).iloc[0]
    assert run["tags.participation"] == "0.333333"
    assert json.loads(run["tags.task"])["fraction"] == pytest.approx(1 / 3, abs=1e-6)
    assert run["metrics.clients_sampled"] == 1.0
    assert run["params.fraction"] == "0.1"  # the setting as given stays beside it


def test_a_fraction_that_fits_whole_clients_is_logged_as_given():
    from fl_lightning.callbacks.run_identity import effective_fraction

    data = digits_data(num_clients=20)
    module = FedAvg(backbone="fl_logreg", input_shape=data.input_shape, fraction=0.5)
    module.attach_data(data)
    assert effective_fraction(module) == 0.5
    module = FedAvg(backbone="fl_logreg", input_shape=data.input_shape, fraction=0.33)
    module.attach_data(data)
    assert effective_fraction(module) == pytest.approx(0.35)  # round(6.6) = 7 of 20
