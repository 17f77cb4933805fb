"""Issue 50: the site's footer (and its marker file) name the command the user ran:
``fl-leaderboard build`` from the console script, ``python -m leaderboard build`` from the module."""

import sys

import pytest
from mlflow.tracking import MlflowClient

from leaderboard.__main__ import main as leaderboard_main
from leaderboard.site import MARKER, build_command
from tests.leaderboard_builders import OLD, log_run


@pytest.mark.parametrize(("argv0", "command"), [("/venv/bin/fl-leaderboard", "fl-leaderboard build"),
                                                ("/repo/leaderboard/__main__.py", "python -m leaderboard build")])
def test_the_footer_names_the_command_the_user_ran(argv0, command, tmp_path, monkeypatch, capsys):
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("tiny-offline")
    log_run(client, experiment, "tiny-offline", OLD, "FedAvg", 0, {"test_acc_mean": 0.8})
    monkeypatch.setattr(sys, "argv", [argv0, "build"])
    assert build_command() == command
    out = tmp_path / "site"
    assert leaderboard_main(["build", "--tracking-uri", uri, "--out", str(out)]) == 0
    capsys.readouterr()
    other = ({"fl-leaderboard build", "python -m leaderboard build"} - {command}).pop()
    html = (out / "index.html").read_text()
    footer = html[html.index("<footer>"):]
    assert f"<code>{command}</code>" in footer and other not in footer
    markdown = (out / "index.md").read_text()
    assert f"by `{command}`" in markdown and f"by `{other}`" not in markdown
    assert f"built by `{command}`" in (out / MARKER).read_text()
