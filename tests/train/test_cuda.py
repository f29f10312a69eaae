"""The CUDA paths of a worker. Skipped without a GPU (this project's CI machine has none);
bench/gpu_check.sh runs them, with the GPU benchmark, on a machine that has one."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from gaslocd.config import OuterConfig, TrainConfig
from gaslocd.train.data import Corpus
from gaslocd.train.worker import Worker

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (run bench/gpu_check.sh there)"
)


def _corpus() -> Corpus:
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, 64, (50_000,), generator=g).to(torch.uint8)
    return Corpus(train=text[:45_000], val=text[45_000:], vocab_size=256, source="random")


def _worker(index: int = 0, **overrides: object) -> Worker:
    cfg = TrainConfig(
        model="small", seq_len=64, batch_size=8, warmup_steps=0, eval_batches=1,
        device="auto", precision="auto", **overrides,
    )  # type: ignore[arg-type]  # fmt: skip
    return Worker(cfg, _corpus(), worker_index=index)


def test_auto_trains_on_the_gpu_in_bf16_and_hands_the_wire_host_tensors() -> None:
    worker = _worker()
    assert worker.device.type == "cuda" and worker.trainer.precision == "bf16"
    assert worker.flat.flat.is_cuda and worker.momentum.is_cuda
    before = worker.evaluate()
    assert all(math.isfinite(x) for x in worker.train(20))
    assert worker.evaluate() < before
    tilde = worker.tilde_on_host()
    assert tilde.device.type == "cpu" and tilde.dtype == torch.float32
    snap = worker.snapshot()
    assert snap.theta.device.type == "cpu" and snap.momentum.device.type == "cpu"


def test_the_outer_step_mixes_host_tensors_from_partners_on_the_gpu() -> None:
    a, b = _worker(0), _worker(1)
    a.train(5)
    b.train(5)
    received = {"b": b.tilde_on_host()}
    result = a.outer_update({"a": 0.5, "b": 0.5}, received, "a", OuterConfig())
    assert math.isfinite(result.consensus) and a.round == 1 and a.flat.flat.is_cuda


def test_fp16_loss_scaling_and_micro_batches_on_the_gpu() -> None:
    worker = _worker(precision="fp16", micro_batch=2)
    assert worker.trainer.scaler.is_enabled()
    assert all(math.isfinite(x) for x in worker.train(10))


def test_a_gpu_checkpoint_restores_on_the_cpu_and_back(tmp_path: Path) -> None:
    gpu = _worker()
    gpu.train(3)
    gpu.save(tmp_path, {})
    cpu = Worker(TrainConfig(model="small", seq_len=64, batch_size=8, eval_batches=1), _corpus(), 0)
    cpu.restore(tmp_path)
    torch.testing.assert_close(cpu.theta_start, gpu.theta_start.cpu())
    again = _worker()
    again.restore(tmp_path)
    assert again.theta_start.is_cuda
