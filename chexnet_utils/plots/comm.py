"""Figures about communication: Horovod timelines, allreduce sweeps, the alpha-beta fit and
its predictions, fp16 compression, tensor fusion, back ends and process binding compared."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from chexnet_utils.comm.costmodel import busbw, predict, scaling_efficiency_prediction
from chexnet_utils.comm.timeline import parse_timeline, short_tensor_name
from chexnet_utils.platform.lazy import lazy_module
from chexnet_utils.plots.charts import bars_with_runs

if TYPE_CHECKING:
    from matplotlib.artist import Artist

    from chexnet_utils.comm.timeline import TimelineEvent

# matplotlib: imported on first use (chexnet_utils.platform.lazy)
plt = lazy_module("matplotlib.pyplot")

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
    handles: list[Artist] = [Patch(color=c, label=p) for p, c in used.items()]
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
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for i, sw in enumerate(sweeps):
        label = labels[i] if labels else f"{sw['algorithm']} ({sw['backend']})"
        s = np.asarray(sw["sizes_bytes"], dtype=float)
        t = np.asarray(sw[key], dtype=float)
        ax1.loglog(s, t * 1e3, "o-", ms=3, label=label)
        bw = [busbw(sw["algorithm"], si, ti, sw["size"], sw.get("colocated_server", False))
              for si, ti in zip(s, t, strict=True)]
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



def alpha_beta_fit(sizes_bytes: Sequence[float],
                   series: Mapping[str, tuple[Sequence[float], tuple[float, float], str, bool]],
                   n: int, title: str | None = None):  # noqa: ANN201
    """Measured times against the fitted alpha-beta model, log-log, one colour per series.

    ``series`` maps a label to ``(times_s, (alpha, beta), algorithm, colocated_server)``:
    the measured seconds per size and the fit of
    :func:`chexnet_utils.comm.costmodel.fit_alpha_beta` for that algorithm on ``n`` workers;
    points are measurements, lines the model.
    """
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    s = np.asarray(sizes_bytes, dtype=float)
    for label, (times, fit, algorithm, colocated) in series.items():
        pts = ax.loglog(s, np.asarray(times) * 1e3, "o", ms=4, label=f"{label}: measured")
        model = [predict(algorithm, n, x, *fit, colocated_server=colocated) * 1e3 for x in s]
        bandwidth = f"{1 / fit[1] / 1e9:.2f} GB/s" if fit[1] else "inf"
        ax.loglog(s, model, "-", color=pts[0].get_color(),
                  label=f"model: alpha {fit[0] * 1e6:.0f} us, 1/beta {bandwidth}")
    ax.set_xlabel("tensor size (bytes)")
    ax.set_ylabel("time (ms)")
    ax.set_title(title or f"alpha-beta model fitted to the measurements ({n} workers)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


_MODEL_NAMES = {"densenet121": "DenseNet-121", "resnet50": "ResNet-50"}


def scaling_prediction(grad_bytes: Mapping[str, float], step_compute_s: float, alpha: float,
                       beta: float, overhead_s: float = 0.0,
                       reported: Mapping[str, Mapping[str, float]] | None = None,
                       network_beta: float | None = 8 / 25e9, max_log2_workers: int = 9
                       ):  # noqa: ANN201
    """Predicted scaling efficiency from 2 to ``2**max_log2_workers`` workers.

    Per model of ``grad_bytes`` (name -> gradient bytes): the ring on the fitted link
    (solid), the parameter server (dashed) and, if ``network_beta`` is given, the ring on
    that link (dotted; default 25 Gbit/s), all from
    :func:`chexnet_utils.comm.costmodel.scaling_efficiency_prediction`. ``reported`` (e.g.
    :data:`~chexnet_utils.comm.costmodel.REPORTED_HOROVOD_2018`: name -> ``gpus``,
    ``efficiency``) are drawn as markers, shifted a little sideways so they do not hide
    each other.
    """
    ns = 2 ** np.arange(1, max_log2_workers + 1)
    fig, ax = plt.subplots(figsize=(11, 4.8))

    def curve(size: float, algorithm: str, b: float) -> list[float]:
        return [scaling_efficiency_prediction(int(n), size, step_compute_s, alpha, b, algorithm,
                                              overhead_s=overhead_s) for n in ns]

    for (model, size), color in zip(grad_bytes.items(), ("tab:blue", "tab:orange", "tab:brown"),
                                    strict=False):
        name = _MODEL_NAMES.get(model, model)
        ax.plot(ns, curve(size, "ring", beta), "-o", ms=3, color=color,
                label=f"{name}, ring (this link)")
        ax.plot(ns, curve(size, "ps", beta), "--", color=color, label=f"{name}, parameter server")
        if network_beta is not None:
            ax.plot(ns, curve(size, "ring", network_beta), ":", color=color,
                    label=f"{name}, ring, {8 / network_beta / 1e9:g} Gbit/s links")
    markers = zip([0.9, 1.0, 1.1], ["*", "P", "X"], ["tab:green", "tab:red", "tab:purple"],
                  strict=True)
    for (model, r), (shift, marker, color) in zip((reported or {}).items(), markers, strict=False):
        ax.plot(r["gpus"] * shift, r["efficiency"], marker, ms=11, color=color,
                label=f"{model}: {r['efficiency']:.0%} at {r['gpus']:g} GPUs "
                      "(reported, Horovod paper)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("workers")
    ax.set_ylabel("scaling efficiency")
    ax.set_title(f"Predicted from the fitted model (compute {step_compute_s * 1e3:.0f} ms/step, "
                 "assumed)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def fp16_compression(sizes_bytes: Sequence[float], fp32_s: Sequence[float],
                     fp16_s: Sequence[float], n: int):  # noqa: ANN201
    """Allreduce time against tensor size, without and with ``hvd.Compression.fp16``."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.loglog(sizes_bytes, np.asarray(fp32_s) * 1e3, "o-", label="float32 (no compression)")
    ax.loglog(sizes_bytes, np.asarray(fp16_s) * 1e3, "s-", label="hvd.Compression.fp16")
    ax.set_xlabel("tensor size (bytes)")
    ax.set_ylabel("allreduce time (ms)")
    ax.set_title(f"fp16 compression, {n} workers")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def backend_throughput(steps: Mapping[str, Sequence[Mapping[str, Any]]], xlabel: str
                       ):  # noqa: ANN201
    """Images/s of the same training step per data-parallel back end: rank 0's median
    (bar) and its runs (ticks). ``steps`` maps a label to the engines' results of
    :func:`chexnet_utils.bench.engine_steps.backend_throughput_on_engine`."""
    return bars_with_runs({k: v[0]["img_per_s"] for k, v in steps.items()},
                          {k: v[0]["runs_img_per_s"] for k, v in steps.items()}, xlabel,
                          "Same training step, two data-parallel back ends "
                          "(bar: median, ticks: runs)",
                          colors=["tab:blue", "tab:green", "tab:cyan"][:len(steps)])


def tensor_fusion(bursts: Mapping[str, Mapping[str, Mapping[str, Any]]],
                  burst_elems: Mapping[str, Sequence[int]], n: int, key: str = "min_s"
                  ):  # noqa: ANN201
    """One panel per burst of tensors (``burst_elems``: name -> elements per tensor), one bar
    per Horovod setting (``bursts``: setting -> burst name -> result of
    :func:`chexnet_utils.comm.collectives.allreduce_burst_times`): ``key`` as the bar, every
    repeat (``times_s``) as a tick."""
    settings = list(bursts)
    fig, axes = plt.subplots(1, len(burst_elems), figsize=(11, 0.45 * len(settings) + 1.6),
                             squeeze=False)
    for i, (ax, (b, elems)) in enumerate(zip(axes[0], burst_elems.items(), strict=True)):
        bars_with_runs({k: bursts[k][b][key] * 1e3 for k in settings},
                       {k: np.asarray(bursts[k][b]["times_s"]) * 1e3 for k in settings},
                       "ms per burst (bar: fastest, ticks: every repeat)",
                       f"{b}: {len(elems)} allreduces, {sum(elems) * 4 / 1e6:.1f} MB", ax=ax)
        if i:
            ax.set_yticks(range(len(settings)), [""] * len(settings))
    fig.suptitle(f"Tensor fusion, {n} workers")
    fig.tight_layout()
    return fig


def binding(steps: Mapping[str, Mapping[str, Any]], n: int, cores: int):  # noqa: ANN201
    """Training images/s per ``--bind-to`` setting (``steps``: setting -> rank 0's result of
    :func:`chexnet_utils.bench.engine_steps.hvd_throughput_on_engine`): median bar, runs as
    dashes."""
    fig = bars_with_runs({f"--bind-to {b}": s["img_per_s"] for b, s in steps.items()},
                         {f"--bind-to {b}": s["runs_img_per_s"] for b, s in steps.items()},
                         "images/s (Horovod, grouped)\nbar: median, dashes: runs",
                         f"Process binding, {n} workers on {cores} cores", horizontal=False,
                         colors=["tab:blue", "tab:gray", "tab:olive"][:len(steps)],
                         figsize=(5.5, 3))
    return fig


def allreduce_overlap(runs: Mapping[str, Mapping[str, Any]]):  # noqa: ANN201
    """Side-by-side Horovod timelines of one training step per reduction mode (``runs``:
    mode -> :func:`chexnet_utils.training.experiments.allreduce_enqueue_spread`'s result, with
    the ``timeline`` path and ``n_tensors``): when each gradient reached Horovod."""
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 5), squeeze=False)
    for ax, (mode, r) in zip(axes[0], runs.items(), strict=True):
        plot_timeline(parse_timeline(r["timeline"]), max_tensors=r["n_tensors"],
                      title=f"{mode}: when each gradient reached Horovod", ax=ax)
    fig.tight_layout()
    return fig
