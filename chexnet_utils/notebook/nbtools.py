"""Keeping notebooks clean in git: no outputs except the ones nbval checks.

Cells whose source contains ``# NBVAL_CHECK_OUTPUT`` keep their output in the repository:
nbval (``--nbval-lax``) compares it with a fresh run. Every other cell is committed empty.
``python -m chexnet_utils nbclean [--execute] NOTEBOOK...`` enforces that;
:func:`hygiene_problems` is what the test suite checks; so is :func:`prose_number_problems`:
a figure in a markdown cell is computed by this run or labelled with its source.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

CHECK_MARK = "NBVAL_CHECK_OUTPUT"
_VOLATILE_META = ("execution", "collapsed", "scrolled")
_VOLATILE_NB_META = ("widgets",)
"""Notebook-level metadata a run leaves behind: ``widgets`` is the saved state of every
progress bar (tqdm) the run displayed, kilobytes of ids that change on every run."""


def _is_checked(cell: dict) -> bool:
    return cell.get("cell_type") == "code" and CHECK_MARK in "".join(cell.get("source", ""))


def clean_notebook(path: Path, execute: bool = False, timeout: int = 1800) -> None:
    """Strip outputs and execution counts, keeping those of checked cells.

    With ``execute=True`` the notebook is first run top to bottom (in its own folder, in a
    fresh kernel), so checked cells get fresh outputs to commit.
    """
    import nbformat

    from chexnet_utils.platform.atomic import atomic_path

    nb = nbformat.read(path, as_version=4)
    if execute:
        from nbclient import NotebookClient

        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    for key in _VOLATILE_NB_META:
        nb.metadata.pop(key, None)
    for cell in nb.cells:
        for key in _VOLATILE_META:
            cell.metadata.pop(key, None)
        if cell.cell_type != "code":
            continue
        if not _is_checked(cell):
            # nbval needs a checked cell's execution count ("unrun reference cell" otherwise)
            cell.execution_count = None
            cell.outputs = []
    with atomic_path(path) as tmp:  # the committed notebook: never left half-written
        nbformat.write(nb, tmp)


def hygiene_problems(path: Path) -> list[str]:
    """What is wrong with a committed notebook.

    Saved widget state; outputs or execution counts in cells nbval does not check; checked
    cells without output
    or execution count; checked cells whose execution counts are not increasing (a sign they
    were run out of order, so a top-to-bottom run may not reproduce them).
    """
    import nbformat

    nb = nbformat.read(path, as_version=4)
    problems = [f"{path.name}: notebook metadata {key!r} committed (saved widget state)"
                for key in _VOLATILE_NB_META if key in nb.metadata]
    last_count = 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if not _is_checked(cell):
            if cell.outputs:
                problems.append(f"{path.name} cell {i}: output committed in a cell nbval "
                                "does not check")
            if cell.execution_count is not None:
                problems.append(f"{path.name} cell {i}: execution count "
                                f"{cell.execution_count} committed")
            continue
        if not cell.outputs or cell.execution_count is None:
            problems.append(f"{path.name} cell {i}: checked cell was not run before committing")
            continue
        if cell.execution_count <= last_count:
            problems.append(f"{path.name} cell {i}: execution count {cell.execution_count} "
                            f"after {last_count}: run top to bottom before committing")
        last_count = cell.execution_count
    return problems


def clean_all(paths: Sequence[Path], execute: bool = False) -> None:
    """:func:`clean_notebook` over several notebooks, printing each name."""
    for p in paths:
        print(f"cleaning {p}{' (executing first)' if execute else ''}", flush=True)
        clean_notebook(Path(p), execute=execute)


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


# --- Only live numbers in prose -------------------------------------------------------------
#
# A figure in a notebook's markdown is either rendered by a cell from this run's variables, or
# a reference labelled with its source (and machine): a learner compares the prose with their
# own output, so an unlabelled figure from the authors' machine reads as a promise.
#
# What looks measured: a number with a unit of time, rate, size or share (``89.8 img/s``,
# ``8.5 ms``, ``900 MB``, ``20 %``), a speed-up (``2.4x``) or a bare decimal in running text
# (``0.71``). What does not: unit-less integers (14 pathologies, 112,120 images, batch 16,
# 8 GPUs, step 3, 2017); versions (TensorFlow 1.13.1, Python 3.6, arXiv ids) and section
# numbers; 0.5 and 1.0 (chance, perfect, a sigmoid's middle); counts in millions (7.0 M
# parameters); sizes of what the data or the model *is* (28 MB of gradients, 4 KiB tensors,
# 100 MB shard files); settings (``set to 10 ms``, ``STEP_COMPUTE_S = 0.1 s``); literals in
# code (only the comments of a fenced block are prose). A figure is *labelled* when its
# sentence (list item, table row, enclosing parenthesis) names a source: a paper, the
# articles, Dell, AWS, NIH, docs/benchmarks.md, the authors' run, a default or an assumption.

PROSE_NUMBER_OK = "prose-number-ok"
"""``<!-- prose-number-ok: reason -->`` in a paragraph accepts that paragraph's figures (the
odd false positive, such as arithmetic on an exercise's given numbers; the reason is
required)."""

_N = r"(?<![\w.])\d(?:[\d,]*\d)?(?:\.\d+)?"
_SIZE_UNIT = r"(?:[kKMGT]i?B|[kMGT]bytes?)"
_UNIT = (r"(?:img/s|images?/s|images per second|samples/s|steps?/s|it/s"
         r"|[kKMGT]i?B/s|[GMk]bit/s|[GMk]b/s|[GMk]bit|" + _SIZE_UNIT +
         r"|ms|us|µs|μs|ns|s|secs?|seconds?|min|minutes?|h|hours?"
         r"|%|percent|TFLOPS|GFLOPS)(?![\w/])")
_MEASURED = re.compile(
    rf"(?P<unit>{_N}\s?{_UNIT})"                       # 89.8 img/s, 8.5 ms, 20 %
    rf"|(?P<speedup>{_N}[x×](?!\w))"                     # 2.4x (not "8 x 8", "4 x p4d")
    r"|(?P<ratio>(?<![\w.])\d+\.\d+(?!\.?\d|\w|\s?(?:M|k|million|billion)\b))")  # 0.71
_LABEL = re.compile(
    r"reference|\bpaper\b|\barticles?\b|Rajpurkar|Goyal|\bDell\b|\bAWS\b|NVIDIA|\bNIH\b"
    r"|docs/benchmarks\.md|source:|measured by the authors|authors' (?:run|machine)"
    r"|et al\.|documentation|\bdocs\b|\bdefaults?\b|specification|\bassum(?:e|ed|ption)\b",
    re.IGNORECASE)
_DEFINED_SIZE = re.compile(r"gradient|parameter|tensor|float|message|PNG|TFRecord|shard"
                            r"|\bfiles?\b", re.IGNORECASE)
_VERSIONED = re.compile(
    r"(?:python|tensorflow|keras|horovod|mpi|nccl|cudnn|cuda|ubuntu|version|release|v"
    r"|arxiv:|sections?|§)(?:\s+[\d.]+\s+vs\.?)?[\s<>=~]*$", re.IGNORECASE)
_SETTING = re.compile(r"(?:\bset to|`[A-Za-z_][\w.]*`\s*(?:to|=)|=)\s*~?$")
_ROUND = {"0.0", "0.5", "1.0"}
_BOUNDARY = re.compile(
    r"\n\s*\n"                                  # paragraph
    r"|\n(?=\s*(?:[-*+]|\d+\.)\s)"              # list item
    r"|(?<![^\n])[ \t]*[|#][^\n]*"              # a table row or a heading is its own segment
    r"|(?<!e\.g)(?<!i\.e)(?<!\bal)(?<!\bvs)(?<!\bcf)[.!?](?=\s)")  # sentence end


def _spans(text: str, pattern: str, flags: int = 0) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(pattern, text, flags)]


def _inside(pos: int, spans: list[tuple[int, int]]) -> tuple[int, int] | None:
    return next((s for s in spans if s[0] <= pos < s[1]), None)


def _segment(text: str, start: int, end: int) -> str:
    """The sentence (list item, table row) around ``text[start:end]``, plus the parenthesis
    that encloses it, if any (a parenthesis may span sentences)."""
    lo, hi = 0, len(text)
    for m in _BOUNDARY.finditer(text):
        if m.end() <= start:
            lo = m.end()
        elif m.start() >= end:
            hi = m.start()
            break
        elif m.group(0).lstrip().startswith(("|", "#")):  # the match is in this row/heading
            return m.group(0)
    seg = text[lo:hi]
    depth = 0
    for i in range(start - 1, max(-1, start - 600), -1):
        depth += {")": 1, "(": -1}.get(text[i], 0)
        if depth < 0:
            close = text.find(")", end)
            return seg + " " + text[i:close + 1 if close >= 0 else len(text)]
    return seg


def unlabelled_numbers(markdown: str) -> list[str]:
    """Figures in ``markdown`` that look measured and name no source: one snippet each."""
    fences = _spans(markdown, r"^[ \t]*```[^\n]*\n.*?^[ \t]*```", re.M | re.S)
    comments = [(f[0] + m.start(), f[0] + m.end()) for f in fences
                for m in re.finditer(r"(?<=\s)#[^\n]*", markdown[f[0]:f[1]])]
    code_spans = _spans(markdown, r"`[^`\n]+`")
    lines = _spans(markdown, r"[^\n]+")
    ok_paragraphs = [p for p in _spans(markdown, r"(?:[^\n]|\n(?![ \t]*\n))+")
                     if re.search(PROSE_NUMBER_OK + r":\s*\w", markdown[p[0]:p[1]])]
    found = []
    for m in _MEASURED.finditer(markdown):
        s, e = m.span()
        before = markdown[max(0, s - 40):s]
        fence, span = _inside(s, fences), _inside(s, code_spans)
        if _inside(s, ok_paragraphs) or _SETTING.search(before):
            continue
        if not fence and markdown[_inside(s, lines)[0]:].lstrip().startswith("#"):
            continue  # a heading: "### 5.1 ..."
        if span and "=" in markdown[span[0]:span[1]]:
            continue  # `STEP_COMPUTE_S = 0.1 s`: a setting written as code
        if m.lastgroup == "ratio":
            if (fence and not _inside(s, comments)) or span or m.group(0) in _ROUND:
                continue
            if _VERSIONED.search(before):
                continue
        if fence:
            line = _inside(s, lines)
            segment = markdown[line[0]:line[1]]
        else:
            segment = _segment(markdown, s, e)
        if _LABEL.search(segment):
            continue
        if m.lastgroup == "unit" and re.search(_SIZE_UNIT + r"$", m.group(0)) \
                and _DEFINED_SIZE.search(segment):
            continue
        found.append(" ".join(markdown[max(0, s - 40):e + 20].split()))
    return found


def prose_number_problems(path: Path) -> list[str]:
    """Unlabelled, measured-looking figures in the markdown cells of a notebook, as
    ``"<notebook> cell <index>: ...<snippet>..."``."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    return [f"{path.name} cell {i}: ...{snippet}..."
            for i, cell in enumerate(nb.cells) if cell.cell_type == "markdown"
            for snippet in unlabelled_numbers(cell.source)]
