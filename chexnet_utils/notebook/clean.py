"""Keeping notebooks clean in git: no outputs except the ones nbval checks.

Cells whose source contains ``# NBVAL_CHECK_OUTPUT`` keep their output in the repository:
nbval (``--nbval-lax``) compares it with a fresh run. Every other cell is committed empty.
``python -m chexnet_utils nbclean [--execute] NOTEBOOK...`` enforces that; the test suite
checks it (``tests/support/notebook_lint.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from chexnet_utils.platform.lazy import lazy_module

# nbformat: imported on first use (chexnet_utils.platform.lazy)
nbformat = lazy_module("nbformat")

CHECK_MARK = "NBVAL_CHECK_OUTPUT"
VOLATILE_META = ("execution", "collapsed", "scrolled")
VOLATILE_NB_META = ("widgets",)
"""Notebook-level metadata a run leaves behind: ``widgets`` is the saved state of every
progress bar (tqdm) the run displayed, kilobytes of ids that change on every run."""


def is_checked(cell: dict) -> bool:
    """Whether nbval compares this cell's output (a code cell marked ``NBVAL_CHECK_OUTPUT``)."""
    return cell.get("cell_type") == "code" and CHECK_MARK in "".join(cell.get("source", ""))


def clean_notebook(path: Path, execute: bool = False, timeout: int = 1800) -> None:
    """Strip outputs and execution counts, keeping those of checked cells.

    With ``execute=True`` the notebook is first run top to bottom (in its own folder, in a
    fresh kernel), so checked cells get fresh outputs to commit.
    """
    from chexnet_utils.platform.atomic import atomic_path

    nb = nbformat.read(path, as_version=4)
    if execute:
        from nbclient import NotebookClient

        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    for key in VOLATILE_NB_META:
        nb.metadata.pop(key, None)
    for cell in nb.cells:
        for key in VOLATILE_META:
            cell.metadata.pop(key, None)
        if cell.cell_type != "code":
            continue
        if not is_checked(cell):
            # nbval needs a checked cell's execution count ("unrun reference cell" otherwise)
            cell.execution_count = None
            cell.outputs = []
    with atomic_path(path) as tmp:  # the committed notebook: never left half-written
        nbformat.write(nb, tmp)


def clean_all(paths: Sequence[Path], execute: bool = False) -> None:
    """:func:`clean_notebook` over several notebooks, printing each name."""
    for p in paths:
        print(f"cleaning {p}{' (executing first)' if execute else ''}", flush=True)
        clean_notebook(Path(p), execute=execute)
