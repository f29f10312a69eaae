"""The last full roster read that quick reads merge with (gaslocd/net/roster_read.py)."""

from __future__ import annotations

import concurrent.futures
from types import SimpleNamespace

from gaslocd.net.roster_read import FullRead

NOW = 1000.0


def _found(*subkeys: str) -> SimpleNamespace:
    """What a hivemind get returns: a value holding one entry per subkey."""
    return SimpleNamespace(value={k: SimpleNamespace(expiration_time=NOW + 10) for k in subkeys})


def test_a_read_that_started_earlier_never_replaces_a_later_ones_entries() -> None:
    """Reads overlap (lobby, prefetch, pacing, probe); the older one can end last. Its
    entries lacked a newcomer's record that the later read had: kept, the round's
    quick read lost the newcomer and paired it with nobody while it paired itself."""
    full = FullRead()
    older, newer = concurrent.futures.Future(), concurrent.futures.Future()
    n_older, n_newer = full.watch(older), full.watch(newer)
    assert n_newer > n_older and not full.known
    newer.set_result(_found("a", "b", "newcomer"))
    older.set_result(_found("a", "b"))  # the future's callback
    full.keep({"a": _found("a").value["a"]}, n_older)  # and its awaiter
    assert set(full.merged({}, NOW)) == {"a", "b", "newcomer"}
    # A read that starts after it does replace it (a withdrawal, a record expired).
    latest = concurrent.futures.Future()
    full.watch(latest)
    latest.set_result(_found("a"))
    assert set(full.merged({}, NOW)) == {"a"}


def test_a_failed_or_cancelled_read_keeps_nothing() -> None:
    full = FullRead()
    failed, cancelled = concurrent.futures.Future(), concurrent.futures.Future()
    full.watch(failed)
    full.watch(cancelled)
    failed.set_exception(TimeoutError())
    cancelled.cancel()
    assert not full.known


def _entries(**expirations: float) -> dict[str, SimpleNamespace]:
    return {k: SimpleNamespace(expiration_time=e) for k, e in expirations.items()}


def test_quick_reads_stand_in_for_full_ones_only_while_our_copy_was_complete() -> None:
    """A full read asks every node (a 10× straggler's too, whose answers filled its link):
    skipped only while the last one found nothing our own storage lacked before it, in a
    run within the key's replicas, and never longer than the stated time."""
    full = FullRead()
    assert not full.trusted(NOW)  # no full read yet
    found = _entries(a=NOW + 8, b=NOW + 8, gone=NOW - 1)  # an expired entry is no news
    # A newcomer's node lacks what was published before it joined: no trust yet, and
    # the next full read, finding our copy whole, grants it.
    assert full.check_own(found, (5, {}), NOW, 4.0, 0.7) == 2
    assert not full.trusted(NOW)
    assert full.check_own(found, (5, {"a": NOW + 8, "b": NOW + 9}), NOW, 4.0, 0.7) == 0
    assert full.trusted(NOW) and full.trusted(NOW + 3.9)
    assert not full.trusted(NOW + 4.0)  # a full read is due again
    # A publish during the read reached the others before we looked: no news either.
    assert full.check_own(found, (5, {"a": NOW + 8, "b": NOW + 7.5}), NOW, 4.0, 0.7) == 0
    assert full.trusted(NOW)
    # A store that reached other replicas but not us while quick reads were trusted:
    # every read merges what it finds into our copy, which then looks whole, so reads
    # stay full for four trust spans, then trust again.
    assert full.check_own(found, (5, {"a": NOW + 8, "b": NOW + 7}), NOW, 4.0, 0.7) == 1
    assert not full.trusted(NOW)
    complete = {"a": NOW + 8, "b": NOW + 8}
    assert full.check_own(found, (5, complete), NOW + 15.9, 4.0, 0.7) == 0
    assert not full.trusted(NOW + 15.9)
    assert full.check_own(found, (5, complete), NOW + 16.0, 4.0, 0.7) == 0
    assert full.trusted(NOW + 16.0)
    # As many entries as replicas: a newcomer's store may go to the others only.
    many = _entries(**{k: NOW + 20 for k in "abcde"})
    assert full.check_own(many, (5, {k: NOW + 20 for k in "abcde"}), NOW + 16, 4.0, 0.7) == 0
    assert not full.trusted(NOW + 16)
    assert full.check_own(many, (6, {k: NOW + 20 for k in "abcde"}), NOW + 16, 4.0, 0.7) == 0
    assert full.trusted(NOW + 16)
    # Each further lapse (an insider storing to others, never to us) distrusts twice
    # as long: eight trust spans now, then sixteen.
    t = NOW + 16
    for span in (8, 16):
        fresh = _entries(**{k: t + 20 for k in "abcde"})
        assert full.check_own(fresh, (6, {}), t, 4.0, 0.7) == 5
        whole = {k: t + 20 for k in "abcde"}
        t += span * 4.0
        assert full.check_own(fresh, (6, whole), t - 0.1, 4.0, 0.7) == 0
        assert not full.trusted(t - 0.1)
        assert full.check_own(fresh, (6, whole), t, 4.0, 0.7) == 0
        assert full.trusted(t)


def test_a_sitters_late_entry_is_no_lapse_but_a_missing_one_is() -> None:
    """A peer on a sit-out schedule publishes over the link its long exchange fills: its
    stores reach every node seconds late. Found newer than our copy, its entry says
    nothing about our node (beside a 10× straggler the fast hosts fell back to full
    reads, each answered over that link); lacking it altogether still does."""
    full = FullRead()
    found = _entries(a=NOW + 8, slow=NOW + 8)
    assert full.check_own(found, (5, {"a": NOW + 8, "slow": NOW + 8}), NOW, 4.0, 0.7) == 0
    assert full.trusted(NOW)
    late = {"a": NOW + 8, "slow": NOW + 3}  # the sitter's copy here is 5 s behind
    assert full.check_own(found, (5, late), NOW + 1, 4.0, 0.7, sitting={"slow"}) == 0
    assert full.trusted(NOW + 1) and full.lapses == 0
    # ... not when its copy here expired, nor for an entry not on a schedule
    gone = {"a": NOW + 8, "slow": NOW + 0.5}
    assert full.check_own(found, (5, gone), NOW + 2, 4.0, 0.7, sitting={"slow"}) == 1
    assert not full.trusted(NOW + 2) and full.lapses == 1
    assert full.check_own(found, (5, late), NOW + 2, 4.0, 0.7) == 1
