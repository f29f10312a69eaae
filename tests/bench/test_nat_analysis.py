"""The NAT benchmark's arithmetic (bench/nat.py): who had a partner, per group."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import nat

from gaslocd.sim.schedule import worker_roster


def test_paired_shares_count_each_groups_rounds_with_a_partner() -> None:
    ids = worker_roster(nat.WORKERS)
    # Round 1: NATed 0 with reachable 5, NATed 1 alone; round 2: NATed 1 with reachable 6.
    rounds = [
        {"roster": ids, "edges": [[ids[0], ids[5]], [ids[6], ids[7]]]},
        {"roster": ids, "edges": [[ids[1], ids[6]]]},
    ]
    behind, reachable = nat.paired_shares({"rounds": rounds}, 2)
    assert behind == 2 / 4  # 2 of the 4 (worker, round) slots of workers 0 and 1
    assert reachable == 4 / 12  # 5, 6, 7 in round 1; 6 in round 2; of 6 workers × 2
    assert nat.paired_shares({"rounds": rounds}, 0) == (None, 6 / 16)
