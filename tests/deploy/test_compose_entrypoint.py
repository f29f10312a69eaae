"""deploy/gaslocd-compose.sh, the compose services' entry point, with a stand-in gaslocd.

The stand-in prints the arguments and the announce address it was given, so the script's
own logic (stale address removed, waiting for the bootstrap's file, the override for
other sites, the bounded wait) is checked without Docker or a daemon.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.deploy.promql import DEPLOY

SCRIPT = DEPLOY / "gaslocd-compose.sh"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "gaslocd"
    fake.write_text('#!/bin/sh\necho "announce=$GASLOCD_ANNOUNCE args=$*"\n')
    fake.chmod(0o755)
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "GASLOCD_BOOTSTRAP_FILE": str(tmp_path / "bootstrap.addr"),
        "GASLOCD_BOOTSTRAP_WAIT_S": "2",
    }


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=30
    )


def test_start_removes_a_stale_address_and_writes_a_fresh_one(env: dict[str, str]) -> None:
    addr = Path(env["GASLOCD_BOOTSTRAP_FILE"])
    addr.write_text("/dns/bootstrap/tcp/31337/p2p/QmOld\n")
    proc = _run({**env, "GASLOCD_ANNOUNCE": "bootstrap"}, "start", "--min-peers", "2")
    assert proc.returncode == 0, proc.stderr
    assert not addr.exists()
    assert (
        proc.stdout.strip() == f"announce=bootstrap args=start --address-file {addr} --min-peers 2"
    )


def test_join_waits_for_the_address_file_and_announces_its_own_address(
    env: dict[str, str],
) -> None:
    addr = Path(env["GASLOCD_BOOTSTRAP_FILE"])
    addr.write_text("/dns/bootstrap/tcp/31337/p2p/QmNew\n/ip4/10.0.0.2/tcp/31337/p2p/QmNew\n")
    proc = _run(env, "join", "--codec", "fp16")
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    announce, args = last.split(" args=")
    assert args == "join --bootstrap /dns/bootstrap/tcp/31337/p2p/QmNew --codec fp16"
    assert announce.removeprefix("announce=")  # the container's address (hostname -i)


def test_join_takes_a_remote_bootstrap_and_gives_up_after_its_wait(env: dict[str, str]) -> None:
    remote = "/ip4/203.0.113.5/tcp/31337/p2p/QmRemote"
    proc = _run({**env, "GASLOCD_BOOTSTRAP_ADDR": remote, "GASLOCD_ANNOUNCE": "x"}, "join")
    assert proc.stdout.strip().endswith(f"args=join --bootstrap {remote}")
    Path(env["GASLOCD_BOOTSTRAP_FILE"]).write_text("/dns/bootstrap/tcp/31337/p2p/QmPart")  # no \n
    proc = _run({**env, "GASLOCD_ANNOUNCE": "x"}, "join")
    assert proc.returncode == 3
    assert "no bootstrap address" in proc.stderr


def test_other_arguments_go_to_gaslocd(env: dict[str, str]) -> None:
    proc = _run({**env, "GASLOCD_ANNOUNCE": "x"}, "status", "--json")
    assert proc.stdout.strip() == "announce=x args=status --json"
