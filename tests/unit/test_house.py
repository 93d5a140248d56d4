"""The house rules of docs/architecture.md, checked on the tree: small rooms, notebooks that
narrate (no plumbing), one place for settings."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "chexnet_utils"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MAX_MODULE_LINES = 700
MAX_CELL_LINES = 15


def _code_cells(nb: Path) -> list[tuple[int, str]]:
    cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
    return [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "code"]


def test_every_module_is_a_room_not_a_warehouse():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 30
    big = {str(p.relative_to(ROOT)): n for p in modules
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert big == {}


def test_every_module_says_what_it_is_for():
    missing = [str(p.relative_to(ROOT)) for p in sorted(PACKAGE.rglob("*.py"))
               if not ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))]
    assert missing == []


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_cells_are_short_and_define_nothing(nb: Path):
    long_cells = {i: len(src.splitlines()) for i, src in _code_cells(nb)
                  if len(src.splitlines()) > MAX_CELL_LINES}
    assert long_cells == {}, f"code cells over {MAX_CELL_LINES} lines (cell: lines)"
    defined = []
    for i, src in _code_cells(nb):
        lines = [ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!"))]
        tree = ast.parse("\n".join(lines))
        defined += [(i, n.name) for n in ast.walk(tree)
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    assert defined == [], "functions belong in chexnet_utils, not in a notebook"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_settings_come_from_config_and_results_are_numbered(nb: Path):
    reads = [i for i, src in _code_cells(nb)
             if re.search(r"(os\.environ\.get|os\.getenv|os\.environ\[)\(?\s*[\"']CHEXNET_", src)]
    assert reads == [], "read CHEXNET_* settings through config.scale()"
    cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
    headings = [ln for c in cells if c["cell_type"] == "markdown"
                for ln in "".join(c["source"]).splitlines() if ln.startswith("## ")]
    assert any(re.fullmatch(r"## \d+\. Results", h.strip()) for h in headings), headings
