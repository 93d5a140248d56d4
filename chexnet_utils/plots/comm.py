"""Figures about communication: Horovod timelines and allreduce sweeps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from chexnet_utils.costmodel import busbw
from chexnet_utils.hvd_timeline import short_tensor_name

if TYPE_CHECKING:
    from chexnet_utils.hvd_timeline import TimelineEvent

_PHASE_COLORS = {
    "NEGOTIATE_ALLREDUCE": "#c7c7c7", "NEGOTIATE_BROADCAST": "#c7c7c7",
    "NEGOTIATE_ALLGATHER": "#c7c7c7", "NEGOTIATE_ALLTOALL": "#c7c7c7",
    "ALLREDUCE": "#9ecae1", "BROADCAST": "#fdd0a2", "ALLGATHER": "#c7e9c0",
    "ALLTOALL": "#dadaeb",
    "MPI_ALLREDUCE": "#08519c", "GLOO_ALLREDUCE": "#08519c", "NCCL_ALLREDUCE": "#08519c",
    "MEMCPY_IN_FUSION_BUFFER": "#e6550d", "MEMCPY_OUT_FUSION_BUFFER": "#a63603",
    "MPI_BCAST": "#d94801", "WAIT_FOR_DATA": "#bdbdbd", "WAIT_FOR_OTHER_TENSOR_DATA": "#969696",
    "QUEUE": "#756bb1",
}


def plot_timeline(events: Sequence[TimelineEvent], max_tensors: int = 30,
                  title: str = "Horovod timeline", ax: Any = None):  # noqa: ANN201
    """Gantt chart of a timeline: one row per tensor, one bar per phase.

    Top-level phases (negotiation, the whole allreduce) are drawn full height and pale;
    the phases nested inside (the MPI/NCCL reduction itself, copies into and out of the
    fusion buffer) as narrower dark bars on top; black ticks mark the moments each worker
    reported the tensor ready. Time in ms from the first event. At most ``max_tensors``
    rows (the first tensors to start). Returns the figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    spans = [e for e in events if e.phase != "READY"]
    if not events:
        raise ValueError("no events to draw")
    t_first = min(e.start_us for e in events)
    order: list[str] = []
    for e in sorted(events, key=lambda e: e.start_us):
        if e.tensor not in order:
            order.append(e.tensor)
    order = order[:max_tensors]
    row = {t: i for i, t in enumerate(order)}
    if ax is None:
        fig, ax = plt.subplots(figsize=(11, 0.28 * len(order) + 1.6))
    else:
        fig = ax.figure
    used: dict[str, str] = {}
    for e in spans:
        if e.tensor not in row:
            continue
        color = _PHASE_COLORS.get(e.phase, "#6baed6" if e.depth else "#deebf7")
        height = 0.8 if e.depth == 0 else 0.45
        ax.barh(row[e.tensor], max(e.duration_us, 1.0) / 1000,
                left=(e.start_us - t_first) / 1000, height=height, color=color,
                edgecolor="none" if e.complete else "red", linewidth=0.8)
        used.setdefault(e.phase, color)
    for e in events:
        if e.phase == "READY" and e.tensor in row:
            ax.plot([(e.start_us - t_first) / 1000] * 2,
                    [row[e.tensor] - 0.42, row[e.tensor] + 0.42], color="black", lw=0.8)
    ax.set_yticks(range(len(order)), [short_tensor_name(t) for t in order], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time since the first recorded event (ms)")
    ax.set_title(title)
    handles = [Patch(color=c, label=p) for p, c in used.items()]
    if any(e.phase == "READY" and e.tensor in row for e in events):
        handles.append(plt.Line2D([], [], color="black", lw=0.8, label="worker ready (READY)"))
    if any(not e.complete for e in spans):
        handles.append(Patch(facecolor="white", edgecolor="red", label="still open at the end"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig



def plot_sweeps(sweeps: Sequence[Mapping[str, Any]], labels: Sequence[str] | None = None,
                title: str = "", key: str = "times_s"):  # noqa: ANN201
    """Two log-log panels for results of :func:`allreduce_times` /
    :func:`parameter_server_times`: time per reduction, and bus bandwidth (:func:`busbw`).
    ``key``: ``"times_s"`` (median of the repeats) or ``"min_s"`` (fastest)."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for i, sw in enumerate(sweeps):
        label = labels[i] if labels else f"{sw['algorithm']} ({sw['backend']})"
        s = np.asarray(sw["sizes_bytes"], dtype=float)
        t = np.asarray(sw[key], dtype=float)
        ax1.loglog(s, t * 1e3, "o-", ms=3, label=label)
        bw = [busbw(sw["algorithm"], si, ti, sw["size"], sw.get("colocated_server", False))
              for si, ti in zip(s, t)]
        ax2.loglog(s, np.asarray(bw) / 1e9, "o-", ms=3, label=label)
    for ax in (ax1, ax2):
        ax.set_xlabel("tensor size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_ylabel("time per reduction (ms)")
    ax1.set_title("time")
    ax2.set_ylabel("bus bandwidth (GB/s)")
    ax2.set_title("bus bandwidth = busiest link's bytes / time")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig

