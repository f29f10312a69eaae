"""A real ``gaslocd`` daemon that is an insider: it holds the run's token and, every
round, offers its partners θ̃ + 0.9 · ‖θ̃‖ · u (u one fixed random unit direction)
instead of its θ̃: at 0.9 of the norm bound, so the wire lets it through.

Usage (tests only): ``python tests/security/insider_daemon.py <gaslocd arguments>``.
Everything else (DHT record, pairing, Ready, the wire) is the real daemon's.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gaslocd.cli import main
from gaslocd.net.server import ExchangeServer

FRACTION = 0.9
_direction: list[torch.Tensor] = []
_honest_open_round = ExchangeServer.open_round


async def _poisoned_open_round(
    self: ExchangeServer, round_: int, theta_tilde: torch.Tensor, *args: Any, **kwargs: Any
) -> None:
    if not _direction:
        gen = torch.Generator().manual_seed(1234)
        u = torch.randn(theta_tilde.numel(), generator=gen)
        _direction.append(u / u.norm())
    poison = theta_tilde + _direction[0] * (FRACTION * float(theta_tilde.norm()))
    await _honest_open_round(self, round_, poison, *args, **kwargs)


ExchangeServer.open_round = _poisoned_open_round  # type: ignore[method-assign]

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
