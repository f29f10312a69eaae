"""The committed generated code is exactly what `make proto` produces from protos/."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ["peer_pb2.py", "peer_pb2.pyi", "peer_pb2_grpc.py"]


def _recorded_command() -> list[str]:
    """The protoc command of the Makefile's ``proto`` target, as recorded there."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(r"^proto:.*\n\t(.+)$", text, re.MULTILINE)
    assert match, "the Makefile has no proto target"
    args = shlex.split(match.group(1))
    assert args[:3] == ["$(PY)", "-m", "grpc_tools.protoc"], args
    return args[1:]


def test_regenerating_changes_nothing(tmp_path: Path) -> None:
    grpc_tools = pytest.importorskip("grpc_tools")
    from grpc_tools import grpc_version  # type: ignore[import-untyped]

    committed = (ROOT / "gaslocd/net/proto/peer_pb2_grpc.py").read_text()
    recorded = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", committed)
    assert recorded
    if recorded.group(1) != grpc_version.VERSION:
        pytest.skip(f"grpcio-tools {grpc_version.VERSION} here, files made by {recorded.group(1)}")
    args = [a.replace("_out=.", f"_out={tmp_path}") for a in _recorded_command()]
    subprocess.run([sys.executable, *args], cwd=ROOT, check=True, timeout=120)
    assert grpc_tools is not None
    for name in GENERATED:
        fresh = (tmp_path / "gaslocd/net/proto" / name).read_text()
        assert fresh == (ROOT / "gaslocd/net/proto" / name).read_text(), f"{name} is stale"
