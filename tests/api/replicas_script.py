"""A user's DDP script with a gaslocd Peer per node (run by tests/api/test_own_loop.py).

Usage: replicas_script.py OUT [BOOTSTRAP ...]. Under torchrun every rank runs it: rank 0 is
the peer, the others follow it; without torchrun it is a plain single-process peer. Each
rank saves its final parameters to OUT.rank<k>.pt, rank 0 (or the plain peer) its run
summary to OUT.json and its bootstrap address to OUT.address.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import gaslocd

out, *bootstrap = sys.argv[1:]
replicated = "RANK" in os.environ  # torchrun sets it
if replicated:
    dist.init_process_group("gloo")
rank = dist.get_rank() if replicated else 0
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 16))
peer = gaslocd.Peer(  # before DDP wraps the model: the Peer flattens its parameters
    model,
    run_id="replicas",
    port=0,
    bootstrap=bootstrap,
    min_peers=2,
    inner_steps=5,
    max_rounds=4,
    address_file=f"{out}.address",
    json=f"{out}.json",
    replica_group=dist.group.WORLD if replicated else None,
    progress=print,
)
trained = DistributedDataParallel(model) if replicated else model
optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-2)
data = torch.Generator().manual_seed(100 + len(bootstrap) * 10 + rank)  # a stream per rank
target = torch.randn(16, 16, generator=torch.Generator().manual_seed(7))
with peer:
    while True:
        x = torch.randn(32, 16, generator=data)
        loss = (trained(x) - x @ target).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if not peer.step(loss):
            break
torch.save(torch.cat([p.detach().flatten() for p in model.parameters()]), f"{out}.rank{rank}.pt")
if replicated:
    # Both ranks tear gloo down together: a rank that destroyed its group and exited while
    # the other was still in its teardown once aborted that one ("terminate called
    # without an active exception", exit -6) in a clean-clone run.
    dist.barrier()
    dist.destroy_process_group()
