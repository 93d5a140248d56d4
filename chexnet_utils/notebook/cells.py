"""A notebook's cells as code to run elsewhere: the lesson code itself, not a copy of it.

``make gpu-smoke`` runs notebook 03 up to a section with the GPU switches on, and the tests run
a notebook's lesson cells (a ``train_step``, the ``%%px`` cells of the six Horovod changes)
under settings the notebook run does not use. Both take the code from the notebook file, so
a change to the lesson is what gets tested.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

PX_MAGIC = "%%px"


def read_cells(path: Path | str) -> list[dict[str, Any]]:
    """The notebook's cells (nbformat 4 JSON), each with its ``source`` joined into one string."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    return [{**cell, "source": "".join(cell.get("source", ""))} for cell in nb["cells"]]


def code_cell(path: Path | str, marker: str) -> str:
    """The source of the one code cell that contains ``marker`` (``ValueError`` if none or
    several do, so a test never runs the wrong cell), without a leading ``%%px`` line."""
    hits = [c["source"] for c in read_cells(path)
            if c["cell_type"] == "code" and marker in c["source"]]
    if len(hits) != 1:
        raise ValueError(f"{Path(path).name}: {len(hits)} code cells contain {marker!r}, "
                         "expected exactly one")
    return strip_px(hits[0])


def strip_px(source: str) -> str:
    """A ``%%px`` cell's body (the code each engine runs); other cells unchanged."""
    first, _, rest = source.partition("\n")
    return rest if first.strip().startswith(PX_MAGIC) else source


def definition(source: str, name: str) -> str:
    """The source of the top-level ``def``/``class`` called ``name`` in a cell (with its
    decorators), so one definition of a cell that also runs things can be taken alone."""
    tree = ast.parse(source)
    lines = source.splitlines()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return "\n".join(lines[first - 1:node.end_lineno]) + "\n"
    raise ValueError(f"no top-level def or class {name!r} in the cell")


def cells_before(path: Path | str, heading: str) -> dict[str, Any]:
    """The notebook (nbformat 4 JSON, outputs cleared) cut before the markdown cell that starts
    with ``heading`` (e.g. ``"## 4."``): the sections before it, to run on their own."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    at = next((i for i, cell in enumerate(nb["cells"]) if cell["cell_type"] == "markdown"
               and "".join(cell["source"]).startswith(heading)), None)
    if at is None:
        raise ValueError(f"{Path(path).name}: no markdown cell starts with {heading!r}")
    cells = [dict(c, outputs=[], execution_count=None) if c["cell_type"] == "code" else c
             for c in nb["cells"][:at]]
    return {**nb, "cells": cells}


def written_file(path: Path | str, target: str) -> str:
    """The file a notebook's ``%%writefile`` cells write to ``target`` (as the magic's line
    spells it, e.g. ``{SCRIPT}``): the first cell's body, then each ``%%writefile -a`` one's,
    in order (``ValueError`` if no cell writes it or the first one appends)."""
    parts: list[tuple[bool, str]] = []
    for cell in read_cells(path):
        first, _, body = cell["source"].partition("\n")
        words = first.split()
        if cell["cell_type"] != "code" or not words or words[0] != "%%writefile":
            continue
        if words[-1] == target:
            parts.append(("-a" in words[1:-1], body))
    if not parts or parts[0][0]:
        raise ValueError(f"{Path(path).name}: no %%writefile cell starts {target!r}")
    if any(not append for append, _ in parts[1:]):
        raise ValueError(f"{Path(path).name}: {target!r} is written anew after its first cell")
    return "".join(body if body.endswith("\n") else body + "\n" for _, body in parts)
