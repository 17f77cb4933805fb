"""Shared fixtures (imports nothing heavy at module level: the browser env has no torch)."""

import pytest

# the shared builders assert too: pytest rewrites their asserts, so a failure there says what differed
pytest.register_assert_rewrite("tests.builders", "tests.leaderboard_builders")


def pytest_addoption(parser):
    parser.addoption("--accelerator", choices=["cpu", "gpu"], default="cpu",
                     help="where the engine, module and resume tests run (gpu: the first CUDA device)")


def pytest_configure(config):
    import os

    from tests import accelerator

    # a fit's threads "auto" is the cores it is given: in the tests, one (xdist's workers share
    # the machine's cores, and tiny models are several times slower when two threads fight);
    # tests of the rule itself set their own
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    accelerator.ACCELERATOR = config.getoption("accelerator")
    if accelerator.ACCELERATOR == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise pytest.UsageError("--accelerator gpu: PyTorch sees no CUDA device here; run without it")
        # the engines must agree in float32; cuDNN's default TF32 convolutions round to 10 bits
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False


@pytest.fixture()
def one_thread():
    """Tiny models: one intra-op thread is several times faster on a busy CPU."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=["epoch", "per-step"])
def gathering(request, monkeypatch):
    """Both ways the vectorised engine gathers minibatches: an epoch at once (what fits in
    ``core.engines.EPOCH_GATHER_BYTES``) and step by step (larger data)."""
    if request.param == "per-step":
        from fl_lightning.core import engines

        monkeypatch.setattr(engines, "EPOCH_GATHER_BYTES", 0)
    return request.param


@pytest.fixture()
def store(tmp_path, monkeypatch):
    """A fresh SQLite MLflow store in the test's folder (also the working folder, where checkpoints
    land, and $MLFLOW_TRACKING_URI); its URI."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri
