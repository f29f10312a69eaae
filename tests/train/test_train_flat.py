"""One flat float32 vector behind all parameters; the model fingerprint."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from gaslocd.train.flat import FlatParameters, model_fingerprint
from gaslocd.train.model import build_model


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.out = nn.Linear(4, 10, bias=False)
        self.out.weight = self.emb.weight
        self.mid = nn.Linear(4, 4)


def _tiny() -> nn.Module:
    return build_model("tiny", vocab_size=256, seq_len=16, seed=0)


def test_values_are_kept_and_parameters_are_views() -> None:
    model = _tiny()
    before = [p.detach().clone() for p in model.parameters()]
    flat = FlatParameters(model)
    assert flat.flat.dtype == torch.float32 and flat.flat.dim() == 1
    assert flat.numel == sum(p.numel() for p in model.parameters())
    for p, old in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, old)
    flat.check()
    flat.flat.zero_()
    assert all(bool((p == 0).all()) for p in model.parameters())


def test_tied_weights_are_stored_once() -> None:
    model = Tied()
    flat = FlatParameters(model)
    assert flat.numel == 10 * 4 + 4 * 4 + 4
    assert flat.names == ["emb.weight", "mid.weight", "mid.bias"]
    assert model.out.weight is model.emb.weight
    flat.flat[:40] = 7.0
    assert bool((model.out.weight == 7.0).all())


def test_optimizer_steps_update_flat_and_views_stay_views() -> None:
    model = _tiny()
    flat = FlatParameters(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    start = flat.clone()
    for _ in range(3):
        opt.zero_grad()
        _, loss = model(tokens, tokens)
        assert loss is not None
        loss.backward()
        opt.step()
    flat.check()
    assert not torch.equal(flat.flat, start)
    # Writing θ in place between rounds (the outer step) is what the optimizer sees next.
    flat.load_(start)
    for p, a, shape in zip(model.parameters(), flat.offsets, flat.shapes, strict=True):
        assert torch.equal(p, start[a : a + p.numel()].view(shape))
    opt.step()  # still steps the same storage
    flat.check()


def test_load_checks_shape_and_clone_is_independent() -> None:
    flat = FlatParameters(Tied())
    with pytest.raises(ValueError, match="shape"):
        flat.load_(torch.zeros(flat.numel + 1))
    copy = flat.clone()
    flat.flat.add_(1.0)
    assert not torch.equal(copy, flat.flat)
    assert flat.nbytes == 4 * flat.numel


def test_check_detects_a_broken_view() -> None:
    model = Tied()
    flat = FlatParameters(model)
    model.mid.bias.data = torch.zeros(4)
    with pytest.raises(RuntimeError, match=r"mid\.bias"):
        flat.check()


def test_fingerprint_is_stable_across_processes_and_tells_models_apart() -> None:
    fp = model_fingerprint(_tiny(), "tiny")
    code = (
        "from gaslocd.train.model import build_model; "
        "from gaslocd.train.flat import model_fingerprint; "
        "print(model_fingerprint(build_model('tiny', vocab_size=256, seq_len=16, seed=9), 'tiny'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == fp
    assert len(fp) == 16 and int(fp, 16) >= 0
    assert model_fingerprint(_tiny(), "small") != fp
    bigger = build_model("tiny", vocab_size=300, seq_len=16, seed=0)
    assert model_fingerprint(bigger, "tiny") != fp
    other = build_model("small", vocab_size=256, seq_len=16, seed=0)
    assert model_fingerprint(other, "tiny") != fp
