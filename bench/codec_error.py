"""Codec bench: relative L2 error of one encoding, and encode / decode speed.

    .venv/bin/python bench/codec_error.py        # ≈ 1 min on one core (60 AdamW steps of `small`)

The table in :mod:`gaslocd.net.q4` comes from this script: the error of fp16, bf16, int8
and q4 (blocks of 32 and 64) on N(0, 0.02), on the ``small`` model's flat parameters at
init and after 60 AdamW steps on a repeated sentence (trained weights move off the init
distribution: norm gains leave 1.0, some rows grow), and the speed of each codec on the
trained vector with torch on one thread (the wire's setting, see gaslocd.net.threads).
The numbers are for this machine only; compare ratios, not absolute values.
"""

from __future__ import annotations

import time

import torch

from gaslocd.net.codecs import _Q4, Codec, get_codec, roundtrip
from gaslocd.train.model import build_model, model_loss


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).float()


def trained_small(steps: int = 60) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``small`` model's parameters at init and after ``steps`` AdamW steps."""
    model = build_model("small", vocab_size=256, seq_len=64, seed=0)
    init = _flat(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    data = torch.tensor(list(b"the quick brown fox jumps over the lazy dog. " * 2000))
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        starts = torch.randint(0, data.numel() - 65, (16,), generator=gen).tolist()
        x = torch.stack([data[s : s + 64] for s in starts])
        y = torch.stack([data[s + 1 : s + 65] for s in starts])
        loss = model_loss(model, x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return init, _flat(model)


def speed(codec: Codec, x: torch.Tensor, repeats: int = 7) -> tuple[float, float]:
    """Best-of encode and decode rates in M values per second."""
    data = torch.empty(codec.encoded_nbytes(x.numel()), dtype=torch.uint8)
    out = torch.empty_like(x)
    enc, dec = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        codec.encode_into(x, data)
        t1 = time.perf_counter()
        codec.decode(data, out)
        enc.append(t1 - t0)
        dec.append(time.perf_counter() - t1)
    return x.numel() / min(enc) / 1e6, x.numel() / min(dec) / 1e6


def main() -> None:
    torch.set_num_threads(1)
    codecs: dict[str, Codec] = {n: get_codec(n) for n in ("fp16", "bf16", "int8")}
    codecs |= {"q4/32": _Q4(32), "q4/64": _Q4(64)}
    init, trained = trained_small()
    gauss = torch.randn(4_000_000, generator=torch.Generator().manual_seed(1)) * 0.02
    print("relative L2 error of one encoding")
    print(f"{'data':<28}" + "".join(f"{n:>10}" for n in codecs))
    for label, x in (
        ("N(0, 0.02), 4M", gauss),
        (f"small init ({init.numel()})", init),
        ("small, 60 AdamW steps", trained),
    ):
        errs = [float((roundtrip(c, x) - x).norm() / x.norm()) for c in codecs.values()]
        print(f"{label:<28}" + "".join(f"{e:>10.3g}" for e in errs))
    per_value = [c.encoded_nbytes(1 << 20) / (1 << 20) for c in codecs.values()]
    print(f"{'bytes per value':<28}" + "".join(f"{b:>10.4g}" for b in per_value))
    print("\nspeed, one thread, M values/s (the trained vector)")
    for name in ("fp16", "int8", "q4/32", "q4/64"):
        enc, dec = speed(codecs[name], trained)
        print(f"{name:<8} encode {enc:7.0f}   decode {dec:7.0f}")


if __name__ == "__main__":
    main()
