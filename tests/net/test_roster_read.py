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
