"""The package stays readable: no module over ~400 lines, no function over ~60.

Limits with a little slack (420 and 65), so the aim is a habit rather than a cliff; a
module that outgrows them splits along a seam, as the daemon did.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "gaslocd"
MAX_MODULE_LINES = 420
MAX_FUNCTION_LINES = 65


def _modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "proto" not in p.relative_to(PKG).parts)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_module_and_functions_stay_small(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{path.name} has too many lines"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path.name}: {', '.join(long)}"
