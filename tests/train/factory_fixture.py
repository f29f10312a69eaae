"""Model factories loaded by spec string in the tests ("tests.train.factory_fixture:make")."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Bigram(nn.Module):
    """The smallest model with the Llama forward contract: a next-token table."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.table = nn.Embedding(vocab_size, vocab_size)

    def forward(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = self.table(tokens)  # (B, T, V)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def make(*, vocab_size: int, seq_len: int) -> nn.Module:
    return Bigram(vocab_size)


def not_a_module(*, vocab_size: int, seq_len: int) -> object:
    return {"vocab_size": vocab_size}


NOT_CALLABLE = 3
