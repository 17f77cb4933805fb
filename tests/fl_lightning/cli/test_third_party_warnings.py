"""Issue 33: a refusal stays one line where a common third party warns on import (pynvml, whose
deprecation warning torch.cuda triggers on GPU machines)."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

PYNVML = ('import warnings\n'
          'warnings.warn("The pynvml package is deprecated. Please install nvidia-ml-py instead.", FutureWarning)\n')


@pytest.mark.parametrize("args, line", [
    (["--model", "FedAvgg"], "error: unknown algorithm 'FedAvgg'"),
    (["--data.num_clients", "ten"], "error: data.num_clients must be an int, got 'ten'"),
])
def test_a_refusal_is_one_line_with_a_package_that_warns_on_import(tmp_path, args, line):
    (tmp_path / "pynvml.py").write_text(PYNVML)  # imported by torch.cuda, as the real package is
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTHONWARNINGS", None)
    check = subprocess.run([sys.executable, "-c", "import pynvml"], env=env, capture_output=True, text=True)
    assert "FutureWarning" in check.stderr  # the stand-in warns, as pynvml does
    done = subprocess.run([sys.executable, "-m", "fl_lightning.cli", "fit", *args, "--trainer.logger", "false"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), done.stderr
