"""The layering of docs/design.md §2, enforced: each layer imports only the layers above it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "gaslocd"

# Rank of each top-level part of the package; a module may import only lower ranks
# (and its own part). ``net`` must not import ``algorithm`` (it moves tensors, it does
# not mix them), which the rank order alone would allow, so it is listed explicitly.
RANK = {
    "config": 1,
    "algorithm": 2,
    "protocol": 3,
    "train": 4,
    "net": 5,
    "sim": 6,
    "daemon": 7,
    "cli": 8,
    "peer": 9,  # the library API: a daemon around the user's loop, configured as the CLI does
}
# net moves and checks tensors without mixing them; it may read the protocol's record
# type but not its rules. train holds worker state and takes the outer step, but plans
# nothing.
FORBIDDEN = {
    "net": {"algorithm"},
    "train": {"net", "protocol"},
}
# The protocol's rules are decisions on inputs: they read no clock and open nothing.
PURE_PARTS = ("algorithm", "protocol")
# (random is allowed: topology draws from a PRNG seeded by (run id, round), never the global one)
IMPURE_NAMES = {"time", "socket", "asyncio", "threading", "subprocess", "os"}


def _part(module_path: Path) -> str:
    rel = module_path.relative_to(PKG).parts
    return rel[0].removesuffix(".py")


def _gaslocd_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "gaslocd" and len(parts) > 1:
                found.add(parts[1])
    return found


def _modules() -> list[Path]:
    return [p for p in PKG.rglob("*.py") if "proto" not in p.parts and _part(p) in RANK]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_module_imports_only_layers_above(path: Path) -> None:
    part = _part(path)
    for imported in _gaslocd_imports(path):
        if imported not in RANK or imported == part:
            continue
        assert RANK[imported] < RANK[part], f"{part} (layer {RANK[part]}) imports {imported}"
        assert imported not in FORBIDDEN.get(part, set()), f"{part} must not import {imported}"


@pytest.mark.parametrize(
    "path", [p for p in _modules() if _part(p) in PURE_PARTS], ids=lambda p: str(p.relative_to(PKG))
)
def test_round_rules_read_no_clock_and_do_no_io(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert not imported & IMPURE_NAMES, f"{path.name} imports {sorted(imported & IMPURE_NAMES)}"


@pytest.mark.parametrize(
    "module", ["gaslocd.sim", "gaslocd.net.memory", "gaslocd.algorithm", "gaslocd.protocol.policy"]
)
def test_light_modules_pull_in_neither_grpc_nor_hivemind(module: str) -> None:
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        "import gaslocd.sim.runner; "
        "bad = [m for m in ('grpc', 'hivemind') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
