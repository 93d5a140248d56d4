"""What a learner reads: the markdown of a notebook outside its collapsed ``<details>`` blocks.

JupyterLab renders ``<details><summary>...</summary>`` in a markdown cell as a collapsed
block, so a notebook's core path is its visible markdown; provenance, history and expert
asides sit one click away. :func:`visible_words` counts that path (the course's limits, issue
#47: at most :data:`MAX_WORDS_PER_NOTEBOOK` per notebook and :data:`MAX_WORDS_TOTAL` over
00-09); :func:`details_problems` finds blocks a renderer would show wrongly (no blank line after
the summary, so the markdown inside stays raw; an unclosed or nested block).
``python -m chexnet_utils.notebook.reading`` prints the words and reading minutes per notebook.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

from chexnet_utils.notebook.cells import read_cells

__all__ = ["MAX_WORDS_PER_NOTEBOOK", "MAX_WORDS_TOTAL", "WORDS_PER_MINUTE", "details_problems",
           "visible_markdown", "visible_words"]

MAX_WORDS_PER_NOTEBOOK = 2500
MAX_WORDS_TOTAL = 18000
WORDS_PER_MINUTE = 200          # technical reading speed assumed by the agenda
_DETAILS = re.compile(r"<details\b.*?</details>", re.S | re.I)


def visible_markdown(text: str) -> str:
    """``text`` without its ``<details>...</details>`` blocks (a block's summary line too)."""
    return _DETAILS.sub(" ", text)


def _markdown(path: Path | str) -> list[tuple[str, str]]:
    return [(str(c.get("id", "")), "".join(c["source"])) for c in read_cells(path)
            if c["cell_type"] == "markdown"]


def visible_words(path: Path | str) -> int:
    """Words of the notebook's markdown a reader sees with every block collapsed."""
    return sum(len(visible_markdown(text).split()) for _, text in _markdown(path))


def details_problems(path: Path | str) -> list[str]:
    """``<details>`` blocks of the notebook's markdown that would not render as meant."""
    out = []
    for cid, text in _markdown(path):
        depth = 0
        for m in re.finditer(r"<(/?)details\b[^>]*>", text, re.I):
            depth += -1 if m.group(1) else 1
            if depth not in (0, 1):
                out.append(f"{cid}: nested or unopened <details>")
        if depth:
            out.append(f"{cid}: a <details> block is not closed")
        for _ in re.finditer(r"</summary>[ \t]*\n(?![ \t]*\n)", text):
            out.append(f"{cid}: no blank line after </summary> (the markdown inside stays raw)")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Print visible words and reading minutes per notebook (default: notebooks/*.ipynb)."""
    args = list(sys.argv[1:] if argv is None else argv)
    paths = [Path(a) for a in args] or sorted(Path("notebooks").glob("*.ipynb"))
    total = 0
    for p in paths:
        words = visible_words(p)
        total += words
        print(f"{p.name:<45} {words:6d} words  {words / WORDS_PER_MINUTE:5.1f} min")
    print(f"{'total':<45} {total:6d} words  {total / WORDS_PER_MINUTE:5.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
