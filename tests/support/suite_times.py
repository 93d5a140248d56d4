"""The suite's closing table (repository tooling, not part of the package): the budget, the
wall time of each stage and notebook, how busy the CPUs were, and where each test layer's
minutes go (setup, call, teardown). The root ``conftest.py`` prints it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path


def notebook_of(nodeid: str) -> str | None:
    """The notebook a pytest/nbval test id belongs to (``notebooks/02_x.ipynb::Cell 3`` ->
    ``notebooks/02_x.ipynb``), or ``None`` for an ordinary test."""
    path = nodeid.split("::", 1)[0]
    return path if path.endswith(".ipynb") else None


BUDGET_ENV = "CHEXNET_TEST_BUDGET_MIN"
DEFAULT_BUDGET_MIN = 15.0


def budget_minutes(environ: Mapping[str, str] | None = None) -> float:
    """The test suite's time budget in minutes: ``CHEXNET_TEST_BUDGET_MIN``, default 15.

    Raises ``ValueError`` naming the variable for anything but a positive finite number
    (checked when pytest starts, not after a 20-minute run)."""
    raw = (os.environ if environ is None else environ).get(BUDGET_ENV, "").strip()
    if not raw:
        return DEFAULT_BUDGET_MIN
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{BUDGET_ENV}={raw!r} is not a positive number of minutes")
    return value


CpuTicks = tuple[int, int]
"""``(busy, total)`` clock ticks of all CPUs since boot, from ``/proc/stat``."""


def cpu_ticks(stat_path: str | Path = "/proc/stat") -> CpuTicks | None:
    """All CPUs' busy and total clock ticks since boot (Linux ``/proc/stat``: idle and iowait
    are not busy); None where there is no such file. Two readings give the share of the
    machine a stretch of time used (:func:`busy_share`)."""
    try:
        with open(stat_path, encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    total = sum(ticks)
    return total - ticks[3] - ticks[4], total


def busy_share(start: CpuTicks | None, end: CpuTicks | None) -> float | None:
    """The share (0..1) of all CPUs' time that was busy between two :func:`cpu_ticks`
    readings; None when either is missing or no tick passed. Near 1, a stage gains nothing
    from more parallel workers: it is computing, not waiting."""
    if start is None or end is None or end[1] <= start[1]:
        return None
    return (end[0] - start[0]) / (end[1] - start[1])


def _busy(share: float | None) -> str:
    return "" if share is None else f"  CPU {100 * share:3.0f} % busy"


def work_floor_note(stages: Mapping[str, tuple[float, float | None]], cpus: int,
                    budget_minutes: float | None = None) -> str | None:
    """One line on the CPU work of ``make test``'s stages (``{stage: (wall s, busy share)}``,
    the share of all ``cpus`` CPUs busy meanwhile: :func:`busy_share`): their CPU-seconds and
    the least wall time that work needs on ``cpus`` CPUs however the stages are scheduled
    (work / cpus), against ``budget_minutes``. Every process on the machine counts, as in
    :func:`busy_share`. None when a share is unknown."""
    if cpus < 1 or not stages or any(b is None for _, b in stages.values()):
        return None
    work = {name: wall * float(b) * cpus for name, (wall, b) in stages.items()}  # type: ignore[arg-type]
    floor = sum(work.values()) / cpus
    parts = ", ".join(f"{name} {w:.0f}" for name, w in work.items())
    verdict = ""
    if budget_minutes is not None and floor > budget_minutes * 60:
        verdict = (f": over the {budget_minutes:g} min budget before any waiting, so only less "
                   "work can meet it, not more parallel workers")
    return (f"CPU work: {sum(work.values()):.0f} CPU-seconds ({parts}); on {cpus} CPUs at least "
            f"{floor / 60:.1f} min however the stages are scheduled{verdict}.")


def format_wall_times(times: dict[str, float], other_seconds: float = 0.0,
                      budget_minutes: float | None = None,
                      elapsed_seconds: float | None = None,
                      other_label: str = "other tests",
                      cpu_busy: Mapping[str, float | None] | None = None) -> str:
    """The table ``make test`` prints at the end: each notebook's wall time under nbval
    (kernel start, every cell, kernel stop), the other tests' time, and the total.

    ``times`` maps notebook path -> seconds; ``other_seconds`` is labelled ``other_label``
    (``make test`` passes the wall time of its parallel tests stage, labelled with its worker
    count). The total is ``elapsed_seconds`` when given (the real wall time, collection and
    start-up included), else the sum of the rows. With ``budget_minutes`` the last line says
    whether the total stays within it. ``cpu_busy`` maps a notebook path or ``other_label``
    to the share of the machine's CPUs busy meanwhile (:func:`busy_share`), shown per row.
    """
    busy = dict(cpu_busy or {})
    lines = ["notebook wall times (nbval: kernel start + every cell):"]
    width = max([len(Path(p).name) for p in times] + [len(other_label)])
    for path in sorted(times):
        lines.append(f"  {Path(path).name:<{width}}  {times[path] / 60:5.1f} min"
                     f"  ({times[path]:6.1f} s){_busy(busy.get(path))}")
    lines.append(f"  {other_label:<{width}}  {other_seconds / 60:5.1f} min"
                 f"  ({other_seconds:6.1f} s){_busy(busy.get(other_label))}")
    total = sum(times.values()) + other_seconds
    label = "total"
    if elapsed_seconds is not None:
        total, label = max(total, elapsed_seconds), "total wall"
    verdict = ""
    if budget_minutes is not None:
        ok = total <= budget_minutes * 60
        verdict = f"  {'within' if ok else 'OVER'} the {budget_minutes:g} min budget"
    lines.append(f"  {label:<{width}}  {total / 60:5.1f} min  ({total:6.1f} s){verdict}")
    return "\n".join(lines)


def write_stage_time(path: str | Path, stage: str, wall_seconds: float, workers: int = 0,
                     cpu_busy: float | None = None) -> None:
    """Record one stage of ``make test`` (its wall time, pytest-xdist worker count, 0 for a
    serial run, and the share of the CPUs it kept busy) in the JSON file ``path``, keeping
    the stages already there, so the last stage can print the whole suite's total against
    the budget."""
    path = Path(path)
    stages = read_stage_times(path)
    stages[stage] = {"wall_s": round(float(wall_seconds), 1), "workers": int(workers)}
    if cpu_busy is not None:
        stages[stage]["cpu_busy"] = round(float(cpu_busy), 3)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(stages, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_stage_times(path: str | Path) -> dict[str, dict[str, float]]:
    """The stages :func:`write_stage_time` recorded in ``path`` (``{}`` when there is no such
    file yet, or it is empty: ``mktemp`` made it). A file that is not such a record raises
    ``ValueError`` naming it."""
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    if not raw.strip():
        return {}
    try:
        stages = json.loads(raw)
        if not isinstance(stages, dict) or not all(
                isinstance(v, dict) and isinstance(v.get("wall_s"), (int, float))
                for v in stages.values()):
            raise ValueError("not a {stage: {wall_s, workers}} object")
    except ValueError as e:
        raise ValueError(f"{path}: not a record of make test's stage times ({e})") from None
    return stages


def layer_of_test(nodeid: str) -> str:
    """The test layer of a pytest id: ``tests/<layer>/...`` -> ``<layer>``, a notebook under
    nbval -> ``nbval``, anything else -> ``other``."""
    if notebook_of(nodeid) is not None:
        return "nbval"
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


def format_layer_times(phase_seconds: Mapping[tuple[str, str], float],
                       setups: Mapping[str, float], top: int = 8) -> str:
    """Where the minutes go: each layer's seconds in test setup (fixtures: clusters, data
    sets, kernels), call and teardown, and the slowest setups by test id (the fixtures worth
    sharing). ``phase_seconds`` maps (layer, phase) -> seconds; ``setups`` test id -> setup
    seconds."""
    layers = sorted({layer for layer, _ in phase_seconds})
    phases = ("setup", "call", "teardown")
    lines = ["test time by layer and phase (s):",
             f"  {'layer':<10}" + "".join(f"{ph:>10}" for ph in phases) + f"{'total':>10}"]
    for layer in layers:
        row = [phase_seconds.get((layer, ph), 0.0) for ph in phases]
        lines.append(f"  {layer:<10}" + "".join(f"{s:10.1f}" for s in row) + f"{sum(row):10.1f}")
    slow = sorted(setups.items(), key=lambda kv: -kv[1])[:top]
    if slow:
        lines.append(f"slowest setups (fixtures) of {len(setups)} tests:")
        lines += [f"  {s:7.1f} s  {nodeid}" for nodeid, s in slow]
    return "\n".join(lines)


def agenda_report(root: Path, cell_seconds: Mapping[str, Mapping[int, float]]) -> str:
    """Write this run's cell times to ``build/cell-times.json`` (by notebook file name and cell
    id, merged into what is there) and return :func:`chexnet_utils.notebook.agenda.check`'s
    table and problems: the agenda of ``docs/facilitator.md`` against this run."""
    import json

    from chexnet_utils.notebook import agenda
    from chexnet_utils.notebook.cells import read_cells

    ours = {nb: cells for nb, cells in cell_seconds.items()
            if (root / nb).parent == root / "notebooks" and (root / nb).exists()}
    if not ours:
        return "no notebook of notebooks/ ran: cell times and agenda not checked"
    out = root / "build" / "cell-times.json"
    times = agenda.read_cell_times(out) if out.exists() else {}
    for nb, cells in ours.items():
        path = root / nb
        ids = [str(c.get("id", "")) for c in read_cells(path) if c["cell_type"] == "code"]
        times[path.name] = {ids[i]: round(s, 2) for i, s in sorted(cells.items()) if i < len(ids)}
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(times, indent=1, sort_keys=True) + "\n")
        written = f"cell times written to {out}"
    except OSError as e:  # another account's build/ (make nonroot-check): report, go on
        written = f"cell times not written ({type(e).__name__}: {e})"
    notebooks = sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    try:
        rows = agenda.read_agenda((root / "docs" / "facilitator.md").read_text())
    except ValueError as e:
        return f"{written}; agenda: {e}"
    lines, problems = agenda.check(notebooks, rows, times)
    return "\n".join([written, *lines,
                      *(f"agenda problem: {p}" for p in problems)])
