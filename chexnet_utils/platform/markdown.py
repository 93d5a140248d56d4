"""Tables as text: the rows as a GitHub-flavoured markdown table, so every table the package
shows is built, rounded and aligned the same way, whether a notebook displays it
(:func:`chexnet_utils.notebook.tables.table`) or a command prints it (``bench link``, a
benchmark result's ``str()``).

Floats are formatted with ``floatfmt`` and integers with ``intfmt``, each one format for every
column or a mapping per column (its ``"*"`` entry, if any, is the default of the columns it
does not name), e.g. ``floatfmt={"*": ".1f", "idle": ".0%"}``, ``intfmt={"images": ","}``.
NumPy scalars count as numbers; ``None`` prints as an empty cell; ``|`` in a cell is escaped
so it cannot break the row.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["DEFAULT_FLOATFMT", "DEFAULT_INTFMT", "Formats", "Row", "markdown_table"]

Row = Mapping[str, Any] | Sequence[Any]
Formats = str | Mapping[str, str]

DEFAULT_FLOATFMT = ".3g"
DEFAULT_INTFMT = ""


def _is_bool(value: Any) -> bool:
    """``True`` / ``False``, NumPy's included (``dtype.kind == "b"``)."""
    return isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", "") == "b"


def _is_number(value: Any) -> bool:
    """Ints and floats, NumPy's included; not booleans (they print as yes / no)."""
    return isinstance(value, numbers.Real) and not _is_bool(value)


def _column_formats(fmt: Formats, columns: Sequence[str], default: str) -> dict[str, str]:
    if isinstance(fmt, str):
        return dict.fromkeys(columns, fmt)
    fallback = fmt.get("*", default)
    return {c: fmt.get(c, fallback) for c in columns}


def _cell(value: Any, floatfmt: str, intfmt: str = DEFAULT_INTFMT) -> str:
    if value is None:
        return ""
    if _is_bool(value):
        return "yes" if value else "no"
    if _is_number(value):
        if isinstance(value, numbers.Integral):
            return format(int(value), intfmt)
        return format(float(value), floatfmt)
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[Row], columns: Sequence[str] | None = None,
                   floatfmt: Formats = DEFAULT_FLOATFMT,
                   align: Mapping[str, str] | None = None,
                   intfmt: Formats = DEFAULT_INTFMT) -> str:
    """The rows as a GitHub-flavoured markdown table (text).

    ``rows`` are mappings (``columns`` defaults to the keys of the first row, in order) or
    sequences (then ``columns`` is required and each row must have that many cells).
    ``floatfmt`` / ``intfmt``: format specs for floats / integers (module docstring).
    ``align`` maps a column to ``"left"``/``"right"``/``"center"``; numbers default to right.
    Raises ``ValueError`` for an empty header, a row of the wrong length or an unknown
    alignment.
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
    ffmt = _column_formats(floatfmt, columns, DEFAULT_FLOATFMT)
    ifmt = _column_formats(intfmt, columns, DEFAULT_INTFMT)
    numeric = {c: bool(body) and all(_is_number(r[j]) for r in body if r[j] is not None)
               for j, c in enumerate(columns)}
    marks = {"left": ":---", "right": "---:", "center": ":---:"}
    wanted = {c: (align or {}).get(c, "right" if numeric[c] else "left") for c in columns}
    unknown = {c: a for c, a in wanted.items() if a not in marks}
    if unknown:
        raise ValueError(f"align must be one of {sorted(marks)}, got {unknown}")
    rule = [marks[wanted[c]] for c in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(_cell(v, ffmt[c], ifmt[c])
                                for v, c in zip(r, columns, strict=True)) + " |"
              for r in body]
    return "\n".join(lines)
