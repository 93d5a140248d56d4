"""What nbval executed, saved as executed notebooks: ``make test``'s notebook stage feeds the
course site (``make book``) with them, so no notebook is run twice.

nbval runs each code cell in a kernel and keeps the outputs it compares in the cell item's
``test_outputs`` (nbval 0.11, ``nbval/plugin.py``: ``IPyNbCell.runtest``); it never writes a
notebook. :class:`ExecutedNotebooks` (driven by the repository's conftest.py when
``CHEXNET_SAVE_EXECUTED`` names a folder: ``make test`` sets ``build/test/executed``) empties the
folder of notebooks when the session starts (so nothing there is from an earlier run), collects
nbval's outputs cell by cell and, after a notebook's last cell, writes the notebook with them to
``<folder>/<name>.ipynb``, stamped with where it ran (:mod:`chexnet_utils.notebook.run_record`).
A cell nbval skipped keeps its committed outputs; nbval drops widget messages, so progress
bars have no saved state (the site leaves them out).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from chexnet_utils.notebook.run_record import run_record, stamp
from chexnet_utils.platform.atomic import atomic_path

SAVE_ENV = "CHEXNET_SAVE_EXECUTED"
"""Where the notebook stage saves what nbval executed (emptied of notebooks first)."""
EXECUTED_ENV = "CHEXNET_EXECUTED_DIR"
"""Where the course-site test finds the executed course (tests/notebooks/test_course_site.py)."""


class ExecutedNotebooks:
    """Collects nbval's cell outputs and writes each notebook once its last cell is done."""

    def __init__(self, folder: Path, by: str = "make test (nbval)") -> None:
        self.folder = folder
        self.by = by
        for old in folder.glob("*.ipynb"):  # an earlier run's: never mixed with this one's
            old.unlink()
        self._outputs: dict[int, dict[int, list[Any]]] = {}  # id(notebook item) -> cell -> outs
        self._last: dict[int, Any] = {}
        self.written: list[Path] = []

    @staticmethod
    def is_cell(item: Any) -> bool:
        """Whether ``item`` is an nbval notebook cell."""
        return hasattr(item, "test_outputs") and hasattr(item, "cell_num")

    def add(self, item: Any) -> None:
        """Keep the outputs nbval got for ``item`` (after its call phase)."""
        if self.is_cell(item) and item.test_outputs is not None:
            self._outputs.setdefault(id(item.parent), {})[item.cell_num] = \
                copy.deepcopy(item.test_outputs)

    def finish(self, item: Any) -> Path | None:
        """After ``item``'s teardown: if it is its notebook's last cell, write the notebook."""
        if not self.is_cell(item):
            return None
        parent = item.parent
        if id(parent) not in self._last:
            cells = [i for i in item.session.items if i.parent is parent]
            self._last[id(parent)] = cells[-1] if cells else item
        if self._last[id(parent)] is not item:
            return None
        return self.write(parent)

    def write(self, parent: Any) -> Path:
        """Write the notebook of ``parent`` (nbval's notebook item) with the collected outputs."""
        import nbformat

        nb = copy.deepcopy(parent.nb)
        outputs = self._outputs.pop(id(parent), {})
        code = [c for c in nb.cells if c.cell_type == "code"]
        for n, cell in enumerate(code):
            if n in outputs:
                cell.outputs = outputs[n]
                cell.execution_count = n + 1
                for out in cell.outputs:
                    if "execution_count" in out:
                        out.execution_count = n + 1
        stamp(nb, run_record(self.by))
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / Path(str(parent.fspath)).name
        with atomic_path(path) as tmp:
            nbformat.write(nb, tmp)
        self.written.append(path)
        return path
