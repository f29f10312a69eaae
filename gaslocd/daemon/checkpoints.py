"""Whether a start resumes, and what happens to a checkpoint that is already there.

A volunteer restarts with the command they started with. If that silently trained from
scratch and then overwrote the checkpoint (as ``--resume`` used to require), a restart
would lose everything trained so far. So a checkpoint directory that holds a checkpoint
is resumed by default; ``--fresh`` starts over but moves the old checkpoint aside, never
deleting it; ``--resume`` insists (and fails without a checkpoint). Whether the
checkpoint fits this model is checked when it is loaded: a foreign one is refused, as
before, rather than overwritten.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from gaslocd.config import DaemonConfig
from gaslocd.train.checkpoint import CHECKPOINT_NAME, older_copies


def checkpoints_in(directory: Path, keep: int) -> list[Path]:
    """The checkpoint files (newest first) rotation left in ``directory``."""
    return [p for p in older_copies(directory / CHECKPOINT_NAME, max(1, keep)) if p.exists()]


def prepare(cfg: DaemonConfig, now: float | None = None) -> tuple[DaemonConfig, str | None]:
    """The config this start runs with (``resume`` decided) and a line to show, if any."""
    if cfg.checkpoint_dir is None:
        return cfg, None
    directory = Path(cfg.checkpoint_dir)
    found = checkpoints_in(directory, cfg.keep_checkpoints)
    if cfg.fresh:
        if not found:
            return cfg, None
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
        aside = directory / f"previous-{stamp}"
        aside.mkdir(parents=True, exist_ok=False)
        for file in found:
            file.replace(aside / file.name)
        return cfg, f"--fresh: the previous checkpoint was moved to {aside}"
    if found and not cfg.resume:
        note = f"found a checkpoint in {directory}: resuming (--fresh starts over, keeping it)"
        return replace(cfg, resume=True), note
    return cfg, None
