"""Where a notebook was executed, written into the executed notebook itself, so that a page
built from it (``make book``) can say on what machine its numbers were measured.

``make tutorial`` (:mod:`chexnet_utils.notebook.tutorial`) and ``make test``'s notebook stage
(the repository's conftest.py) call :func:`stamp` with :func:`run_record` on every notebook they
execute; :func:`describe_run` turns the record into the sentence a page shows.
"""

from __future__ import annotations

import datetime
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from chexnet_utils.config import scale
from chexnet_utils.hardware.devices import usable_cores, visible_gpus

META_KEY = "chexnet"
"""The notebook metadata key holding :func:`stamp`'s record of the run (``["executed"]``)."""


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else :func:`platform.processor`."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run_record(by: str) -> dict[str, Any]:
    """What a reader needs to weigh a page's numbers: cores, CPU, GPUs, scale preset, date,
    Python, and ``by``, the command that ran the notebook."""
    return {
        "by": by,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": usable_cores(),
        "cpu": cpu_model(),
        "gpus": [gpu.name for gpu in visible_gpus()],  # CUDA_VISIBLE_DEVICES="" -> none
        "scale": scale().name,
        "python": platform.python_version(),
    }


def stamp(nb: Any, record: Mapping[str, Any]) -> None:
    """Write ``record`` (:func:`run_record`) into the notebook's metadata."""
    nb.metadata.setdefault(META_KEY, {})["executed"] = dict(record)


def describe_run(record: Mapping[str, Any] | None) -> str:
    """One sentence (markdown) naming the machine and run of ``record``."""
    if not record:
        return "an unrecorded run (this notebook carries no record of where it ran)"
    gpus = record.get("gpus") or []
    gpu = f"{len(gpus)} GPU(s): {', '.join(gpus)}" if gpus else "**no GPU**"
    return (f"**{record.get('cores')} CPU cores** ({record.get('cpu')}), {gpu}, scale preset "
            f"**{record.get('scale')}**, {record.get('date')}, by `{record.get('by')}` "
            f"(Python {record.get('python')})")


def describe_runs(records: Sequence[Mapping[str, Any] | None]) -> list[str]:
    """:func:`describe_run` for a set of notebooks: one line per machine and command (the
    dates as a range), in order of first appearance."""
    groups: dict[str, list[str]] = {}
    for record in records:
        if not record:
            groups.setdefault(describe_run(None), [])
            continue
        key = describe_run({**record, "date": "{date}"})
        groups.setdefault(key, []).append(str(record.get("date")))
    lines = []
    for key, dates in groups.items():
        when = (min(dates) if min(dates) == max(dates) else
                f"{min(dates)} to {max(dates)}") if dates else ""
        lines.append(key.replace("{date}", when))
    return lines


def recorded_run(nb: Any) -> dict[str, Any] | None:
    """The record :func:`stamp` wrote into the notebook, if any."""
    return nb.metadata.get(META_KEY, {}).get("executed")
