"""Tables in notebooks: one helper so every table is built, rounded and aligned the same way.

A notebook passes rows (mappings or sequences) and gets back an ``IPython.display.Markdown``
object that JupyterLab renders as a table and nbval compares as text::

    from chexnet_utils.tables import table
    table([{"pipeline": "old", "img/s": 61.2}, {"pipeline": "new", "img/s": 124.9}])

Numbers are formatted with ``floatfmt`` (per column if a mapping is given); ``None`` prints as
an empty cell; ``|`` in a cell is escaped so it cannot break the row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Row = Mapping[str, Any] | Sequence[Any]


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format(value, fmt)
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[Row], columns: Sequence[str] | None = None,
                   floatfmt: str | Mapping[str, str] = ".3g",
                   align: Mapping[str, str] | None = None) -> str:
    """The rows as a GitHub-flavoured markdown table (text).

    ``rows`` are mappings (``columns`` defaults to the keys of the first row, in order) or
    sequences (then ``columns`` is required and each row must have that many cells).
    ``align`` maps a column to ``"left"``/``"right"``/``"center"``; numbers default to right.
    Raises ``ValueError`` for an empty header or a row of the wrong length.
    """
    if columns is None:
        if not rows or not isinstance(rows[0], Mapping):
            raise ValueError("columns are required unless rows are mappings")
        columns = list(rows[0].keys())
    columns = list(columns)
    if not columns:
        raise ValueError("a table needs at least one column")
    body: list[list[Any]] = []
    for i, row in enumerate(rows):
        if isinstance(row, Mapping):
            body.append([row.get(c) for c in columns])
        else:
            cells = list(row)
            if len(cells) != len(columns):
                raise ValueError(f"row {i} has {len(cells)} cells, the header {len(columns)}")
            body.append(cells)
    fmts = {c: (floatfmt.get(c, ".3g") if isinstance(floatfmt, Mapping) else floatfmt)
            for c in columns}
    numeric = {c: bool(body) and all(isinstance(r[j], (int, float)) and not isinstance(r[j], bool)
                                     for r in body if r[j] is not None)
               for j, c in enumerate(columns)}
    marks = {"left": ":---", "right": "---:", "center": ":---:"}
    rule = [marks[(align or {}).get(c, "right" if numeric[c] else "left")] for c in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(_cell(v, fmts[c]) for v, c in zip(r, columns)) + " |"
              for r in body]
    return "\n".join(lines)


def table(rows: Sequence[Row], columns: Sequence[str] | None = None,
          floatfmt: str | Mapping[str, str] = ".3g", align: Mapping[str, str] | None = None,
          caption: str | None = None) -> Any:
    """:func:`markdown_table` wrapped for display in a notebook (``IPython.display.Markdown``),
    with an optional caption line above it."""
    from IPython.display import Markdown

    text = markdown_table(rows, columns, floatfmt, align)
    return Markdown(f"{caption}\n\n{text}" if caption else text)
