"""Keeping notebooks clean in git: no outputs except the ones nbval checks.

Cells whose source contains ``# NBVAL_CHECK_OUTPUT`` keep their output in the repository:
nbval (``--nbval-lax``) compares it with a fresh run. Every other cell is committed empty.
``python -m chexnet_utils nbclean [--execute] NOTEBOOK...`` enforces that;
:func:`hygiene_problems` is what the test suite checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

CHECK_MARK = "NBVAL_CHECK_OUTPUT"
_VOLATILE_META = ("execution", "collapsed", "scrolled")
_VOLATILE_NB_META = ("widgets",)
"""Notebook-level metadata a run leaves behind: ``widgets`` is the saved state of every
progress bar (tqdm) the run displayed, kilobytes of ids that change on every run."""


def _is_checked(cell: dict) -> bool:
    return cell.get("cell_type") == "code" and CHECK_MARK in "".join(cell.get("source", ""))


def clean_notebook(path: Path, execute: bool = False, timeout: int = 1800) -> None:
    """Strip outputs and execution counts, keeping those of checked cells.

    With ``execute=True`` the notebook is first run top to bottom (in its own folder, in a
    fresh kernel), so checked cells get fresh outputs to commit.
    """
    import nbformat

    nb = nbformat.read(path, as_version=4)
    if execute:
        from nbclient import NotebookClient

        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    for key in _VOLATILE_NB_META:
        nb.metadata.pop(key, None)
    for cell in nb.cells:
        for key in _VOLATILE_META:
            cell.metadata.pop(key, None)
        if cell.cell_type != "code":
            continue
        if not _is_checked(cell):
            # nbval needs a checked cell's execution count ("unrun reference cell" otherwise)
            cell.execution_count = None
            cell.outputs = []
    nbformat.write(nb, path)


def hygiene_problems(path: Path) -> list[str]:
    """What is wrong with a committed notebook.

    Saved widget state; outputs or execution counts in cells nbval does not check; checked
    cells without output
    or execution count; checked cells whose execution counts are not increasing (a sign they
    were run out of order, so a top-to-bottom run may not reproduce them).
    """
    import nbformat

    nb = nbformat.read(path, as_version=4)
    problems = [f"{path.name}: notebook metadata {key!r} committed (saved widget state)"
                for key in _VOLATILE_NB_META if key in nb.metadata]
    last_count = 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if not _is_checked(cell):
            if cell.outputs:
                problems.append(f"{path.name} cell {i}: output committed in a cell nbval "
                                "does not check")
            if cell.execution_count is not None:
                problems.append(f"{path.name} cell {i}: execution count "
                                f"{cell.execution_count} committed")
            continue
        if not cell.outputs or cell.execution_count is None:
            problems.append(f"{path.name} cell {i}: checked cell was not run before committing")
            continue
        if cell.execution_count <= last_count:
            problems.append(f"{path.name} cell {i}: execution count {cell.execution_count} "
                            f"after {last_count}: run top to bottom before committing")
        last_count = cell.execution_count
    return problems


def clean_all(paths: Sequence[Path], execute: bool = False) -> None:
    """:func:`clean_notebook` over several notebooks, printing each name."""
    for p in paths:
        print(f"cleaning {p}{' (executing first)' if execute else ''}", flush=True)
        clean_notebook(Path(p), execute=execute)


def notebook_of(nodeid: str) -> str | None:
    """The notebook a pytest/nbval test id belongs to (``notebooks/02_x.ipynb::Cell 3`` ->
    ``notebooks/02_x.ipynb``), or ``None`` for an ordinary test."""
    path = nodeid.split("::", 1)[0]
    return path if path.endswith(".ipynb") else None


def format_wall_times(times: dict[str, float], other_seconds: float = 0.0,
                      budget_minutes: float | None = None,
                      elapsed_seconds: float | None = None) -> str:
    """The table ``make test`` prints at the end: each notebook's wall time under nbval
    (kernel start, every cell, kernel stop), the other tests' time, and the total.

    ``times`` maps notebook path -> seconds. The total is ``elapsed_seconds`` when given (the
    session's real wall time, collection and start-up included), else the sum of the rows.
    With ``budget_minutes`` the last line says whether the total stays within it.
    """
    lines = ["notebook wall times (nbval: kernel start + every cell):"]
    width = max([len(Path(p).name) for p in times] + [len("other tests")])
    for path in sorted(times):
        lines.append(f"  {Path(path).name:<{width}}  {times[path] / 60:5.1f} min"
                     f"  ({times[path]:6.1f} s)")
    lines.append(f"  {'other tests':<{width}}  {other_seconds / 60:5.1f} min"
                 f"  ({other_seconds:6.1f} s)")
    total = sum(times.values()) + other_seconds
    label = "total"
    if elapsed_seconds is not None:
        total, label = max(total, elapsed_seconds), "total wall"
    verdict = ""
    if budget_minutes is not None:
        ok = total <= budget_minutes * 60
        verdict = f"  {'within' if ok else 'OVER'} the {budget_minutes:g} min budget"
    lines.append(f"  {label:<{width}}  {total / 60:5.1f} min  ({total:6.1f} s){verdict}")
    return "\n".join(lines)
