"""Shared fixtures (imports nothing heavy at module level: the browser env has no torch)."""

import pytest


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
