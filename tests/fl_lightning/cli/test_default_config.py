"""The main job (``fl-lightning fit``: ``configs/default.yaml``) measures its clients' accuracy in
the test mode the docs recommend for its partition (Datasets and partitions, "How client accuracy is measured")."""

from __future__ import annotations

import yaml

from fl_lightning.configs import DEFAULT_CONFIG
from fl_lightning.data.datamodule import FederatedDataModule

# The docs' recommendation (not kept as data in the package): ``matched`` for label-skewed
# partitions, whose clients differ in their labels only, so each client's accuracy is its model's
# class-wise accuracy on the shared pool weighted by its own label distribution, instead of a
# local test set of about 10 samples that quantises it in 10-point steps and turns the spread
# across clients (std, worst 10%) into sampling noise; ``local`` for clients that differ in their
# inputs too (natural clients: ``matched`` is refused there).
RECOMMENDED_TEST_MODE = {
    "dirichlet": "matched", "shards": "matched", "pathological": "matched",  # label skew (the docs' list)
    "natural": "local",  # feature skew
}


def test_the_main_job_tests_its_clients_as_recommended_for_its_partition():
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())["data"]
    assert data["test_mode"] == RECOMMENDED_TEST_MODE[data["partition"]]


def test_the_main_jobs_clients_are_measured_on_the_shared_pool():
    """The default data, built: every client is measured on the whole 1,000-image pool."""
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())["data"]
    module = FederatedDataModule(**data, seed=0)
    module.setup("fit")
    assert module.client_test_description().startswith("matched: 1,000-sample shared pool")


# ------------------------------------------------------------------ issue 50: one default per setting
def printed_text(capsys, monkeypatch, tmp_path, *words: str) -> str:
    """What ``fl-lightning fit [words] --print_config`` prints."""
    import pytest

    from fl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["fl-lightning"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["fit", *words, "--print_config"])
    assert exit_.value.code in (0, None)
    return capsys.readouterr().out


def cli_printed_config(capsys, monkeypatch, tmp_path) -> dict:
    """What ``fl-lightning fit --print_config`` shows: the values a plain CLI fit uses."""
    return yaml.safe_load(printed_text(capsys, monkeypatch, tmp_path))


def python_defaults(cls) -> dict:
    import inspect

    return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


def split_defaults(capsys, monkeypatch, tmp_path) -> dict[str, tuple]:
    """{setting: (the CLI's value, the Python default)} for every data and model setting where the
    CLI's default (its default config, ``--print_config``) and a module built in Python differ.
    ``partition_params``: the parameters a data module built with no arguments uses (its
    partitioner's defaults, which ``None`` stands for), as the CLI prints them."""
    from fl_lightning.algorithms import FedAvg
    from fl_lightning.cli.settings import DATA_LINKS
    from fl_lightning.core.module import FederatedModule

    printed = cli_printed_config(capsys, monkeypatch, tmp_path)
    split = {}
    for section, cls in (("data", FederatedDataModule), ("model", FedAvg)):
        cli_values = printed[section] if section == "data" else printed[section]["init_args"]
        defaults = (python_defaults(cls) | {"partition_params": FederatedDataModule().partition_params}
                    if section == "data" else python_defaults(FederatedModule) | python_defaults(cls))
        for name, default in defaults.items():
            if name in DATA_LINKS or name not in cli_values:
                continue
            if isinstance(default, tuple):
                default = list(default)
            if cli_values[name] != default:
                split[f"{section}.{name}"] = (cli_values[name], default)
    return split


def test_the_cli_and_python_give_one_default_per_setting(capsys, monkeypatch, tmp_path):
    """Issue 50: a setting has one default however a module is built (CLI, config or Python): the
    Dirichlet(0.5) label skew measured on the shared pool (``matched``), lr 0.05, every 5th round
    evaluated."""
    assert split_defaults(capsys, monkeypatch, tmp_path) == {}


def test_print_config_shows_the_partition_parameters_the_run_uses(capsys, monkeypatch, tmp_path):
    """The default partition's parameters are printed as numbers (not ``null``), the ones the data
    module resolves and logs (the run's ``dirichlet(alpha=0.5)``)."""
    data = cli_printed_config(capsys, monkeypatch, tmp_path)["data"]
    assert data["partition"] == "dirichlet"
    assert data["partition_params"] == {"alpha": 0.5, "min_size": 10, "max_tries": 100}
    built = FederatedDataModule(**{k: v for k, v in data.items() if k != "partition_params"})
    assert data["partition_params"] == built.partition_params == built.hparams["partition_params"]
    # parameters given in part: the rest filled in
    given = printed_text(capsys, monkeypatch, tmp_path, "--data.partition_params", "{alpha: 0.1}")
    assert yaml.safe_load(given)["data"]["partition_params"] == {"alpha": 0.1, "min_size": 10, "max_tries": 100}


def test_a_printed_config_gives_the_same_run(capsys, monkeypatch, tmp_path):
    """``--print_config``'s output fed back as ``--config`` prints the same config again (the default
    run, and one of another algorithm and partition)."""
    for words in ([], ["--model", "AFL", "--data.partition", "shards"]):
        first = printed_text(capsys, monkeypatch, tmp_path, *words)
        (tmp_path / "printed.yaml").write_text(first)
        assert printed_text(capsys, monkeypatch, tmp_path, "--config", str(tmp_path / "printed.yaml")) == first
