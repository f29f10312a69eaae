"""The layering of DESIGN §2, enforced: each layer imports only the layers above it."""

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
RANK = {"config": 1, "algorithm": 2, "train": 3, "net": 4, "sim": 5, "daemon": 6, "cli": 7}
FORBIDDEN = {"net": {"algorithm"}, "train": {"net", "algorithm"}}


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


@pytest.mark.parametrize("module", ["gaslocd.sim", "gaslocd.net.memory", "gaslocd.algorithm"])
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
