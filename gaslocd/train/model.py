"""A Llama-style decoder and the named model sizes, plus user-supplied model factories.

The block is the Llama recipe: RMSNorm → causal multi-head attention with rotary position
embeddings (RoPE) → residual, RMSNorm → SwiGLU MLP → residual; a final RMSNorm; the output
projection is the token embedding itself (tied), which saves ``vocab × dim`` parameters
(Llama-3.2's small models tie theirs too).

Sizes (``MODEL_CONFIGS``; parameter counts with tied embeddings):

- ``tiny``  — dim 96, 2 layers, 4 heads, ffn 256, byte vocab: ≈0.25M; ~65 ms per AdamW
  step on 16 × 128 tokens on one core of the 2-core dev machine. Sized for speed: one core
  does ~70 GFLOP/s in float32 and a step costs ≈ 6 × params × tokens, so the 0.84M of
  dim 128 × 4 layers took ~180 ms and 2 such layers (0.43M) ~100 ms.
- ``small`` — dim 256, 6 layers, 4 heads, ffn 704, byte vocab: ≈4.8M.
- ``134m``  — dim 768, 12 layers, 12 heads (head dim 64), ffn 2944, vocab 32000: 134.3M.
- ``551m``  — dim 1536, 18 layers, 12 heads (head dim 128), ffn 3968, vocab 32000: 548.2M.

Only the totals (134M, 551M) are known to us, not the paper's exact shapes. ``134m`` takes
GPT-2-small's width and depth, ``551m`` width 1536 with 128-wide heads, both with the
Llama-2 tokenizer's 32000 tokens; the SwiGLU width was then solved for so the count lands
within 0.5% of the paper's figure, rounded to a multiple of 128 (hardware-friendly).
``build_model`` always uses the ``vocab_size`` the data layer reports, so ``134m`` on byte
data is smaller than 134M.

Initialisation draws from a local ``torch.Generator`` on CPU (then moves to the device), so
building a model never touches the global RNG and a seed gives the same weights on every
machine and device. The linear and embedding layers skip torch's own init for that reason.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a :class:`Llama`; validated on construction."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    ffn_dim: int
    max_seq_len: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "ffn_dim", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"model {name} must be an integer >= 1, got {value!r}")
        if self.dim % self.n_heads:
            raise ValueError(f"model dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head dim {self.head_dim} must be even: RoPE rotates pairs")
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise ValueError(f"rope_theta must be a finite number > 0, got {self.rope_theta!r}")
        if not (math.isfinite(self.norm_eps) and self.norm_eps > 0):
            raise ValueError(f"norm_eps must be a finite number > 0, got {self.norm_eps!r}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


MODEL_CONFIGS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        vocab_size=256, dim=96, n_layers=2, n_heads=4, ffn_dim=256, max_seq_len=128
    ),
    "small": ModelConfig(
        vocab_size=256, dim=256, n_layers=6, n_heads=4, ffn_dim=704, max_seq_len=256
    ),
    "134m": ModelConfig(
        vocab_size=32000, dim=768, n_layers=12, n_heads=12, ffn_dim=2944, max_seq_len=1024
    ),
    "551m": ModelConfig(
        vocab_size=32000, dim=1536, n_layers=18, n_heads=12, ffn_dim=3968, max_seq_len=1024
    ),
}


class _Linear(nn.Linear):
    """``nn.Linear`` that skips its own init: :meth:`Llama.init_weights` fills it.

    The stock init draws from the global RNG (which building a model must not touch) and
    would be a wasted pass over every weight of the large configs.
    """

    def reset_parameters(self) -> None:
        pass


class _Embedding(nn.Embedding):
    """``nn.Embedding`` that skips its own init, for the same reasons as :class:`_Linear`."""

    def reset_parameters(self) -> None:
        pass


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain (no mean subtraction, no bias)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 even if activations are lower precision: the mean of squares
        # is where half precision loses the most.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


def rope_tables(
    head_dim: int, max_seq_len: int, theta: float, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotation angles, each (max_seq_len, head_dim // 2), in float32.

    Computed in float64: angles reach max_seq_len radians, where float32 loses digits.
    """
    arange = torch.arange(0, head_dim, 2, dtype=torch.float64, device=device)
    inv_freq = 1.0 / theta ** (arange / head_dim)
    positions = torch.arange(max_seq_len, dtype=torch.float64, device=device)
    angles = torch.outer(positions, inv_freq)  # (max_seq_len, head_dim // 2)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (first-half, second-half) pair of ``x`` (B, H, T, D) by its position's angle.

    The "rotate half" layout (as in the Hugging Face Llama port) rather than interleaved
    pairs: the two are the same rotation up to a fixed permutation of the head dimension,
    and halves need no strided views. Because a rotation by mθ then by −nθ is a rotation
    by (m−n)θ, the dot product of a rotated query and key depends only on their distance.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]  # (B, H, T, D/2) each
    cos = cos[: x.shape[-2]]  # (T, D/2), broadcast over B and H
    sin = sin[: x.shape[-2]]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).type_as(x)


class Attention(nn.Module):
    """Causal multi-head self-attention with RoPE on queries and keys."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.head_dim
        self.wqkv = _Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.wo = _Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.wqkv(x).split(C, dim=-1)  # (B, T, C) each
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        return self.wo(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)


class SwiGLU(nn.Module):
    """The gated MLP: w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = _Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w3 = _Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w2 = _Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # (B, T, C)


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)  # (B, T, C)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """The decoder. ``forward(tokens, targets)`` → (logits (B, T, V), mean CE loss or None).

    Weights are drawn from a local generator seeded with ``seed``, never the global RNG.
    Built on the meta device (to count parameters) nothing is drawn.
    """

    def __init__(self, cfg: ModelConfig, *, seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = _Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        device = self.tok_emb.weight.device
        # On meta (counting parameters) compute on CPU and keep only the shapes: arange on
        # meta pulls in torch._dynamo, a one-off cost of over a second.
        cos, sin = rope_tables(
            cfg.head_dim,
            cfg.max_seq_len,
            cfg.rope_theta,
            "cpu" if device.type == "meta" else device,
        )
        cos, sin = cos.to(device), sin.to(device)
        # Not persistent: derived from the config, so they are neither checkpointed nor
        # part of the flat parameter vector that crosses the wire.
        self.rope_cos: torch.Tensor
        self.rope_sin: torch.Tensor
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if device.type != "meta":
            self.init_weights(torch.Generator(device=device).manual_seed(seed))

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        """GPT-2/Llama init: N(0, 0.02), residual outputs scaled by 1/√(2·n_layers), gains 1.

        The scaled residual projections keep the residual stream's variance from growing
        with depth at init. Draws only from ``generator`` (which must live on the same
        device as the parameters; :func:`build_model` initialises on CPU, so a seed gives
        the same weights whatever the device).
        """
        std = 0.02
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(("wo.weight", "w2.weight")):
                p.normal_(0.0, std / math.sqrt(2 * self.cfg.n_layers), generator=generator)
            else:
                p.normal_(0.0, std, generator=generator)

    def forward(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T = tokens.shape
        limit = self.cfg.max_seq_len
        if tokens.shape[1] > limit:
            raise ValueError(f"sequence of {T} tokens exceeds max_seq_len {limit}")
        x = self.tok_emb(tokens)  # (B, T, C)
        for block in self.blocks:
            x = block(x, self.rope_cos, self.rope_sin)
        x = self.norm(x)
        logits = F.linear(x, self.tok_emb.weight).float()  # (B, T, V), tied output projection
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))
        return logits, loss


_FORMS = "'package.module:function' or 'path/to/file.py:function'"


def _known() -> str:
    return ", ".join(MODEL_CONFIGS)


def model_config(spec: str, *, vocab_size: int, seq_len: int) -> ModelConfig:
    """The named config with the data's vocabulary and the run's sequence length."""
    if spec not in MODEL_CONFIGS:
        raise ValueError(f"unknown model {spec!r}: use one of {_known()} or a factory {_FORMS}")
    return replace(MODEL_CONFIGS[spec], vocab_size=vocab_size, max_seq_len=seq_len)


def _import_module(module_name: str) -> Any:
    """A factory's module: by import name (the current directory included, as ``python``
    itself would), or from a ``.py`` file path."""
    if module_name.endswith(".py"):
        path = Path(module_name).expanduser().resolve()
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {path}")
        name = f"gaslocd_factory_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
        if name in sys.modules:
            return sys.modules[name]
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ImportError(f"cannot load {path} as a module")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module
        try:
            loader_spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name.split(".")[0] or os.getcwd() in sys.path:
            raise
        sys.path.insert(0, os.getcwd())  # `python -m gaslocd` does this; the script does not
        return importlib.import_module(module_name)


def _factory(spec: str) -> Callable[..., object]:
    """Import ``package.module:function`` or ``path/to/file.py:function``; every failure
    becomes a readable ValueError."""
    module_name, _, fn_name = spec.rpartition(":")
    if not module_name or not fn_name:
        raise ValueError(f"unknown model {spec!r}: use one of {_known()} or a factory {_FORMS}")
    try:
        module = _import_module(module_name)
    except Exception as exc:  # any import-time failure of user code, not only ImportError
        raise ValueError(f"model factory {spec!r}: cannot import {module_name!r}: {exc}") from exc
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ValueError(f"model factory {spec!r}: {module_name!r} has no callable {fn_name!r}")
    return fn


def _takes_labels(model: nn.Module) -> bool:
    """Whether ``model`` has the Hugging Face forward, ``forward(input_ids, labels=...)``."""
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper takes (*args)
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    return "input_ids" in params and "labels" in params


def model_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean next-token loss of ``model`` on inputs ``x`` and targets ``y`` (B, T).

    Two forward contracts are accepted: ours, ``forward(tokens, targets)`` returning
    ``(logits, loss)``, and the Hugging Face one, ``forward(input_ids=..., labels=...)``
    returning an output with ``.loss``. A Hugging Face model shifts the labels itself,
    so it gets ``labels=x``: the same next-token targets, less the window's last one.
    """
    if _takes_labels(model):
        out = model(input_ids=x, labels=x)
        loss = out["loss"] if isinstance(out, Mapping) else getattr(out, "loss", None)
    else:
        out = model(x, y)
        loss = out[1] if isinstance(out, tuple) and len(out) == 2 else getattr(out, "loss", None)
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            f"{type(model).__name__} returned no loss: a model must return (logits, loss) "
            "from forward(tokens, targets), or an output with .loss from "
            "forward(input_ids=..., labels=...)"
        )
    return loss


def _call_factory(spec: str, vocab_size: int, seq_len: int) -> nn.Module:
    model = _factory(spec)(vocab_size=vocab_size, seq_len=seq_len)
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"model factory {spec!r} returned {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def build_model(
    spec: str, *, vocab_size: int, seq_len: int, seed: int, device: str | torch.device = "cpu"
) -> nn.Module:
    """Build a seeded model: a name in ``MODEL_CONFIGS`` or ``package.module:function``.

    A factory is called as ``function(vocab_size=..., seq_len=...)`` and must return an
    ``nn.Module`` whose forward follows :meth:`Llama.forward`. Factories initialise through
    the global RNG like any torch module, so they run inside ``fork_rng`` seeded with
    ``seed``: the weights are reproducible and the caller's RNG state is left untouched.
    """
    if ":" in spec:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = _call_factory(spec, vocab_size, seq_len)
        return model.to(device)
    cfg = model_config(spec, vocab_size=vocab_size, seq_len=seq_len)
    llama = Llama(cfg, seed=seed)  # on CPU: the same weights for a seed on every device
    log.debug("built %s: %s, %d parameters", spec, cfg, sum(p.numel() for p in llama.parameters()))
    return llama.to(device)


def count_parameters(spec: str, *, vocab_size: int, seq_len: int) -> int:
    """Number of unique parameters (tied ones once), built on the meta device: no memory."""
    with torch.device("meta"):
        if ":" in spec:
            model = _call_factory(spec, vocab_size, seq_len)
        else:
            model = Llama(model_config(spec, vocab_size=vocab_size, seq_len=seq_len))
    return sum(p.numel() for p in model.parameters())
