"""Tables in notebooks: one helper so every table is built, rounded and aligned the same way.

A notebook passes rows (mappings or sequences) and gets back an ``IPython.display.Markdown``
object that JupyterLab renders as a table and nbval compares as text::

    from chexnet_utils.notebook.tables import table
    table([{"pipeline": "old", "img/s": 61.2}, {"pipeline": "new", "img/s": 124.9}])

The text is :func:`chexnet_utils.platform.markdown.markdown_table`'s (formats: floats with
``floatfmt``, integers with ``intfmt``, one for every column or a mapping per column, e.g.
``floatfmt={"*": ".1f", "idle": ".0%"}``; ``None`` an empty cell; ``|`` escaped), the same
text the commands print.

This is the one way a notebook shows a table: no ``print`` with ``f"{x:>10}"`` column widths
(``tests/unit/test_house.py`` checks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chexnet_utils.platform.markdown import (
    DEFAULT_FLOATFMT,
    DEFAULT_INTFMT,
    Formats,
    Row,
    markdown_table,
)

__all__ = ["markdown_table", "table"]  # the notebooks' two: displayed, or printed for nbval


def table(rows: Sequence[Row], columns: Sequence[str] | None = None,
          floatfmt: Formats = DEFAULT_FLOATFMT, align: Mapping[str, str] | None = None,
          caption: str | None = None, intfmt: Formats = DEFAULT_INTFMT) -> Any:
    """:func:`markdown_table` wrapped for display in a notebook (``IPython.display.Markdown``),
    with an optional caption line above it. The last expression of a cell displays itself;
    elsewhere in a cell use ``display(table(...))``."""
    from IPython.display import Markdown

    text = markdown_table(rows, columns, floatfmt, align, intfmt)
    return Markdown(f"{caption}\n\n{text}" if caption else text)
