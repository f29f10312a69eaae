"""Checkpoints written atomically and read without unpickling arbitrary objects.

Payload convention (a dict; :func:`build_payload` makes one):

- ``format_version`` (int): :data:`FORMAT_VERSION`; bumped when the layout changes.
- ``fingerprint`` (str): :func:`gaslocd.train.flat.model_fingerprint` of the model; a
  checkpoint only loads into the model it was written for.
- ``round`` (int): the next outer round to run.
- ``theta`` (1-D float32 tensor): the flat parameters θ at the start of that round.
- ``outer_momentum`` (1-D float32 tensor): the outer Nesterov buffer m.
- ``inner`` (dict): :meth:`gaslocd.train.inner.InnerTrainer.state_dict` (AdamW moments,
  steps done, data position).
- ``extra`` (dict): plain values a caller wants back (run id, config, metrics...).

Only tensors and plain values (None, bool, int, float, str, and dicts, lists and tuples of
them) may be saved: :func:`save_checkpoint` refuses anything else, because
:func:`load_checkpoint` reads with ``torch.load(weights_only=True)`` — a checkpoint may come
from another machine, and unpickling it could run arbitrary code.

Atomicity: the payload is written to a temporary file in the same directory, flushed and
fsynced, then renamed over ``path`` (``os.replace`` is atomic on POSIX), and the directory
is fsynced so the rename itself survives a power cut. A crash at any point leaves either
the old checkpoint or the new one at ``path``, never a truncated mix.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_NAME = "checkpoint.pt"  # in a daemon's --checkpoint-dir

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, of another format, or for another model."""


def build_payload(
    *,
    fingerprint: str,
    round: int,
    theta: torch.Tensor,
    outer_momentum: torch.Tensor,
    inner: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A payload following the module's convention (tensors are detached, not copied)."""
    return {
        "format_version": FORMAT_VERSION,
        "fingerprint": fingerprint,
        "round": round,
        "theta": theta.detach(),
        "outer_momentum": outer_momentum.detach(),
        "inner": inner,
        "extra": {} if extra is None else extra,
    }


_LEAVES = (type(None), bool, int, float, str, torch.Tensor, torch.Size)


def _check_plain(value: object, where: str) -> None:
    """Raise TypeError if ``value`` holds anything ``weights_only`` loading would refuse."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str | int):
                raise TypeError(f"checkpoint payload key {key!r} at {where} is not a str or int")
            _check_plain(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]")
    elif not isinstance(value, _LEAVES):
        raise TypeError(
            f"checkpoint payload holds a {type(value).__name__} at {where}: only tensors and "
            "plain values (None, bool, int, float, str, dict, list, tuple) can be saved"
        )


def older_copies(path: Path, keep: int) -> list[Path]:
    """``path`` and the older copies rotation keeps beside it, newest first."""
    return [path] + [path.with_name(f"{path.name}.{i}") for i in range(1, keep)]


def _rotate(path: Path, keep: int) -> None:
    """Shift ``path.1`` → ``path.2`` …, then hard-link ``path`` as ``path.1``.

    A link, not a rename: ``path`` itself stays in place until the new file replaces it,
    so a crash at any point still leaves a whole checkpoint under ``path``.
    """
    copies = older_copies(path, keep)
    if keep < 2 or not path.exists():
        return
    for newer, older in reversed(list(itertools.pairwise(copies[1:]))):
        if newer.exists():
            os.replace(newer, older)
    copies[1].unlink(missing_ok=True)
    try:
        os.link(path, copies[1])
    except OSError:  # a filesystem without hard links: keep only the newest
        log.warning("cannot keep an older checkpoint beside %s (no hard links)", path)


def save_checkpoint(path: Path, payload: dict[str, Any], *, keep: int = 1) -> None:
    """Write ``payload`` to ``path`` atomically (see the module docstring).

    ``keep`` > 1 keeps that many checkpoints in all: the previous ones as ``path.1``,
    ``path.2``… (newest first), so a checkpoint damaged after it was written (a disk
    error, a bad copy) does not take the run's progress with it.
    """
    for key in ("format_version", "fingerprint"):
        if key not in payload:
            raise ValueError(f"checkpoint payload needs {key!r}; build it with build_payload")
    _check_plain(payload, "payload")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        _rotate(path, keep)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_dir(path.parent)
    log.info("saved checkpoint %s (round %s)", path, payload.get("round"))


def _fsync_dir(directory: Path) -> None:
    """Persist a rename: on POSIX the new directory entry is durable only after this."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open directories; its rename is durable enough
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_newest(path: Path, *, keep: int, expected_fingerprint: str) -> tuple[dict[str, Any], Path]:
    """The newest readable checkpoint among ``path`` and its older copies, and its file.

    A damaged or missing newest file falls back to the previous one (with a warning); a
    checkpoint of another model is refused at once, never skipped: it means the wrong
    directory, not a damaged file.
    """
    failures: list[str] = []
    for candidate in older_copies(Path(path), max(1, keep)):
        if not candidate.exists():
            continue
        try:
            payload = load_checkpoint(candidate, expected_fingerprint=expected_fingerprint)
        except CheckpointError as exc:
            if "different model" in str(exc):
                raise
            failures.append(str(exc))
            log.warning("%s; trying an older checkpoint", exc)
            continue
        return payload, candidate
    raise CheckpointError("; ".join(failures) or f"no checkpoint at {path}")


def load_checkpoint(
    path: Path, *, expected_fingerprint: str, map_location: str | torch.device = "cpu"
) -> dict[str, Any]:
    """Read and check a checkpoint; every failure is a :class:`CheckpointError`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged file; name the file
        raise CheckpointError(
            f"checkpoint {path} cannot be read (truncated, corrupt, or holding objects other "
            f"than tensors and plain values): {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(payload, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(payload).__name__}, not a dict")
    version = payload.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format_version {version!r}; this gaslocd reads {FORMAT_VERSION}"
        )
    found = payload.get("fingerprint")
    if found != expected_fingerprint:
        raise CheckpointError(
            f"checkpoint {path} is for a different model: its fingerprint is {found!r}, "
            f"this model's is {expected_fingerprint!r}"
        )
    return payload


def checkpoint_worker_index(directory: Path) -> int | None:
    """The data-stream index saved in a checkpoint, so a resumed daemon keeps its stream."""
    path = Path(directory) / CHECKPOINT_NAME
    if not path.is_file():
        return None
    try:  # mmap: only the small dict is read here, not the model-sized tensors
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # a damaged file: restore() reports it properly
        return None
    index = payload.get("extra", {}).get("worker_index") if isinstance(payload, dict) else None
    return int(index) if isinstance(index, int) else None
