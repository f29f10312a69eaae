"""Devices and precision, as far as a CPU-only machine can check them: the resolution
rules, bf16 and fp16 (with loss scaling) autocast over float32 master weights, gradient
accumulation that equals the whole batch. The CUDA paths are in tests/train/test_cuda.py,
skipped here (no GPU) and run by bench/gpu_check.sh on a machine that has one."""

from __future__ import annotations

import math

import pytest
import torch

from gaslocd.config import TrainConfig
from gaslocd.train.data import Corpus
from gaslocd.train.device import resolve_device, resolve_precision
from gaslocd.train.worker import Worker

CPU = torch.device("cpu")


def _corpus() -> Corpus:
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, 64, (20_000,), generator=g).to(torch.uint8)
    return Corpus(train=text[:18_000], val=text[18_000:], vocab_size=256, source="random")


def _worker(**overrides: object) -> Worker:
    cfg = TrainConfig(
        seq_len=32, batch_size=8, warmup_steps=0, eval_batches=1, inner_lr=3e-3, **overrides
    )  # type: ignore[arg-type]
    return Worker(cfg, _corpus(), worker_index=0)


def test_auto_takes_a_gpu_only_when_there_is_one() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_precision("auto", CPU) == "fp32"
    with pytest.raises(ValueError, match="auto, cpu, cuda or cuda:N"):
        resolve_device("tpu0")
    with pytest.raises(ValueError, match="only cpu and cuda"):
        resolve_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no usable CUDA device"):
            resolve_device("cuda:0")


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_trains_over_float32_master_weights(precision: str) -> None:
    worker = _worker(precision=precision)
    assert worker.trainer.precision == precision
    assert worker.trainer.scaler.is_enabled() == (precision == "fp16")
    first = worker.evaluate()
    losses = worker.train(30)
    assert len(losses) == 30 and all(math.isfinite(x) for x in losses)
    assert worker.evaluate() < first - 0.3
    assert worker.flat.flat.dtype == torch.float32  # what peers exchange and mix
    assert all(p.dtype == torch.float32 for p in worker.trainer.model.parameters())


def test_micro_batches_accumulate_to_the_whole_batchs_gradient() -> None:
    whole, split = _worker(), _worker(micro_batch=2)
    assert torch.equal(whole.flat.flat, split.flat.flat)
    x, y = whole.trainer.sampler.next_batch()
    losses = [w.trainer._forward_backward(x, y) for w in (whole, split)]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)  # the same mean loss
    for a, b in zip(whole.trainer._params, split.trainer._params, strict=True):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-7)


def test_a_micro_batch_that_does_not_divide_the_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="must divide the batch size"):
        TrainConfig(batch_size=8, micro_batch=3)
