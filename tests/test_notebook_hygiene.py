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


def test_saved_widget_state_is_a_problem_and_cleaning_removes_it(tmp_path):
    path = tmp_path / "w.ipynb"
    nb = _nb([_code("print(1)")])
    nb["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    path.write_text(json.dumps(nb))
    assert any("widget" in p for p in hygiene_problems(path))
    clean_notebook(path)
    assert "widgets" not in json.loads(path.read_text())["metadata"]
    assert hygiene_problems(path) == []


def test_wall_time_table_sums_per_notebook_and_judges_the_budget():
    from chexnet_utils.nbtools import format_wall_times, notebook_of

    assert notebook_of("notebooks/02_x.ipynb::Cell 3") == "notebooks/02_x.ipynb"
    assert notebook_of("tests/test_a.py::test_b[x.ipynb]") is None
    table = format_wall_times({"notebooks/01_b.ipynb": 90.0, "notebooks/00_a.ipynb": 30.0},
                              other_seconds=60.0, budget_minutes=20)
    lines = table.splitlines()
    assert "00_a.ipynb" in lines[1] and "01_b.ipynb" in lines[2]  # in notebook order
    assert "1.5 min" in lines[2] and "other tests" in lines[3]
    assert "3.0 min" in lines[4] and "within the 20 min budget" in lines[4]
    assert "OVER the 2 min budget" in format_wall_times({"n.ipynb": 200.0}, 0, 2)
    # the session's real wall time (collection, start-up) counts when it is known
    assert "OVER the 3 min budget" in format_wall_times({"n.ipynb": 100.0}, 60, 3,
                                                       elapsed_seconds=200.0)
    assert "total wall" in format_wall_times({"n.ipynb": 100.0}, 0, 3, elapsed_seconds=150.0)


def test_make_test_prints_the_wall_time_table(tmp_path):
    """The repository's conftest adds the table to a real nbval run."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    nb = _nb([_code("x = 1 + 1"), _code("print(x)")])
    nb["metadata"]["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}
    path = root / "build" / "test-walltime" / "tiny.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb))
    import os

    env = {k: v for k, v in os.environ.items()
           if k not in ("CHEXNET_TEST_BUDGET_MIN", "PYTEST_ADDOPTS")}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "--nbval-lax", "--nbval-current-env", str(path)],
                         cwd=root, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "notebook wall times" in out.stdout
    assert "tiny.ipynb" in out.stdout and "within the 20 min budget" in out.stdout
