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
