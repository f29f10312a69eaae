"""Signal handlers around :meth:`gaslocd.daemon.lifecycle.Daemon.run`.

While the event loop runs, its own handlers stop the daemon (a second signal forces it).
Before and after, these keep a signal from killing the process with the default action
while it still stops its child processes, and put back whatever handlers the embedding
program had.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)
Handler = Callable[[int, FrameType | None], Any] | int | None


class Hurry(Exception):
    """A signal after the event loop's handlers are gone: finish stopping, quickly."""


def hurry(_signum: int, _frame: FrameType | None) -> None:
    raise Hurry


def current_handlers() -> dict[signal.Signals, Handler]:
    return {sig: signal.getsignal(sig) for sig in SIGNALS}


def set_handlers(handler: Handler) -> None:
    for sig in SIGNALS:
        with contextlib.suppress(ValueError):  # not the main thread: the embedder's choice
            signal.signal(sig, handler)


def restore_handlers(previous: dict[signal.Signals, Handler]) -> None:
    """Put back the handlers the embedding program had before :meth:`Daemon.run`."""
    for sig, handler in previous.items():
        with contextlib.suppress(ValueError, TypeError):  # not the main thread, or None
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
