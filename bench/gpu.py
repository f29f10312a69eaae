"""GPU bench: the daemon's inner loop against a bare PyTorch loop on the same GPU.

    python bench/gpu.py                    # small and 134m, bf16, 30 timed steps each
    python bench/gpu.py --models 551m --micro-batch 4

Both loops train the same model (gaslocd's built-in Llama) with AdamW on random tokens in
the same precision; the bare loop is what a user would write in twenty lines (autocast,
fused AdamW, no clipping checks, no flat parameter vector). The ratio gaslocd / bare of
tokens per second is the number that matters: the target is ≥ 0.95. Also recorded: peak
GPU memory of each. Ratios compare runs of this one invocation only. Writes a table to
stdout and bench/results/gpu.md (with the command, machine and date) and gpu.png, or to
--out.

Never run in CI (no GPU there); bench/gpu_check.sh runs it with the CUDA tests.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gaslocd.config import TrainConfig  # noqa: E402
from gaslocd.train.data import Corpus  # noqa: E402
from gaslocd.train.device import autocast  # noqa: E402
from gaslocd.train.model import build_model, model_loss  # noqa: E402
from gaslocd.train.worker import Worker  # noqa: E402


def _corpus(vocab: int) -> Corpus:
    tokens = torch.randint(0, vocab, (4_000_000,), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(torch.int32)
    return Corpus(train=tokens[:3_900_000], val=tokens[3_900_000:], vocab_size=vocab, source="r")


def _timed(step: object, warmup: int, steps: int) -> float:
    for _ in range(warmup):
        step()  # type: ignore[operator]
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(steps):
        step()  # type: ignore[operator]
    torch.cuda.synchronize()
    return (time.perf_counter() - began) / steps


def bench_model(name: str, args: argparse.Namespace) -> dict[str, float]:
    cfg = TrainConfig(
        model=name, seq_len=args.seq_len, batch_size=args.batch_size, warmup_steps=0,
        eval_batches=1, device="cuda", precision=args.precision,
        micro_batch=args.micro_batch, compile=args.compile,
    )  # fmt: skip
    vocab = 32000 if name in ("134m", "551m") else 256
    corpus = _corpus(vocab)
    out: dict[str, float] = {}
    torch.cuda.reset_peak_memory_stats()
    worker = Worker(cfg, corpus, worker_index=0)
    out["gaslocd_s"] = _timed(functools.partial(worker.train, 1), args.warmup, args.steps)
    out["gaslocd_mem_gb"] = torch.cuda.max_memory_allocated() / 2**30
    del worker
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = build_model(name, vocab_size=vocab, seq_len=args.seq_len, seed=0, device="cuda")
    model = torch.compile(model) if args.compile else model  # type: ignore[assignment]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    device = torch.device("cuda")
    data = corpus.train.to(device)

    def bare() -> None:
        starts = torch.randint(0, len(data) - args.seq_len - 1, (args.batch_size,), device=device)
        rows = torch.stack([data[s : s + args.seq_len + 1] for s in starts.tolist()]).long()
        with autocast(device, args.precision):
            loss = model_loss(model, rows[:, :-1], rows[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    out["bare_s"] = _timed(bare, args.warmup, args.steps)
    out["bare_mem_gb"] = torch.cuda.max_memory_allocated() / 2**30
    tokens = args.batch_size * args.seq_len
    out["gaslocd_tok_s"] = tokens / out["gaslocd_s"]
    out["bare_tok_s"] = tokens / out["bare_s"]
    out["ratio"] = out["gaslocd_tok_s"] / out["bare_tok_s"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["small", "134m"])
    parser.add_argument("--precision", default="bf16", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=0)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench/gpu.py needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = {name: bench_model(name, args) for name in args.models}
    header = "| model | gaslocd tok/s | bare tok/s | ratio | gaslocd peak GB | bare peak GB |"
    lines = [header, "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['gaslocd_tok_s']:,.0f} | {r['bare_tok_s']:,.0f} | "
            f"{r['ratio']:.3f} | {r['gaslocd_mem_gb']:.2f} | {r['bare_mem_gb']:.2f} |"
        )
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, {platform.node()}"
    (args.out / "gpu.md").write_text(
        f"# The daemon's inner loop against a bare loop (GPU)\n\n"
        f"- command: `python {' '.join(sys.argv)}`\n- machine: {machine}\n- date: {stamp}\n"
        f"- precision {args.precision}, seq {args.seq_len}, batch {args.batch_size}, "
        f"micro-batch {args.micro_batch or 'none'}, compile {args.compile}\n\n{table}\n"
    )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3))
        ax.bar(list(rows), [r["ratio"] for r in rows.values()])
        ax.axhline(0.95, linestyle="--", color="grey")
        ax.set_ylabel("gaslocd / bare tokens per s")
        fig.tight_layout()
        fig.savefig(args.out / "gpu.png", dpi=120)
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
