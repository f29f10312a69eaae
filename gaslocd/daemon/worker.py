"""The training thread: the one place where inner steps run, behind one narrow call.

PyTorch releases the GIL in its kernels, so a single worker thread trains at full speed
while the event loop keeps serving exchanges, heartbeats and metrics. Everything that
touches the model's tensors goes through :meth:`TrainingThread.call`, so those operations
are serialized without further locks; :attr:`stop` asks a running ``train_steps`` to
return after its current step.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class TrainingThread:
    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gaslocd-train")
        self.stop = threading.Event()

    async def call(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(*args)`` on the training thread and await its result."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    def should_stop(self) -> bool:
        return self.stop.is_set()

    def shutdown(self, wait: bool = True) -> None:
        """Ask the current step to be the last; ``wait`` for the thread to finish it.

        A forced exit does not wait here; the interpreter still joins the thread at exit,
        which costs at most the step (or checkpoint write) in progress.
        """
        self.stop.set()
        self._executor.shutdown(wait=wait, cancel_futures=True)
