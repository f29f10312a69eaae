"""A proposed variant of DESIGN §1's H rule, tried in the bench only (not in gaslocd).

DESIGN's rule gives worker i the *duration* T − transfer_i,t of compute, as if every
worker started round t at the same moment. Under a straggler that is not true: a worker
that just finished a slow exchange starts late, and its next partner, starting on time,
computes its H_base steps and then idles until the late one arrives; the lateness hops
from partner to partner. The variant aims every worker at a shared *deadline* instead:

    D_t    = median_j(start_j,t) + T                  (the network's schedule; medians as T)
    ready  = max(D_t − transfer_i,t, start_i + H_min s_i, start_p + H_min s_p)
    H_i,t  = clamp(floor((ready − start_i) / s_i), H_min, H_max)      for this round's partner p

so a late worker takes fewer steps to catch up, and a worker whose partner cannot be ready
in time fills the wait with steps (up to H_max) instead of idling. The inputs are what a
daemon knows at a round's start (its partner's round start and step time from the DHT
records, its own link estimates); nothing here is measured after the fact. It is written
for ``1peer`` (one partner: the rule is symmetric, so a pair agrees on ``ready``).
"""

from __future__ import annotations

import math
import statistics

from gaslocd.algorithm.hpolicy import target_round_time
from gaslocd.algorithm.topology import RoundPlan
from gaslocd.sim.runner import Simulation


class DeadlineSimulation(Simulation):
    """:class:`Simulation` with the deadline H rule above in place of DESIGN §1's."""

    def _inner_steps(self, plan: RoundPlan, step_times: list[float]) -> list[int]:
        if not self.algo.adapt_h:
            return super()._inner_steps(plan, step_times)
        if self.algo.topology != "1peer":
            raise ValueError("the deadline H rule is written for the 1peer topology")
        expected, typical = self._transfer_estimates(plan)
        target = target_round_time(self.algo.inner_steps, step_times, typical)
        start = self.clock.now_s
        deadline = statistics.median(start) + target
        h_min, h_max = self.algo.h_min, self.algo.h_upper
        earliest = [t + h_min * s for t, s in zip(start, step_times, strict=True)]
        index = {p: k for k, p in enumerate(self.roster)}
        steps = []
        for k, peer in enumerate(self.roster):
            ready = max([deadline - expected[k], earliest[k]])
            ready = max([ready, *(earliest[index[q]] for q in plan.partners_of(peer))])
            h = math.floor((ready - start[k]) / step_times[k] + 1e-9)
            steps.append(max(h_min, min(h_max, h)))
        return steps
