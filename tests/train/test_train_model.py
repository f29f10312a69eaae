"""The Llama decoder: shapes, causality, RoPE, init, sizes and model specs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from gaslocd.train.model import (
    MODEL_CONFIGS,
    Llama,
    ModelConfig,
    apply_rope,
    build_model,
    count_parameters,
    rope_tables,
)

REPO = Path(__file__).resolve().parents[2]
FACTORY = "tests.train.factory_fixture"


@pytest.fixture
def tiny() -> Llama:
    model = build_model("tiny", vocab_size=256, seq_len=32, seed=0)
    assert isinstance(model, Llama)
    return model


@pytest.fixture
def repo_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))


def test_shapes_and_loss(tiny: Llama) -> None:
    tokens = torch.randint(0, 256, (3, 32))
    logits, loss = tiny(tokens)
    assert logits.shape == (3, 32, 256) and loss is None
    logits, loss = tiny(tokens, tokens)
    assert loss is not None and loss.shape == ()


def test_fresh_model_predicts_nearly_uniformly(tiny: Llama) -> None:
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 256, (4, 32), generator=gen)
    targets = torch.randint(0, 256, (4, 32), generator=gen)
    _, loss = tiny(tokens, targets)
    assert loss is not None
    assert abs(loss.item() - math.log(256)) < 0.15


def test_future_tokens_do_not_change_earlier_logits(tiny: Llama) -> None:
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(2))
    changed = tokens.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % 256
    before, _ = tiny(tokens)
    after, _ = tiny(changed)
    torch.testing.assert_close(before[:, :20], after[:, :20])
    assert not torch.allclose(before[:, 20:], after[:, 20:])


def test_rope_scores_depend_only_on_relative_position() -> None:
    cos, sin = rope_tables(16, 64, 10000.0)
    q = torch.randn(16, generator=torch.Generator().manual_seed(3))
    k = torch.randn(16, generator=torch.Generator().manual_seed(4))

    def score(m: int, n: int) -> float:
        seq = torch.zeros(1, 1, 64, 16)
        seq[0, 0, m], seq[0, 0, n] = q, k
        # Rotate both as a whole sequence, as the model does.
        rq, rk = apply_rope(seq, cos, sin), apply_rope(seq, cos, sin)
        return float(rq[0, 0, m] @ rk[0, 0, n])

    assert score(10, 7) == pytest.approx(score(40, 37), rel=1e-4, abs=1e-5)
    assert score(10, 7) != pytest.approx(score(10, 2), rel=1e-3)
    # A rotation keeps norms.
    x = torch.randn(1, 2, 64, 16)
    torch.testing.assert_close(apply_rope(x, cos, sin).norm(dim=-1), x.norm(dim=-1))


def test_build_is_seeded_and_leaves_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    a = build_model("tiny", vocab_size=256, seq_len=16, seed=5)
    b = build_model("tiny", vocab_size=256, seq_len=16, seed=5)
    c = build_model("tiny", vocab_size=256, seq_len=16, seed=6)
    assert torch.equal(torch.random.get_rng_state(), state)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert not torch.equal(next(a.parameters()), next(c.parameters()))


def test_input_and_output_embeddings_are_tied(tiny: Llama) -> None:
    names = [name for name, _ in tiny.named_parameters()]
    assert sum("emb" in n for n in names) == 1  # one matrix serves both ends
    cfg = tiny.cfg
    per_layer = 4 * cfg.dim**2 + 3 * cfg.dim * cfg.ffn_dim + 2 * cfg.dim
    expected = cfg.vocab_size * cfg.dim + cfg.n_layers * per_layer + cfg.dim
    assert sum(p.numel() for p in tiny.parameters()) == expected


def test_longer_sequence_than_configured_is_refused(tiny: Llama) -> None:
    with pytest.raises(ValueError, match="max_seq_len"):
        tiny(torch.zeros(1, 33, dtype=torch.long))


@pytest.mark.parametrize(("spec", "target"), [("134m", 134e6), ("551m", 551e6)])
def test_paper_sizes_on_meta(spec: str, target: float) -> None:
    n = count_parameters(spec, vocab_size=32000, seq_len=1024)
    assert abs(n - target) / target < 0.02


def test_small_sizes() -> None:
    tiny = count_parameters("tiny", vocab_size=256, seq_len=128)
    small = count_parameters("small", vocab_size=256, seq_len=256)
    assert 0.2e6 < tiny < 1e6
    assert 2e6 < small < 10e6


@pytest.mark.parametrize(
    "kwargs",
    [
        {"dim": 130},  # not divisible by 4 heads
        {"dim": 12, "n_heads": 4},  # head dim 3 is odd
        {"n_layers": 0},
        {"rope_theta": float("nan")},
    ],
)
def test_invalid_configs_are_refused(kwargs: dict[str, float]) -> None:
    base = {
        "vocab_size": 256,
        "dim": 128,
        "n_layers": 2,
        "n_heads": 4,
        "ffn_dim": 256,
        "max_seq_len": 64,
    }
    with pytest.raises(ValueError):
        ModelConfig(**{**base, **kwargs})  # type: ignore[arg-type]


def test_all_named_configs_are_valid() -> None:
    assert set(MODEL_CONFIGS) >= {"tiny", "small", "134m", "551m"}


def test_factory_spec(repo_on_path: None) -> None:
    state = torch.random.get_rng_state()
    a = build_model(f"{FACTORY}:make", vocab_size=50, seq_len=8, seed=1)
    b = build_model(f"{FACTORY}:make", vocab_size=50, seq_len=8, seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(next(a.parameters()), next(b.parameters()))
    logits, loss = a(torch.zeros(2, 8, dtype=torch.long), torch.zeros(2, 8, dtype=torch.long))
    assert logits.shape == (2, 8, 50) and loss is not None
    assert count_parameters(f"{FACTORY}:make", vocab_size=50, seq_len=8) == 2500


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("huge", "unknown model 'huge'.*tiny, small, 134m, 551m"),
        ("no_such_module_xyz:make", "cannot import"),
        (f"{FACTORY}:missing", "no callable 'missing'"),
        (f"{FACTORY}:NOT_CALLABLE", "no callable"),
        (f"{FACTORY}:not_a_module", "returned dict, not a torch.nn.Module"),
        (":make", "unknown model"),
    ],
)
def test_bad_specs_name_the_problem(repo_on_path: None, spec: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_model(spec, vocab_size=256, seq_len=16, seed=0)
