"""The wire's worker threads, each running torch single-threaded.

Why: the wire encodes, decodes and checks one 1–4 MiB chunk at a time in worker threads.
Left alone, every such torch op fans out to torch's intra-op OpenMP team (one thread per
core). On a machine whose cores are busy — the training thread, the peer's process, other
jobs — each op then waits at the team's barrier for a descheduled thread: measured here on
2 loaded cores, ``torch.dist`` over 256 MiB in 2 MiB chunks took 1.09 s with 2 intra-op
threads and 0.034 s with 1. Chunks are already the unit of parallelism (the pipeline
overlaps them), so each wire thread runs its ops on one thread.

How: OpenMP's thread count is per calling thread, but ``torch.set_num_threads`` also
changes the default that every *later* thread of the process inherits (e.g. a training
thread started after the first exchange). So the initializer first lets torch do its
lazy per-thread set-up, then lowers only this thread's OpenMP count through the runtime
torch itself loaded. Where that runtime cannot be found (a torch built without OpenMP),
the threads keep torch's default; only speed differs.
"""

from __future__ import annotations

import ctypes
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger(__name__)


@cache
def _omp_runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime already mapped into this process by torch, if any."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    found = re.findall(r"\S*/lib(?:gomp|iomp5|omp)[\w.-]*\.so[\w.]*", maps)
    for path in sorted(set(found)):
        try:
            lib = ctypes.CDLL(path)
            lib.omp_set_num_threads.argtypes = [ctypes.c_int]
            return lib
        except (OSError, AttributeError):
            continue
    return None


def _one_torch_thread() -> None:
    torch.get_num_threads()  # torch's lazy per-thread init: it must not undo ours later
    lib = _omp_runtime()
    if lib is None:
        log.debug("no OpenMP runtime found; wire threads keep torch's intra-op threads")
        return
    lib.omp_set_num_threads(1)


def wire_executor(workers: int = 2) -> ThreadPoolExecutor:
    """A pool whose threads run torch ops single-threaded (see the module docstring)."""
    return ThreadPoolExecutor(
        workers, thread_name_prefix="gaslocd-wire", initializer=_one_torch_thread
    )
