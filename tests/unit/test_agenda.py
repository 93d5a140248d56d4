"""The workshop agenda (docs/facilitator.md) against the notebooks: every part listed, no
slot shorter than reading plus waiting, each plan within its days, no core-path cell over a
minute (issue #47 item 5)."""

from __future__ import annotations

import json
from pathlib import Path

from chexnet_utils.notebook import agenda

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_the_agenda_fits_the_notebooks_and_the_days():
    rows = agenda.read_agenda((ROOT / "docs" / "facilitator.md").read_text())
    times = agenda.read_cell_times(ROOT / "docs" / "cell-times.json")
    lines, problems = agenda.check(NOTEBOOKS, rows, times)
    assert problems == [], "\n".join(lines + problems)
    assert {n.name for n in NOTEBOOKS} <= set(times), "docs/cell-times.json misses notebooks"


def _notebook(tmp_path: Path, cells: list[tuple[str, str, str]]) -> Path:
    path = tmp_path / "04_x.ipynb"
    path.write_text(json.dumps({"cells": [
        {"cell_type": kind, "id": cid, "metadata": {}, "source": [text],
         **({"outputs": [], "execution_count": None} if kind == "code" else {})}
        for kind, cid, text in cells], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_parts_split_at_sections_and_exercises_and_the_check_finds_each_fault(tmp_path):
    words = " ".join(["word"] * 400)        # 2 minutes of reading
    nb = _notebook(tmp_path, [
        ("markdown", "t", "# 04 · X\n\nintro words"), ("code", "c0", "x = 1"),
        ("markdown", "s1", f"## 1. First\n\n{words}"), ("code", "c1", "y = 2"),
        ("markdown", "sum", "## Summary\n\nshort\n\n## Exercises\n\n**Exercise 1.** Do it."),
        ("code", "e1", "answer = None"),
        ("markdown", "e1s", "<details><summary>Solution 1</summary>\n\nhidden\n\n</details>")])
    parts = {p.key: p for p in agenda.notebook_parts(nb)}
    assert list(parts) == ["intro", "§1", "summary", "Ex 1"]
    assert parts["§1"].words == 403 and parts["§1"].cells == ["c1"]
    assert parts["Ex 1"].cells == ["e1"] and parts["Ex 1"].words == 4
    table = "\n".join([agenda.AGENDA_HEADER, "|---|---|---|---|---|",
                       "| 04 | intro | 1 | 1 | |", "| 04 | §1 | 2 | 5 | |",
                       "| 04 | summary | 1 | 1 | |", "| - | lunch | 400 | 60 | |",
                       "| 04 | §9 | - | 1 | |"])
    rows = agenda.read_agenda("text before\n\n" + table + "\n\nafter")
    times = {nb.name: {"c1": 90.0}}
    _, problems = agenda.check([nb], rows, times)
    assert any("04 Ex 1 (Do it) is not in the agenda" in p for p in problems)
    assert any(p.startswith("04 §1: 2 min in the one day plan") for p in problems)  # 2 + 1.5
    assert any("lists 04 §9, which no notebook has" in p for p in problems)
    assert any(p.startswith("the one day plan takes") for p in problems)
    assert any(p.startswith("a core-path cell takes 90 s") for p in problems)


def test_make_test_reports_the_agenda_even_where_it_cannot_write(tmp_path):
    """make test's closing hook: the cell times go to build/cell-times.json by cell id; where
    build/ is not writable (another account's checkout) it says so and goes on."""
    from tests.support.suite_times import agenda_report

    (tmp_path / "notebooks").mkdir()
    _notebook(tmp_path / "notebooks", [("markdown", "t", "# 04 · X"), ("code", "c0", "x = 1")])
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "facilitator.md").write_text("no table here\n")
    report = agenda_report(tmp_path, {"notebooks/04_x.ipynb": {0: 1.5}})
    assert report.startswith(f"cell times written to {tmp_path / 'build' / 'cell-times.json'}")
    assert json.loads((tmp_path / "build" / "cell-times.json").read_text()) == {
        "04_x.ipynb": {"c0": 1.5}}
    assert "agenda: no agenda table" in report
    (tmp_path / "build" / "cell-times.json").unlink()
    (tmp_path / "build").rmdir()
    (tmp_path / "build").write_text("a file where the folder should be")
    assert agenda_report(tmp_path, {"notebooks/04_x.ipynb": {0: 1.5}}).startswith(
        "cell times not written")
    assert agenda_report(tmp_path, {"elsewhere/x.ipynb": {0: 1.0}}).startswith("no notebook")
