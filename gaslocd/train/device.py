"""Which accelerator a worker trains on, and in which precision.

``--device auto`` takes the first visible CUDA device (``CUDA_VISIBLE_DEVICES`` decides
which ones are visible) and falls back to the CPU; ``--precision auto`` is bf16 on a GPU
that supports it and fp32 elsewhere. Master weights, θ, the outer momentum and the
mixing stay float32 whatever the precision: autocast lowers only the inner steps' matmuls,
and the vector peers exchange is always the float32 θ (the codec decides what crosses the
wire). A setting that cannot work here is one clear ``ValueError``, before any training.
"""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(spec: str) -> torch.device:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` → a device that exists on this machine."""
    if spec == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {spec!r}") from exc
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f"--device {spec!r}: only cpu and cuda devices are supported")
    if not torch.cuda.is_available():
        raise ValueError(
            f"--device {spec}: this torch has no usable CUDA device "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}); "
            "install a CUDA build of torch, or use --device cpu"
        )
    index = 0 if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise ValueError(
            f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) are visible "
            "(CUDA_VISIBLE_DEVICES renumbers them from 0)"
        )
    return torch.device("cuda", index)


def resolve_precision(spec: str, device: torch.device) -> str:
    """``auto`` → bf16 on a GPU with bf16 support, else fp32; others checked for ``device``."""
    if spec not in PRECISIONS:
        raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}, got {spec!r}")
    if spec == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return "bf16"
        return "fp32"
    if spec == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(
            f"--precision bf16: {torch.cuda.get_device_name(device)} has no bf16 support; "
            "use --precision fp16 (with loss scaling) or fp32"
        )
    return spec


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[None]:
    """The inner step's autocast region (nothing for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=_DTYPES[precision])


def on_host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the CPU (itself when it is already there): what the wire encodes."""
    return tensor if tensor.device.type == "cpu" else tensor.to("cpu")
