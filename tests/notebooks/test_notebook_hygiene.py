"""Committed notebooks carry no outputs except the cells nbval checks, and their prose has
no figures from somebody else's run that are not labelled as such."""

import json
from pathlib import Path

import pytest

from chexnet_utils.notebook import reading
from chexnet_utils.notebook.clean import clean_notebook
from tests.support.notebook_lint import (
    PROSE_NUMBER_OK,
    hygiene_problems,
    prose_number_problems,
    unlabelled_numbers,
)

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_is_clean(notebook):
    assert hygiene_problems(notebook) == []


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_collapsed_blocks_render(notebook):
    """Every <details> block closes, none nests, and a blank line follows its summary (else
    JupyterLab shows the markdown inside as raw text)."""
    assert reading.details_problems(notebook) == []


def test_the_core_path_reads_in_one_sitting_per_notebook():
    """Issue #47: visible markdown (outside <details>) at most 2,500 words per notebook and
    18k over the course; depth goes into collapsed blocks, not away."""
    words = {nb.name: reading.visible_words(nb) for nb in NOTEBOOKS}
    over = {n: w for n, w in words.items() if w > reading.MAX_WORDS_PER_NOTEBOOK}
    assert over == {}, f"visible words over {reading.MAX_WORDS_PER_NOTEBOOK}: {over}"
    assert sum(words.values()) <= reading.MAX_WORDS_TOTAL, words


def test_visible_words_skip_collapsed_blocks(tmp_path):
    text = ("one two\n\n<details><summary>Deeper: x</summary>\n\nhidden words here\n\n"
            "</details>\nthree")
    assert len(reading.visible_markdown(text).split()) == 3
    nb = tmp_path / "n.ipynb"
    nb.write_text(json.dumps({"cells": [
        {"cell_type": "markdown", "id": "a", "metadata": {}, "source": [text]},
        {"cell_type": "markdown", "id": "b", "metadata": {},
         "source": ["<details><summary>S</summary>\nraw\n</details>"]},
        {"cell_type": "markdown", "id": "c", "metadata": {}, "source": ["<details>open"]}],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert reading.visible_words(nb) == 3 + 0 + 1      # an unclosed block is not collapsed
    problems = reading.details_problems(nb)
    assert any(p.startswith("b: no blank line") for p in problems)
    assert any(p.startswith("c: a <details> block is not closed") for p in problems)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_prose_has_only_live_or_labelled_numbers(notebook):
    """A number in a markdown cell is computed by this run (rendered by a cell) or labelled
    with its source and machine; learners compare the prose with their own output."""
    problems = prose_number_problems(notebook)
    assert problems == [], (
        "measured-looking figures in the prose that name no source (render them from this "
        "run's variables, say it without the number, or label them, e.g. \"(reference: "
        "authors' run, 2-core CI machine, docs/benchmarks.md)\"):\n" + "\n".join(problems))


def test_prose_number_opt_outs_stay_rare():
    cells = [c for nb in NOTEBOOKS for c in json.loads(nb.read_text())["cells"]
             if c["cell_type"] == "markdown"]
    uses = sum(PROSE_NUMBER_OK in "".join(c["source"]) for c in cells)
    assert uses <= 3, f"{uses} cells opt out of the prose-number check: fix the prose instead"


def test_prose_number_detector():
    # measured figures from somebody's run are caught, with a snippet to find them
    offending = ("The new pipeline scaled with an efficiency of 1.02 and delivered "
                 "89.8 img/s; the old one took 8.5 ms per image, a 2.4x slowdown.")
    found = unlabelled_numbers(offending)
    assert len(found) == 4
    assert any("1.02" in f for f in found) and any("89.8 img/s" in f for f in found)
    assert any("8.5 ms" in f for f in found) and any("2.4x" in f for f in found)
    assert len(unlabelled_numbers("| 2 | 139.0 img/s | 1.01 |")) == 2  # a table row
    assert unlabelled_numbers("- idle engines burn ~15 % of a core") != []
    # ... also in a solution, and in a comment of its code, not in the code itself
    solution = ("<details><summary>Solution</summary>\n\n```python\nsteps = 0.25 * n\n"
                "print(r)   # measured here: efficiency 0.71\n```\nHere d is 8.5 ms.\n</details>")
    assert [f for f in unlabelled_numbers(solution) if "0.71" in f or "8.5 ms" in f] \
        and not [f for f in unlabelled_numbers(solution) if "0.25" in f]
    # labelled: the sentence, the parenthesis or the row names a source
    for labelled in [
        "Spinning cost a third (reference: authors' run, 2-core CI machine, "
        "docs/benchmarks.md: efficiency 0.71 spinning, 1.02 yielding).",
        "CheXNet reached a mean AUROC of 0.841 (Rajpurkar et al. 2017).",
        "The Dell team measured bare metal about **8 % faster** than Kubernetes.",
        "| 2 | CPU model | 89.8 img/s | 0.62 | docs/benchmarks.md |",
        "`HOROVOD_CYCLE_TIME` (1 ms by default) sets the pace.",
        "Assume 0.1 s of compute per step.",
    ]:
        assert unlabelled_numbers(labelled) == [], labelled
    # structural numbers are not measurements
    structural = (
        "# 05 · Section 5.1\n\nCheXNet (DenseNet-121, 7.0 M parameters, 14 pathologies) was "
        "trained on 112,120 images of 1024 x 1024 px, batch 16, on 8 GPUs in 2017; step 3 "
        "shards first. TensorFlow 1.13.1 vs 1.12.0, Python 3.5 vs 3.6, TensorFlow <= 2.15. "
        "The gradient is 28 MB, 364 tensors of 1,024 floats (4 KiB). AUROC 0.5 is chance, 1.0 "
        "perfect. With the cycle set to 10 ms, `STEP_COMPUTE_S = 0.1 s`, `1.5 x`, N = 2.")
    assert unlabelled_numbers(structural) == []
    # the explicit opt-in covers its own paragraph only, and needs a reason
    marked = f"<!-- {PROSE_NUMBER_OK}: the exercise's given numbers -->\nThe sum, 90 ms."
    assert unlabelled_numbers(marked) == []
    assert unlabelled_numbers(marked + "\n\nMeasured: 60 ms.") != []
    assert unlabelled_numbers(f"<!-- {PROSE_NUMBER_OK}: -->\nThe sum, 90 ms.") != []


def test_prose_number_check_fails_on_a_notebook(tmp_path):
    path = tmp_path / "07_x.ipynb"
    path.write_text(json.dumps(_nb([
        {"cell_type": "markdown", "id": "m0", "metadata": {}, "source": "# 07 · Title"},
        _code("x = 1"),
        {"cell_type": "markdown", "id": "m2", "metadata": {},
         "source": "Scaling 1 -> 2 workers: efficiency **0.71**."},
    ])))
    problems = prose_number_problems(path)
    assert len(problems) == 1 and problems[0].startswith("07_x.ipynb cell 2: ")
    assert "0.71" in problems[0]


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
    from tests.support.suite_times import format_wall_times, notebook_of

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


def test_cpu_use_is_read_from_proc_stat_and_shown_per_row(tmp_path):
    from tests.support.suite_times import busy_share, cpu_ticks, format_wall_times

    stat = tmp_path / "stat"
    #                 user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\n")
    assert cpu_ticks(stat) == (150, 1000)  # idle and iowait are not busy
    assert cpu_ticks(tmp_path / "missing") is None
    assert busy_share((150, 1000), (300, 1200)) == 0.75
    assert busy_share(None, (300, 1200)) is None and busy_share((1, 5), (1, 5)) is None
    busy, total = cpu_ticks()  # this machine's
    assert 0 <= busy <= total
    table = format_wall_times({"notebooks/00_a.ipynb": 30.0, "notebooks/01_b.ipynb": 60.0},
                              other_seconds=60.0, other_label="tests (2 workers)",
                              cpu_busy={"notebooks/00_a.ipynb": 0.654, "tests (2 workers)": 0.9})
    lines = table.splitlines()
    assert lines[1].endswith("CPU  65 % busy") and "CPU" not in lines[2]
    assert lines[3].endswith("CPU  90 % busy")


def test_cpu_work_gives_the_least_wall_time_any_schedule_needs():
    """The stages' CPU-seconds (wall x busy share x CPUs) over the CPUs: below that no
    overlap of the stages can go; over the budget, only less work meets it."""
    from tests.support.suite_times import work_floor_note

    note = work_floor_note({"notebook stage": (600.0, 0.75), "tests stage": (500.0, 0.9)}, 2, 15)
    assert note is not None and note.startswith("CPU work: 1800 CPU-seconds")
    assert "notebook stage 900, tests stage 900" in note and "at least 15.0 min" in note
    assert "over the" not in note  # 15.0 min is within 15
    over = work_floor_note({"notebook stage": (600.0, 1.0)}, 1, 5)
    assert over is not None and "at least 10.0 min" in over and "only less work" in over
    assert work_floor_note({"tests stage": (10.0, None)}, 2) is None  # share unknown
    assert work_floor_note({}, 2) is None


def test_layer_table_splits_setup_call_teardown():
    from tests.support.suite_times import format_layer_times, layer_of_test
    assert layer_of_test("tests/mpi/test_cluster.py::test_x") == "mpi"
    assert layer_of_test("notebooks/04_x.ipynb::Cell 3") == "nbval"
    assert layer_of_test("conftest.py::x") == "other"
    table = format_layer_times({("mpi", "setup"): 30.0, ("mpi", "call"): 12.5,
                                ("unit", "call"): 4.0},
                               {"tests/mpi/a.py::t1": 29.0, "tests/mpi/a.py::t2": 1.0}, top=1)
    rows = table.splitlines()
    assert rows[2].split() == ["mpi", "30.0", "12.5", "0.0", "42.5"]
    assert rows[3].split() == ["unit", "0.0", "4.0", "0.0", "4.0"]
    assert "29.0 s  tests/mpi/a.py::t1" in table and "t2" not in table


def test_make_test_prints_the_wall_time_table(tmp_path):
    """The repository's conftest adds the table to a real nbval run (of a notebook written
    to ``tmp_path``: the conftest is loaded as a plugin, as the rootdir's would be)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    nb = _nb([_code("x = 1 + 1"), _code("print(x)")])
    nb["metadata"]["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}
    path = tmp_path / "tiny.ipynb"
    path.write_text(json.dumps(nb))
    env = {k: v for k, v in os.environ.items()  # not make test's own stage-times file either
           if k not in ("CHEXNET_TEST_BUDGET_MIN", "PYTEST_ADDOPTS", "CHEXNET_TEST_TIMES")}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-c", str(root / "pyproject.toml"), "--rootdir", str(tmp_path),
                          "-p", "conftest", "--nbval-lax", "--nbval-current-env", str(path)],
                         cwd=root, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "notebook wall times" in out.stdout
    assert "tiny.ipynb" in out.stdout and "within the 15 min budget" in out.stdout
    assert "% busy" in out.stdout and "CPU use (busy share" in out.stdout
    assert "CPU work: " in out.stdout and "however the stages are scheduled" in out.stdout
    # as make test's second stage: the first one's wall time and CPU share are in the file
    from tests.support.suite_times import write_stage_time

    times = tmp_path / "times.json"
    write_stage_time(times, "tests", 480.0, workers=2, cpu_busy=0.9)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-c", str(root / "pyproject.toml"), "--rootdir", str(tmp_path),
                          "-p", "conftest", "--nbval-lax", "--nbval-current-env", str(path)],
                         cwd=root, capture_output=True, text=True, timeout=300,
                         env={**env, "CHEXNET_TEST_TIMES": str(times)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "tests (2 workers)" in out.stdout and ", tests stage 90 %" in out.stdout
    work = next(line for line in out.stdout.splitlines() if line.startswith("CPU work: "))
    # wall x share x CPUs
    assert f"tests stage {480 * 0.9 * (os.cpu_count() or 1):.0f}" in work, work


def test_stage_times_hand_the_tests_stage_wall_time_to_the_notebook_stage(tmp_path):
    """make test's two stages share their wall times through one JSON file: the parallel
    tests stage writes its own, the notebook stage reads it for the suite's total."""
    import pytest

    from tests.support.suite_times import format_wall_times, read_stage_times, write_stage_time

    times = tmp_path / "times.json"
    assert read_stage_times(times) == {}
    times.write_text("")  # what make test's mktemp hands over
    assert read_stage_times(times) == {}
    write_stage_time(times, "tests", 301.26, workers=2, cpu_busy=0.8967)
    write_stage_time(times, "notebooks", 500.0)
    assert read_stage_times(times) == {"tests": {"wall_s": 301.3, "workers": 2,
                                                 "cpu_busy": 0.897},
                                       "notebooks": {"wall_s": 500.0, "workers": 0}}
    assert [p.name for p in tmp_path.iterdir()] == ["times.json"]  # no temp file left
    table = format_wall_times({"n.ipynb": 500.0}, 301.3, 15, elapsed_seconds=810.0,
                              other_label="tests (2 workers)")
    assert "tests (2 workers)" in table and "13.5 min" in table and "within the 15" in table
    times.write_text("[1, 2]")
    with pytest.raises(ValueError, match="times.json: not a record of make test's stage"):
        read_stage_times(times)


def test_xdist_groups_name_existing_test_files_and_mark_their_tests():
    """Every file of tests/conftest.py's XDIST_GROUPS exists (a renamed file would silently
    leave its group and run beside what it must not), and its tests get the group's mark."""
    from tests.conftest import _TESTS, XDIST_GROUPS, xdist_group_of

    for group, files in XDIST_GROUPS.items():
        for rel in files:
            assert (_TESTS / rel).is_file(), f"XDIST_GROUPS[{group!r}] names missing {rel}"
            assert xdist_group_of(_TESTS / rel) == group
    assert xdist_group_of(_TESTS / "unit" / "test_house.py") == "unit/test_house.py"
    assert xdist_group_of(Path("notebooks/00_environment_check.ipynb")) is None
