"""The workshop agenda checked against the notebooks: reading, waiting and exercises.

``docs/facilitator.md`` holds the agenda as a table, one row per notebook part (``intro``,
``§1``, ..., ``summary``) and per exercise (``Ex 6``), with its minutes in a one-day and in a
two-day workshop (``-``: not in that plan; a part in the one-day plan is on the **core
path**). :func:`check` recomputes, for every row, the least time a learner needs: its visible
words at :data:`~chexnet_utils.notebook.reading.WORDS_PER_MINUTE` plus the seconds its cells
took in ``make test`` (CI mode; ``build/cell-times.json`` written by the notebook stage, or the
committed ``docs/cell-times.json``). An agenda row shorter than that, a part of a notebook
the agenda does not list, a day over :data:`DAY_MINUTES` or a core-path cell over
:data:`CORE_CELL_SECONDS` is a problem. ``python -m chexnet_utils.notebook.agenda`` prints
the table and the problems (exit 1 if any).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from chexnet_utils.notebook.cells import read_cells
from chexnet_utils.notebook.reading import WORDS_PER_MINUTE, visible_markdown

__all__ = ["CORE_CELL_SECONDS", "DAY_MINUTES", "AgendaRow", "Part", "check", "notebook_parts",
           "read_agenda", "read_cell_times"]

DAY_MINUTES = 390                # a workshop day: 6.5 h, breaks included
CORE_CELL_SECONDS = 60           # the longest wait on the core path, in CI mode
AGENDA_HEADER = "| notebook | part | one day | two days | what |"
_EXERCISE = re.compile(r"^\*\*Exercise (\d+)\.?\*\*")
_SECTION = re.compile(r"^## (?:(\d+)\.\s)?(.*)$", re.M)


@dataclass
class Part:
    """One part of a notebook: a ``##`` section or an exercise."""

    notebook: str                 # "04"
    key: str                      # "intro", "§3", "summary", "Ex 6"
    title: str
    words: int = 0
    cells: list[str] = field(default_factory=list)   # code cell ids


@dataclass
class AgendaRow:
    notebook: str                 # "04", or "-" for a break or the welcome
    key: str
    one_day: int | None           # minutes, None: not in that plan
    two_days: int | None
    what: str


def _section_key(heading: str) -> tuple[str, str] | None:
    m = _SECTION.match(heading)
    if m is None:
        return None
    number, title = m.group(1), m.group(2).strip()
    if number:
        return f"§{number}", title
    low = title.lower()
    for name in ("setup", "summary", "exercises", "results"):
        if low.startswith(name):
            return name, title
    return low.split()[0], title


def notebook_parts(path: Path | str) -> list[Part]:
    """The parts of a notebook in order: ``intro`` (title and setup), each numbered ``##``
    section, ``summary``, then one part per exercise (its statement, cells and solution)."""
    nb = Path(path).name[:2]
    parts = [Part(nb, "intro", "title and setup")]
    for cell in read_cells(path):
        if cell["cell_type"] != "markdown":
            parts[-1].cells.append(str(cell.get("id", "")))
            continue
        for line in visible_markdown("".join(cell["source"])).splitlines():
            ex = _EXERCISE.match(line.strip())
            key = _section_key(line) if line.startswith("## ") else None
            if ex:
                rest = line.strip()[ex.end():].strip()
                title = rest.split(". ")[0].rstrip(".:")
                for open_, close in (("(", ")"), ("`", "`"), ("**", "**"), ("*", "*")):
                    if (title.count(open_) - title.count(close) if open_ != close
                            else title.count(open_) % 2):      # cut at a mark left open
                        title = title[:title.rindex(open_)].rstrip(" ,:")
                title = title or f"exercise {ex.group(1)}"
                parts.append(Part(nb, f"Ex {ex.group(1)}", title))
            elif key and key[0] != "setup":
                name = {"exercises": "summary", "results": "summary"}.get(key[0], key[0])
                if name != parts[-1].key:
                    parts.append(Part(nb, name, key[1]))
            parts[-1].words += len(line.split())
    return parts


def read_agenda(text: str) -> list[AgendaRow]:
    """The agenda table of ``docs/facilitator.md`` (the table under :data:`AGENDA_HEADER`)."""
    lines = text.splitlines()
    try:
        start = lines.index(AGENDA_HEADER)
    except ValueError:
        raise ValueError(f"no agenda table (header {AGENDA_HEADER!r})") from None
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) != 5 or cols[0].startswith("**"):
            continue

        def minutes(s: str) -> int | None:
            return None if s in ("-", "") else int(s)

        rows.append(AgendaRow(cols[0], cols[1], minutes(cols[2]), minutes(cols[3]), cols[4]))
    return rows


def read_cell_times(path: Path | str) -> dict[str, dict[str, float]]:
    """``{notebook: {cell id: seconds}}`` as ``make test``'s notebook stage wrote it."""
    data = json.loads(Path(path).read_text())
    return {str(k): {str(c): float(s) for c, s in v.items()} for k, v in data.items()}


def need_minutes(part: Part, times: Mapping[str, float]) -> float:
    """The least minutes a learner spends on ``part``: reading its visible words and waiting
    for its cells (CI mode)."""
    return part.words / WORDS_PER_MINUTE + sum(times.get(c, 0.0) for c in part.cells) / 60


def check(notebooks: Sequence[Path], agenda: Sequence[AgendaRow],
          times: Mapping[str, Mapping[str, float]]) -> tuple[list[str], list[str]]:
    """``(table lines, problems)`` of the agenda against the notebooks and the cell times."""
    by_key = {(r.notebook, r.key): r for r in agenda}
    lines = [f"{'part':<14}{'words':>6}{'cells s':>9}{'need':>7}{'1 day':>7}{'2 days':>8}"]
    problems: list[str] = []
    listed = set()
    slowest = (0.0, "")
    for path in notebooks:
        nb = path.name[:2]
        nb_times = times.get(path.name, {})
        for part in notebook_parts(path):
            listed.add((nb, part.key))
            need = need_minutes(part, nb_times)
            row = by_key.get((nb, part.key))
            if row is None:
                problems.append(f"{nb} {part.key} ({part.title}) is not in the agenda")
                continue
            cell_s = sum(nb_times.get(c, 0.0) for c in part.cells)
            lines.append(f"{nb + ' ' + part.key:<14}{part.words:>6}{cell_s:>9.0f}{need:>7.1f}"
                         f"{row.one_day if row.one_day is not None else '-':>7}"
                         f"{row.two_days if row.two_days is not None else '-':>8}")
            for plan, minutes in (("one day", row.one_day), ("two days", row.two_days)):
                if minutes is not None and minutes < need:
                    problems.append(f"{nb} {part.key}: {minutes} min in the {plan} plan, but "
                                    f"reading and waiting alone take {need:.1f}")
            if row.one_day is not None:
                for c in part.cells:
                    if nb_times.get(c, 0.0) > slowest[0]:
                        slowest = (nb_times[c], f"{path.name} cell {c}")
    problems += [f"the agenda lists {r.notebook} {r.key}, which no notebook has" for r in agenda
                 if r.notebook != "-" and (r.notebook, r.key) not in listed]
    for plan, days in (("one day", 1), ("two days", 2)):
        total = sum((r.one_day if days == 1 else r.two_days) or 0 for r in agenda)
        lines.append(f"{plan}: {total} min ({total / 60:.1f} h, limit {days * DAY_MINUTES})")
        if total > days * DAY_MINUTES:
            problems.append(f"the {plan} plan takes {total} min, over {days * DAY_MINUTES}")
    lines.append(f"longest core-path cell: {slowest[0]:.0f} s ({slowest[1] or 'none timed'})")
    if slowest[0] > CORE_CELL_SECONDS:
        problems.append(f"a core-path cell takes {slowest[0]:.0f} s, over {CORE_CELL_SECONDS}: "
                        f"{slowest[1]}")
    return lines, problems


def main(argv: Sequence[str] | None = None) -> int:
    """Print the agenda check: ``[--times FILE] [--agenda FILE]`` (defaults: this checkout's
    last ``make test`` run, ``build/cell-times.json``, else the committed
    ``docs/cell-times.json``; ``docs/facilitator.md``)."""
    parser = argparse.ArgumentParser(prog="python -m chexnet_utils.notebook.agenda",
                                     description=main.__doc__)
    parser.add_argument("--times", type=Path, default=None)
    parser.add_argument("--agenda", type=Path, default=Path("docs/facilitator.md"))
    args = parser.parse_args(argv)
    times_path = args.times or next((p for p in (Path("build/cell-times.json"),
                                                  Path("docs/cell-times.json")) if p.exists()),
                                    None)
    times = read_cell_times(times_path) if times_path else {}
    notebooks = sorted(Path("notebooks").glob("[0-9][0-9]_*.ipynb"))
    lines, problems = check(notebooks, read_agenda(args.agenda.read_text()), times)
    print(f"cell times: {times_path or 'none (reading only)'}")
    print("\n".join(lines))
    print("\n".join(f"problem: {p}" for p in problems) or "agenda fits the notebooks")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
