"""Shared fixtures."""

import pytest
import torch


@pytest.fixture()
def one_thread():
    """Tiny models: one intra-op thread is several times faster on a busy CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
