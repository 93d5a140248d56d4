"""Headline figures the notebooks measure, collected in one JSON file for ``make tutorial``.

Each notebook calls :func:`record` with what it measured (a pipeline speed-up, a mean AUROC,
a scaling efficiency...). ``make tutorial`` prints them all as a table at the end; figures
are saved next to it by :func:`save_figure`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from chexnet_utils.config import work_dir
from chexnet_utils.platform.atomic import atomic_path, folder_lock, json_safe, write_json_atomic


def results_path() -> Path:
    """``<work dir>/results.json``."""
    return work_dir() / "results.json"


def figures_dir() -> Path:
    """``<work dir>/figures`` (created)."""
    path = work_dir() / "figures"
    path.mkdir(parents=True, exist_ok=True)
    return path


def load(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """All recorded results: ``{notebook: {name: value}}`` (empty if none yet)."""
    path = path or results_path()
    if not path.exists():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def record(notebook: str, values: Mapping[str, Any], path: Path | None = None) -> None:
    """Merge ``values`` into the results of ``notebook`` (atomic write, strict JSON).

    Values must be JSON-serialisable (numbers, strings, lists, dicts; numpy scalars and
    arrays are converted): :func:`~chexnet_utils.platform.atomic.json_safe`, so NaN and inf are
    written as ``null``.
    """
    path = path or results_path()
    # two notebooks (or a notebook and make tutorial) at the same time: the lock is on the
    # folder, as the file itself is replaced by every write and cannot carry it
    with folder_lock(path.parent):
        data = load(path)
        data.setdefault(notebook, {}).update(json_safe(dict(values)))
        write_json_atomic(path, data, sort_keys=True)


def save_figure(fig: Any, name: str) -> Path:
    """Save a matplotlib figure as ``<work dir>/figures/<name>.png`` (atomically: a reader
    never sees half a PNG) and return the path."""
    path = figures_dir() / f"{name}.png"
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png")
    return path


def table_rows(data: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    """Every recorded figure as ``(notebook, figure, value as text)``, sorted; long values
    shortened to 60 characters."""
    rows = []
    for nb in sorted(data):
        for key in sorted(data[nb]):
            value = data[nb][key]
            text = f"{value:.4g}" if isinstance(value, float) else json.dumps(value) \
                if isinstance(value, (list, dict)) else str(value)
            rows.append((nb, key, text if len(text) <= 60 else text[:57] + "..."))
    return rows


def format_table(data: Mapping[str, Mapping[str, Any]]) -> str:
    """Plain-text table of every recorded figure, one row per value (:func:`table_rows`)."""
    rows = [("notebook", "figure", "value"), *table_rows(data)]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
