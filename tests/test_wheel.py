"""`pip install gaslocd` from a built wheel: the wheel carries everything the command needs
(the generated gRPC code included), installed into a fresh virtual environment.

The new environment sees the test environment's dependencies (torch, hivemind, grpc...)
through a path entry rather than downloading them again, but not its editable gaslocd:
that is installed through a .pth file, which a plain path entry does not process. So
the gaslocd that runs is the wheel's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_the_wheel_installs_and_runs_in_a_fresh_environment(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    build = ["wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(ROOT)]
    subprocess.run([sys.executable, "-m", "pip", *build], check=True, timeout=300)
    (wheel,) = dist.glob("gaslocd-*.whl")
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = ["--python", str(python), "install", "--no-deps", "-q", str(wheel)]
    subprocess.run([sys.executable, "-m", "pip", *install], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(*argv: str) -> str:
        done = subprocess.run(
            argv, check=True, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
        )
        return done.stdout

    where = run(
        str(python), "-c", "import gaslocd, gaslocd.net.proto.peer_pb2; print(gaslocd.__file__)"
    )
    assert where.startswith(site), where  # the wheel's copy, not the source tree
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert run(str(env_dir / "bin" / "gaslocd"), "--version").strip() == f"gaslocd {version}"
