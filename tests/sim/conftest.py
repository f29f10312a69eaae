"""Fixtures of the simulator tests: a small corpus per module, one torch thread (the
simulated clock does not depend on it, and one thread keeps runs reproducible)."""

from __future__ import annotations

import pytest
import torch

from gaslocd.train.data import Corpus, load_corpus


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus(None, max_bytes=2 * 2**20)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)
