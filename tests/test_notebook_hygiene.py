"""Committed notebooks carry no outputs except the cells nbval checks."""

import json
from pathlib import Path

import pytest

from chexnet_utils.nbtools import clean_notebook, hygiene_problems

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_is_clean(notebook):
    assert hygiene_problems(notebook) == []


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found"


def _nb(cells):
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _code(src, outputs=(), count=None):
    return {"cell_type": "code", "id": f"c{abs(hash(src)) % 10**6}", "metadata": {},
            "source": src, "outputs": list(outputs), "execution_count": count}


OUT = {"output_type": "stream", "name": "stdout", "text": "hi\n"}


def test_hygiene_catches_stray_outputs_and_order(tmp_path):
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps(_nb([
        _code("print(1)", [OUT], 1),
        _code("# NBVAL_CHECK_OUTPUT\nprint(2)", [OUT], 5),
        _code("# NBVAL_CHECK_OUTPUT\nprint(3)", [OUT], 4),
        _code("# NBVAL_CHECK_OUTPUT\nprint(4)"),
    ])))
    problems = hygiene_problems(path)
    assert any("cell 0: output committed" in p for p in problems)
    assert any("cell 0: execution count 1" in p for p in problems)
    assert any("cell 2: execution count 4 after 5" in p for p in problems)
    assert any("cell 3: checked cell was not run" in p for p in problems)
    clean_notebook(path)
    cleaned = json.loads(path.read_text())["cells"]
    assert cleaned[0]["outputs"] == [] and cleaned[0]["execution_count"] is None
    assert cleaned[1]["outputs"] and cleaned[1]["execution_count"] == 5
