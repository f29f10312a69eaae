"""Restarts lose nothing: a daemon restarted with the command it was started with resumes
its checkpoint (no --resume needed), keeps its peer id, and --fresh starts over only
after moving the old checkpoint aside."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.daemon.procs import start_first, summary_rounds

pytestmark = [pytest.mark.net, pytest.mark.slow]


def test_a_restart_resumes_and_fresh_moves_the_old_checkpoint_aside(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    ckpt = tmp_path / "ck"
    same = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"]

    def run(max_rounds: int, *flags: str, name: str) -> tuple[str, list[dict[str, object]]]:
        summary = tmp_path / f"{name}.json"
        args = [*same, "--max-rounds", str(max_rounds), "--json", str(summary), *flags]
        daemon, _ = start_first(tmp_path, reaper, *args, name=name)
        assert daemon.finish(180) == 0, daemon.output()
        return daemon.output(), summary_rounds(summary)

    first_out, first = run(3, name="first")
    assert [r["round"] for r in first] == [1, 2, 3]
    peer = re.search(r"peer (\S+)", first_out)
    assert peer is not None

    again_out, again = run(5, name="again")  # the same command, a higher bound
    assert "resuming" in again_out and "resumed from" in again_out
    assert [r["round"] for r in again] == [4, 5]  # rounds 1-3 were not trained again
    assert f"peer {peer.group(1)}" in again_out  # the identity file kept its peer id
    assert (ckpt / "checkpoint.pt.1").is_file()  # the previous checkpoint is kept too

    fresh_out, fresh = run(2, "--fresh", name="fresh")
    assert [r["round"] for r in fresh] == [1, 2]
    (aside,) = ckpt.glob("previous-*")
    assert f"moved to {aside}" in fresh_out
    assert {p.name for p in aside.iterdir()} == {"checkpoint.pt", "checkpoint.pt.1"}
