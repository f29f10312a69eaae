"""Overlap: round t's θ̃ is on the wire while round t+1 trains; its outer step lands late.

Three things must hold: the delayed outer step is the same outer step (only the local
progress made meanwhile rides on top of it), a round then costs max(compute, transfer)
on the clock instead of their sum, and the time account still adds up.
"""

from __future__ import annotations

import pytest
import torch

from gaslocd.config import AlgoConfig, OuterConfig, SimConfig, Straggler, TrainConfig, WireConfig
from gaslocd.protocol.policy import RoundPolicy
from gaslocd.sim.clock import landing_step
from gaslocd.sim.runner import Simulation
from gaslocd.sim.schedule import Schedule
from gaslocd.sim.summary import simulation_summary
from gaslocd.train.data import Corpus
from gaslocd.train.worker import Worker

MB = 1_000_000
TRAIN = TrainConfig(seq_len=32, batch_size=4, warmup_steps=0, eval_batches=1, inner_lr=3e-3)


def _corpus() -> Corpus:
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, 64, (20_000,), generator=g).to(torch.uint8)
    return Corpus(train=text[:18_000], val=text[18_000:], vocab_size=256, source="random")


def test_the_completed_eager_step_is_the_outer_step_plus_the_progress_made_meanwhile() -> None:
    corpus, cfg = _corpus(), OuterConfig(lr=0.7, momentum=0.9)
    plain, late = Worker(TRAIN, corpus, 0), Worker(TRAIN, corpus, 0)
    partner = plain.flat.flat.clone().add_(0.01)
    row = {"me": 0.5, "p": 0.5}
    for w in (plain, late):
        w.begin_round()
        w.train(2)
    assert torch.equal(plain.flat.flat, late.flat.flat)  # same seed, same steps
    tilde = plain.flat.flat.clone()
    plain.outer_update(row, {"p": partner}, "me", cfg)

    held = late.hold_tilde(cfg).clone()
    assert torch.equal(held, tilde) and late.round == 1 and late.pending is not None
    eager = late.flat.flat.clone()  # the outer step on our own θ̃ alone
    assert not torch.equal(eager, held)
    late.begin_round()  # overlap: training goes on from the eager point
    assert torch.equal(late.flat.flat, eager)
    late.train(1)
    progress = late.flat.flat - eager
    late.outer_update(row, {"p": partner}, "me", cfg)

    assert late.round == 1 and late.pending is None
    torch.testing.assert_close(late.theta_start, plain.theta_start)
    torch.testing.assert_close(late.momentum, plain.momentum)
    torch.testing.assert_close(late.flat.flat, plain.theta_start + progress)


def test_a_stop_with_an_exchange_in_flight_keeps_the_steps_already_trained(tmp_path) -> None:
    w = Worker(TRAIN, _corpus(), 0)
    w.begin_round()
    w.train(2)
    w.hold_tilde(OuterConfig())
    held = w.theta_start.clone()  # the eager step's θ: the round's steps are in it
    w.save(tmp_path, {})
    back = Worker(TRAIN, _corpus(), 0)
    back.restore(tmp_path)
    assert back.round == 1 and back.pending is None
    torch.testing.assert_close(back.theta_start, held)


def _schedule(overlap: bool, stragglers: tuple[Straggler, ...] = ()) -> Schedule:
    # 10 steps × 0.5 s = 5 s of compute; 20 MB at 100 Mbit/s = 1.6 s per exchange.
    sim = SimConfig(
        workers=4,
        rounds=1,
        bandwidth_mbps=100,
        latency_ms=5,
        step_time_s=0.5,
        message_bytes=20 * MB,
        stragglers=stragglers,
    )
    algo = AlgoConfig(topology="1peer", inner_steps=10, adapt_h=True, overlap=overlap)
    return Schedule(algo, sim, "run-a", 20 * MB, [0.5] * 4, "fingerprint")


def _run(schedule: Schedule, rounds: int) -> None:
    for t in range(rounds):
        state = schedule.begin(t)
        schedule.exchange(state, lambda _r, _a, _b: True)
        schedule.settle(state)
    schedule.drain()


def test_overlapped_rounds_cost_the_compute_not_compute_plus_transfer() -> None:
    rounds = 8
    plain, overlapped = _schedule(False), _schedule(True)
    _run(plain, rounds)
    _run(overlapped, rounds)
    # Without overlap adaptive H trades steps for the transfer: rounds of compute +
    # transfer. With it a round is its 5 s of compute; only the last transfer shows.
    assert overlapped.clock.wall_clock_s == pytest.approx(rounds * 5.0 + 1.605, rel=0.02)
    assert min(overlapped.clock.compute_fraction_per_worker()) > 0.95
    assert max(plain.clock.compute_fraction_per_worker()) < 0.8
    for account, now in zip(overlapped.clock.accounts, overlapped.clock.now_s, strict=True):
        assert account.total() == pytest.approx(now)  # the categories add up to the clock


def test_a_transfer_longer_than_the_compute_is_filled_with_steps_not_waited_for() -> None:
    # Worker 0's link at 20 %: its exchanges take 8 s against 5 s of compute.
    schedule = _schedule(True, (Straggler(0, 0.2),))
    _run(schedule, 12)
    shares = schedule.clock.compute_fraction_per_worker()
    assert min(shares) > 0.9, shares  # its partners fill the wait with real steps
    filled = schedule.clock.total().seconds["fill"]
    assert filled > 0


def test_the_overlap_fill_stops_when_the_exchange_is_done_or_at_its_deadline() -> None:
    policy = RoundPolicy("me", record_ttl_s=15.0, h_upper=40)
    assert policy.fill_overlap(False, 10, until=100.0) is None  # nothing in flight
    assert policy.fill_overlap(True, 40, until=100.0) is None  # H_max reached
    fill = policy.fill_overlap(True, 10, until=100.0)
    assert fill is not None and fill.room == 30
    assert not fill.done(50.0, partners_ready=False)
    assert fill.done(50.0, partners_ready=True) and fill.done(100.0, partners_ready=False)


def test_overlap_refuses_the_all_reduce_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="overlap"):
        AlgoConfig(algo="diloco", topology="complete", overlap=True)


def test_an_overlapped_simulation_trains_and_lands_its_last_step(corpus: Corpus) -> None:
    sim = SimConfig(workers=4, rounds=4, step_time_s=0.1, bandwidth_mbps=20, eval_every=4)
    algo = AlgoConfig(topology="1peer", inner_steps=3, overlap=True)
    simulation = Simulation(algo, TRAIN, sim, corpus=corpus)
    result = simulation.run()
    assert all(w.pending is None and w.round == 4 for w in simulation.workers)
    assert result.final_val_loss < result.initial_val_loss


def test_the_delayed_outer_step_lands_at_the_first_step_after_its_exchange() -> None:
    assert landing_step(4.0, 5.0, 0.5, 10) == 0  # over before the round: before step one
    assert landing_step(6.0, 5.0, 0.5, 10) == 2  # at a step boundary: after that step
    assert landing_step(6.1, 5.0, 0.5, 10) == 3  # during the third step: after it
    assert landing_step(60.0, 5.0, 0.5, 10) == 10  # still on the wire: after them all
    assert landing_step(6.0, 5.0, 0.5, 0) == 0


def test_steps_after_the_landing_train_from_the_corrected_point(
    corpus: Corpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 10 steps of 0.5 s; 1 MB at 8 Mbit/s + 10 ms: each exchange lands after 3 steps of
    # the next round, not after all 10 (where a late landing would put it).
    sim = SimConfig(
        workers=4, rounds=4, step_time_s=0.5, bandwidth_mbps=8, latency_ms=10,
        message_bytes=MB, eval_every=4,
    )  # fmt: skip
    algo = AlgoConfig(topology="1peer", inner_steps=10, overlap=True)
    simulation = Simulation(algo, TRAIN, sim, corpus=corpus)
    at_landing: list[int] = []
    outer_update = Worker.outer_update

    def recording(self: Worker, *args: object, **kwargs: object) -> object:
        at_landing.append(self.trainer.steps_done)
        return outer_update(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Worker, "outer_update", recording)
    simulation.run()
    # Rounds 1-3 land during rounds 2-4, after 3 of their steps; round 4 at the end.
    assert sorted(at_landing) == sorted([10 * t + 3 for t in (1, 2, 3)] * 4 + [40] * 4)


def test_a_long_exchange_mixes_both_ends_late_and_keeps_their_sum() -> None:
    corpus = _corpus()
    a, b = Worker(TRAIN, corpus, 0), Worker(TRAIN, corpus, 1)
    for w in (a, b):
        w.begin_round()
        w.train(2)
    cfg = OuterConfig()
    tilde = {"a": a.hold_tilde(cfg).clone(), "b": b.hold_tilde(cfg).clone()}
    for w in (a, b):
        w.keep_for_long(0)
    for w, me in ((a, "a"), (b, "b")):  # round 0 lands without the long partner
        w.outer_update({me: 1.0}, {}, me, cfg)
        w.begin_round()
        w.train(1)
    before = a.theta_start + b.theta_start, a.flat.flat - a.theta_start
    assert a.apply_pair_mix(0, 0.5, tilde["b"]) and b.apply_pair_mix(0, 0.5, tilde["a"])
    torch.testing.assert_close(a.theta_start + b.theta_start, before[0])  # the mean stays
    torch.testing.assert_close(a.flat.flat - a.theta_start, before[1])  # progress rides on
    assert not a.long_own and not a.apply_pair_mix(0, 0.5, tilde["b"])  # once only
    b.keep_for_long(1)
    assert not b.apply_pair_mix(1, 0.5, None) and not b.long_own  # failed: dropped


def test_a_straggler_whose_link_needs_rounds_sits_out_and_nobody_waits(corpus: Corpus) -> None:
    # fp16 25 MB at 0.5 MB/s is 50 s against 10 × 0.5 s rounds: q4 needs 3 rounds.
    sim = SimConfig(
        workers=4,
        rounds=8,
        step_time_s=0.5,
        bandwidth_mbps=400,
        codec="fp16",
        message_bytes=25 * MB,
        stragglers=(Straggler(0, 0.01),),
        eval_every=8,
    )
    algo = AlgoConfig(
        topology="1peer", inner_steps=10, adapt_h=True, overlap=True, adapt_codec=True
    )
    simulation = Simulation(algo, TRAIN, sim, corpus=corpus)
    result = simulation.run()
    schedule = simulation.schedule
    assert schedule.sit[0].periodic and not any(s.periodic for s in schedule.sit[1:])
    assert min(result.compute_fraction_per_worker[1:]) > 0.95
    assert result.final_val_loss < result.initial_val_loss
    rows = [r.mixing_matrix for r in result.records]
    assert sum(m[0][0] == 1.0 for m in rows) >= 3  # rounds it sat out (or mixed late)
    for matrix in rows:  # W doubly stochastic every round, the sitting-out row e_0
        for line in (*matrix, *zip(*matrix, strict=True)):
            assert sum(line) == pytest.approx(1.0)


def test_overlapped_peers_train_while_pacing_on_a_slow_gpu() -> None:
    # Worker 3 steps 3× slower and may not take fewer than 10 steps: it falls behind, and
    # the others are paced (held to a round's lead). Overlapped, they train meanwhile.
    shares = {}
    for overlap in (False, True):
        sim = SimConfig(
            workers=4, rounds=1, bandwidth_mbps=100, latency_ms=5, step_time_s=0.5,
            message_bytes=2 * MB,
        )  # fmt: skip
        algo = AlgoConfig(topology="1peer", inner_steps=10, adapt_h=True, h_min=10, overlap=overlap)
        schedule = Schedule(algo, sim, "run-a", 2 * MB, [0.5, 0.5, 0.5, 1.5], "fingerprint")
        _run(schedule, 12)
        shares[overlap] = min(schedule.clock.compute_fraction_per_worker()[:3])
        if overlap:
            assert sum(schedule.clock.seconds("roster")[:3]) < 5.0  # hardly any idle pacing
    assert shares[True] > 0.9 > shares[False]


def _overlapped(corpus: Corpus, rounds: int, eval_every: int) -> Simulation:
    # 1 MB at 8 Mbit/s lands 3 steps into the next round: between rounds a round is in
    # flight, so an evaluation there is of a model that differs from the live one.
    sim = SimConfig(
        workers=4, rounds=rounds, step_time_s=0.5, bandwidth_mbps=8, latency_ms=10,
        message_bytes=MB, eval_every=eval_every,
    )  # fmt: skip
    algo = AlgoConfig(topology="1peer", inner_steps=10, overlap=True)
    return Simulation(algo, TRAIN, sim, corpus=corpus)


def test_an_evaluation_between_overlapped_rounds_is_of_the_landed_model(corpus: Corpus) -> None:
    # After round 3 of a longer run, the model evaluated is the one a run that stopped
    # after round 3 ends with (its last exchange landed), not the eager point it trains on.
    longer = _overlapped(corpus, 5, eval_every=1).run()
    stopped = _overlapped(corpus, 3, eval_every=3).run()
    assert longer.records[2].val_loss == stopped.final_val_loss


def test_evaluating_between_overlapped_rounds_changes_nothing_in_the_run(corpus: Corpus) -> None:
    often, rarely = _overlapped(corpus, 4, eval_every=1), _overlapped(corpus, 4, eval_every=4)
    a, b = often.run(), rarely.run()
    assert a.final_val_loss == b.final_val_loss
    assert [r.digest for r in a.records] == [r.digest for r in b.records]
    for x, y in zip(often.workers, rarely.workers, strict=True):
        assert torch.equal(x.flat.flat, y.flat.flat) and torch.equal(x.momentum, y.momentum)
        assert list(x.trust.accepted) == list(y.trust.accepted)


def test_the_norm_bound_compares_a_partners_tilde_with_our_own_not_the_eager_point(
    corpus: Corpus,
) -> None:
    # As a daemon's wire does: ‖θ̃_j − θ̃_i‖ against norm_bound·‖θ̃_i‖, with θ̃_i the held
    # θ̃ of the round, not the eager point the live parameters moved to.
    simulation = _overlapped(corpus, 3, eval_every=3)
    checked: list[int] = []

    def check(record: object) -> None:
        held = simulation._held
        if held is None:
            return
        ratios = []
        for e in (e for e in held.edges if e.moved):
            for me, other in ((e.a, e.b), (e.b, e.a)):
                own = simulation.workers[me].pending
                assert own is not None
                theirs = simulation._fetch(held, other, me)
                ratios.append(float((theirs - own).norm()) / float(own.norm()))
        simulation.norm_bound = max(ratios) * 1.001
        assert simulation._refusals(held) == set()
        simulation.norm_bound = max(ratios) * 0.999
        assert simulation._refusals(held)
        simulation.norm_bound = WireConfig().norm_bound
        checked.append(1)

    simulation.run(on_round=check)
    assert checked


def test_a_landed_evaluation_is_timed_when_its_exchanges_are_over(corpus: Corpus) -> None:
    # A straggler's exchanges end long after the round: the landed model evaluated at a
    # round's end is stamped no earlier than its last exchange, in the summary's curve.
    sim = SimConfig(
        workers=4, rounds=4, step_time_s=0.5, bandwidth_mbps=8, latency_ms=10,
        message_bytes=MB, eval_every=1, stragglers=(Straggler(0, 0.25),),
    )  # fmt: skip
    algo = AlgoConfig(topology="1peer", inner_steps=4, overlap=True)
    result = Simulation(algo, TRAIN, sim, corpus=corpus).run()
    between = result.records[:-1]
    assert all(r.val_at_s is not None and r.val_at_s >= r.wall_clock_s for r in between)
    assert any(r.val_at_s > r.wall_clock_s for r in between)  # type: ignore[operator]
    assert result.records[-1].val_at_s is None  # the last one landed before it was taken
    curve = simulation_summary(result, {})["val_loss_curve"]
    assert [p["wall_clock_s"] for p in curve[1:-1]] == [r.val_at_s for r in between]
