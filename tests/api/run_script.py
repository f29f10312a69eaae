"""A user's script that gives the main thread to gaslocd: ``Peer.run(train)`` (run by
tests/api/test_peer_run.py).

Usage: run_script.py MODE CHECKPOINT_DIR, MODE ``loop`` (train until stopped) or ``raise``
(the user's loop raises at its 10th step). Exits with ``Peer.run``'s status.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

import gaslocd

mode, checkpoints = sys.argv[1:]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
peer = gaslocd.Peer(
    model,
    optimizer,
    run_id="peer-run",
    port=0,
    inner_steps=4,
    checkpoint_dir=checkpoints,
    progress=lambda line: print(line, flush=True),
)


def train(peer: gaslocd.Peer) -> None:
    steps = 0
    while True:
        x = torch.randn(32, 8)
        loss = (model(x) - x[:, :1]).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
        if mode == "raise" and steps == 10:
            raise RuntimeError("a bug in the user's loop")
        if not peer.step(loss):
            return


status = peer.run(train)
print(f"peer.run returned {status} at round {peer.round}", flush=True)
sys.exit(status)
