"""Horovod timelines: recorded on the workers, read (even half-written), summarised.

A Horovod timeline is a Chrome-trace JSON file that rank 0 writes while training runs: per
tensor, when it was negotiated, reduced, copied into and out of the fusion buffer.
:func:`record_timeline` records some steps on demand (``HOROVOD_TIMELINE=DYNAMIC``),
:func:`wait_for_timeline` waits for the writer thread, :func:`parse_timeline` turns the file
into :class:`TimelineEvent` spans, :func:`timeline_summary` / :func:`busy_time_us` sum them
up. The Gantt chart is :func:`chexnet_utils.plots.plot_timeline`.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chexnet_utils.comm.collectives import barrier

# ---------------------------------------------------------------------------------------
# Horovod timeline
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimelineEvent:
    """One span (or instant) of a Horovod timeline.

    ``tensor``: the tensor's name (Horovod's ``process_name`` of the trace row). ``phase``:
    what happened (``NEGOTIATE_ALLREDUCE``: waiting until every worker has the tensor ready;
    ``ALLREDUCE``: the whole reduction; inside it ``MPI_ALLREDUCE`` / ``NCCL_ALLREDUCE`` /
    ``MEMCPY_IN_FUSION_BUFFER`` / ``MEMCPY_OUT_FUSION_BUFFER`` ...; ``READY``: the instant
    worker ``rank`` reported the tensor ready). ``start_us`` / ``duration_us``: microseconds
    since the timeline started. ``depth``: nesting level (0 = top-level phase).
    ``complete``: False for a span still open when the file ended (truncated timeline).
    """

    tensor: str
    phase: str
    start_us: float
    duration_us: float
    depth: int = 0
    rank: int | None = None
    complete: bool = True
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def end_us(self) -> float:
        return self.start_us + self.duration_us


def read_trace_records(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a Chrome-trace array, tolerating an unfinished file.

    Horovod writes ``[`` then one object after another while training runs and adds the
    closing ``]`` only when the timeline is stopped; a file read in the middle can also end
    inside an object. Objects are decoded one by one and reading stops at the first
    incomplete one.
    """
    decoder = json.JSONDecoder()
    start = text.find("[")
    if start < 0:
        return []
    pos, out = start + 1, []
    n = len(text)
    while pos < n:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n or text[pos] == "]":
            break
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        if isinstance(obj, dict):
            out.append(obj)
    return out


def parse_timeline(path: str | os.PathLike[str] | None = None, text: str | None = None
                   ) -> list[TimelineEvent]:
    """Events of a Horovod timeline file (Chrome trace JSON), sorted by start time.

    The file holds, per tensor (a trace "process", ``pid``, named by a metadata record),
    ``B``/``E`` records (begin/end of a phase, nested: ``ALLREDUCE`` contains
    ``MPI_ALLREDUCE``...) and ``X`` records (instants: in ``NEGOTIATE_*``, one per worker,
    named by its rank). Begin/end pairs are matched per tensor with a stack. Works on a file
    that is still being written (see :func:`read_trace_records`): spans left open are
    returned with ``complete=False``, ending at the last time stamp seen.
    """
    if text is None:
        if path is None:
            raise ValueError("give a path or the text")
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    records = read_trace_records(text)
    names: dict[Any, str] = {}
    stacks: dict[Any, list[tuple[str, float]]] = {}
    events: list[TimelineEvent] = []
    last_ts = 0.0
    for r in records:
        ph, pid = r.get("ph"), r.get("pid")
        if ph == "M":
            if r.get("name") == "process_name" and "name" in r.get("args", {}):
                names[pid] = str(r["args"]["name"])
            continue
        ts = float(r.get("ts", last_ts))
        last_ts = max(last_ts, ts)
        tensor = names.get(pid, f"tensor {pid}")
        stack = stacks.setdefault(pid, [])
        if ph == "B":
            stack.append((str(r.get("name", "?")), ts))
        elif ph == "E":
            if stack:
                phase, t0 = stack.pop()
                events.append(TimelineEvent(tensor, phase, t0, ts - t0, len(stack),
                                            args=dict(r.get("args", {}))))
        elif ph == "X":
            name = str(r.get("name", ""))
            rank = int(name) if name.isdigit() else None
            events.append(TimelineEvent(tensor, "READY" if rank is not None else name, ts,
                                        float(r.get("dur", 0)), len(stack), rank=rank))
        elif ph in ("i", "I"):
            events.append(TimelineEvent(tensor, str(r.get("name", "")), ts, 0.0, len(stack)))
    for pid, stack in stacks.items():
        tensor = names.get(pid, f"tensor {pid}")
        for depth, (phase, t0) in enumerate(stack):
            events.append(TimelineEvent(tensor, phase, t0, max(0.0, last_ts - t0), depth,
                                        complete=False))
    events.sort(key=lambda e: (e.start_us, e.depth))
    return events


def wait_for_timeline(path: str | os.PathLike[str], timeout: float = 10.0,
                      poll: float = 0.1, stable_s: float = 2.0) -> bool:
    """Wait until the timeline file is closed (ends with ``]``) or stops growing.

    Horovod's writer is a background thread on rank 0: ``hvd.stop_timeline()`` or
    ``hvd.shutdown()`` returns before the last records are on disk. Returns True when the
    file is complete; False when it has not grown for ``stable_s`` seconds without being
    closed, or after ``timeout`` (:func:`parse_timeline` reads it anyway).
    """
    p = Path(path)
    deadline = time.monotonic() + timeout
    last, stable_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        if p.exists():
            data = p.read_bytes()
            if data.rstrip().endswith(b"]"):
                return True
            if len(data) != last:
                last, stable_since = len(data), time.monotonic()
            elif last > 0 and time.monotonic() - stable_since > stable_s:
                return False
        time.sleep(poll)
    return False


def timeline_summary(events: Sequence[TimelineEvent]) -> dict[str, dict[str, float]]:
    """Per phase: how many spans, their total and mean duration in ms (instants skipped)."""
    out: dict[str, dict[str, float]] = {}
    for e in events:
        if e.phase == "READY":
            continue
        d = out.setdefault(e.phase, {"count": 0, "total_ms": 0.0})
        d["count"] += 1
        d["total_ms"] += e.duration_us / 1000
    for d in out.values():
        d["mean_ms"] = d["total_ms"] / d["count"] if d["count"] else 0.0
    return out


def short_tensor_name(name: str, width: int = 32) -> str:
    """A readable label for a Horovod tensor name.

    ``hvd.grouped_allreduce`` names each member ``HorovodGroupedAllreduce_<first and last
    gradient's op names>_<i>of<n>``: shown as ``group member i/n``; the barrier-like eager
    allreduce (``HorovodAllreduce``) as is; anything else cut to ``width`` characters.
    """
    m = re.search(r"_(\d+)of(\d+)$", name)
    if name.startswith("HorovodGrouped") and m:
        return f"group member {m.group(1)}/{m.group(2)}"
    return name if len(name) <= width else "..." + name[-(width - 3):]


def busy_time_us(events: Sequence[TimelineEvent], phases: Sequence[str]) -> float:
    """Microseconds during which at least one event of ``phases`` was in progress.

    Tensors are reduced concurrently (a fused buffer holds many), so durations must not be
    added up: this is the length of the union of their intervals. Divided by the recorded
    time, it is the share of the wall clock spent in that phase.
    """
    spans = sorted((e.start_us, e.end_us) for e in events if e.phase in set(phases))
    total, cur_start = 0.0, 0.0  # cur_start is read only once cur_end is set
    cur_end: float | None = None
    for start, end in spans:
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def record_timeline(hvd: Any, path: str, fn: Callable[[], Any], steps: int) -> str | None:
    """Run ``fn`` ``steps`` times with Horovod's timeline recording to ``path``."""
    mode = os.environ.get("HOROVOD_TIMELINE", "")
    if mode.upper() != "DYNAMIC":
        raise RuntimeError(
            "recording a timeline on demand needs HOROVOD_TIMELINE=DYNAMIC in the workers' "
            "environment (MPICluster(env={'HOROVOD_TIMELINE': 'DYNAMIC'})); with "
            "HOROVOD_TIMELINE=<file> Horovod records everything from hvd.init() on instead")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    barrier(hvd)
    hvd.start_timeline(str(path), mark_cycles=False)
    for _ in range(steps):
        fn()
    barrier(hvd)
    hvd.stop_timeline()
    barrier(hvd)
    return str(path) if hvd.rank() == 0 else None

