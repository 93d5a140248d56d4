"""General charts the notebooks share: bars (with their repeats), timelines of steps, scaling
curves and panels, learning curves of several workers, GPU use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from chexnet_utils.platform.lazy import lazy_module

if TYPE_CHECKING:
    from chexnet_utils.bench.scaling import ScalingBlock

# matplotlib: imported on first use (chexnet_utils.platform.lazy)
plt = lazy_module("matplotlib.pyplot")


def bars(values: Mapping[str, float], ylabel: str, title: str, errors: Mapping[str, float]
         | None = None, reference: float | None = None, reference_label: str = ""):  # noqa: ANN201
    """Vertical bars with optional error bars and a dashed reference line."""
    names = list(values)
    fig, ax = plt.subplots(figsize=(max(4.5, 1.1 * len(names) + 1.5), 3.6))
    ax.bar(names, [values[n] for n in names],
           yerr=[errors[n] for n in names] if errors else None, capsize=4, color="tab:blue")
    for i, n in enumerate(names):
        top = values[n] + (errors[n] if errors else 0)  # above the error bar, not under it
        ax.annotate(f"{values[n]:.0f}", (i, top), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 3), textcoords="offset points")
    if reference is not None:
        ax.axhline(reference, ls="--", color="tab:red", label=reference_label)
        ax.legend()
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    return fig


def timelines(rows: Sequence, title: str = "", xlabel: str = "seconds since the first step"
              ):  # noqa: ANN201
    """Training-step timelines stacked one above the other, the first on top.

    ``rows`` are :class:`chexnet_utils.bench.benchmark.Timeline` objects (anything with
    ``segments()``, ``label`` and ``wait_fraction``): per step a red bar while the accelerator
    waits for its batch and a green bar while it computes. Each row is labelled with its
    ``label`` and the share of the wall time spent waiting, and all rows share one time
    axis, so a pipeline that finishes the same steps sooner has the shorter row.
    """
    from matplotlib.patches import Patch

    rows = list(rows)
    fig, ax = plt.subplots(figsize=(9, 0.75 * len(rows) + 1.6))
    n = len(rows)
    for i, tl in enumerate(rows):
        y = n - 1 - i  # first row on top
        _timeline_bars(ax, tl, y=y + 0.1, height=0.8)
    ax.set_yticks([n - 1 - i + 0.5 for i in range(n)],
                  [f"{tl.label}\nwaiting {tl.wait_fraction:.0%}" for tl in rows])
    ax.set_ylim(0, n)
    ax.set_xlim(left=0)
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=[Patch(color="tab:red", label="waiting for data"),
                       Patch(color="tab:green", label="computing")],
              loc="upper center", bbox_to_anchor=(0.5, -0.32 if n < 3 else -0.22), ncol=2,
              frameon=False)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def _timeline_bars(ax: Any, timeline: Any, y: float = 0.0, height: float = 0.8) -> Any:
    """Draw one timeline's steps on ``ax`` at height ``y``: red while waiting for data, green
    while computing (``timeline.segments()``, e.g. a
    :class:`chexnet_utils.bench.benchmark.Timeline`); returns ``ax``."""
    seg = timeline.segments()
    ax.broken_barh(seg["wait"], (y, height), color="tab:red", label="waiting for data")
    ax.broken_barh(seg["compute"], (y, height), color="tab:green", label="computing")
    return ax


def scaling(workers: Sequence[int], series: Mapping[str, Sequence[float]], ylabel: str,
            title: str, ideal: str | None = None, cap: float | None = None,
            cap_label: str = ""):  # noqa: ANN201
    """Throughput against number of workers, one line per series.

    ``ideal`` names the series whose 1-worker value, times the number of workers, is drawn
    as the dotted "linear scaling" line; ``cap`` draws a dashed horizontal line (e.g. what
    one machine can decode at most).
    """
    w = list(workers)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    markers = "osD^v"
    for k, (name, values) in enumerate(series.items()):
        ax.plot(w, list(values), marker=markers[k % len(markers)], label=name)
        ax.annotate(f"{values[-1]:.0f}", (w[-1], values[-1]), xytext=(6, 0),
                    textcoords="offset points", va="center", fontsize=8)
    if ideal is not None:
        base = list(series[ideal])[0] / w[0]
        ax.plot(w, [base * n for n in w], ls=":", color="gray", label="linear scaling")
    if cap is not None:
        ax.axhline(cap, ls="--", color="tab:red", label=cap_label or None)
    ax.set_xticks(w)
    ax.set_xlabel("workers")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def grouped_bars(data: Mapping[str, Mapping[str, float]], ylabel: str, title: str,
                 fmt: str = "{:.0f}", reference: float | None = None,
                 reference_label: str = ""):  # noqa: ANN201
    """Bars grouped by the outer key, one colour per inner key (same inner keys in every
    group), each bar labelled with its value formatted by ``fmt``; optional dashed
    horizontal reference line."""
    groups = list(data)
    series = list(dict.fromkeys(k for g in groups for k in data[g]))
    x = np.arange(len(groups))
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(groups) * max(1, len(series)) / 2 + 2),
                                    3.8))
    for j, name in enumerate(series):
        values = [data[g].get(name, np.nan) for g in groups]
        pos = x - 0.4 + width * (j + 0.5)
        ax.bar(pos, values, width=width, label=name)
        for xi, v in zip(pos, values, strict=True):
            if np.isfinite(v):
                ax.annotate(fmt.format(v), (xi, v), ha="center", va="bottom", fontsize=8,
                            xytext=(0, 2), textcoords="offset points")
    if reference is not None:
        ax.axhline(reference, ls="--", color="tab:red", label=reference_label or None)
    ax.set_xticks(x, groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.margins(y=0.15)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig



def gpu_utilisation(runs: Mapping[str, Mapping], title: str = "GPU utilisation (NVML)"):  # noqa: ANN201
    """GPU utilisation over time, one panel per pipeline (``old``, ``new``), one line per GPU.

    ``runs`` is :func:`chexnet_utils.bench.gpu_node.utilisation_old_vs_new`'s result: per pipeline
    ``samples`` (dicts with ``t``, ``gpu``, ``util_percent``), optional ``window`` (the timed
    steps, shaded) and ``summary`` (mean utilisation and idle share, in the panel title).
    """
    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 2.4 * len(runs)), sharex=True,
                             squeeze=False)
    for ax, (name, run) in zip(axes[:, 0], runs.items(), strict=True):
        samples = list(run["samples"])
        for gpu in sorted({int(s["gpu"]) for s in samples}):
            pts = sorted((s["t"], s["util_percent"]) for s in samples if int(s["gpu"]) == gpu)
            ax.plot([t for t, _ in pts], [u for _, u in pts], drawstyle="steps-post",
                    label=f"GPU {gpu}")
        if run.get("window"):
            ax.axvspan(*run["window"], color="tab:green", alpha=0.1, label="timed steps")
        summary = run.get("summary") or {}
        extra = (f": mean {summary['mean_util_percent']:.0f} %, "
                 f"{summary['idle_share']:.0%} of readings below 10 %") if summary else ""
        ax.set_title(f"{name} pipeline{extra}", fontsize=10)
        ax.set_ylim(0, 105)
        ax.set_ylabel("utilisation %")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    axes[-1, 0].set_xlabel("seconds since sampling started")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def bars_with_runs(values: Mapping[str, float],
                   runs: Mapping[str, Sequence[float] | np.ndarray],
                   label: str, title: str = "", horizontal: bool = True,
                   colors: Sequence[str] | str = "tab:blue", ax: Any = None,
                   figsize: tuple[float, float] = (7, 2.6)):  # noqa: ANN201
    """One bar per entry of ``values`` (e.g. a median or the fastest run), and every run of
    ``runs`` drawn over its bar as a black tick: how far the repeats spread.

    ``label`` names the value axis; ``horizontal`` bars are listed top to bottom in the
    order of ``values``. Draws on ``ax`` if given, else on a new figure; returns the figure.
    """
    fig, ax = plt.subplots(figsize=figsize) if ax is None else (ax.figure, ax)
    names = list(values)
    heights = [values[k] for k in names]
    if horizontal:
        ax.barh(names, heights, color=colors)
        for i, k in enumerate(names):
            ax.plot(list(runs[k]), [i] * len(runs[k]), "k|", ms=12)
        ax.invert_yaxis()
        ax.set_xlabel(label)
    else:
        ax.bar(names, heights, color=colors)
        for i, k in enumerate(names):
            ax.plot([i] * len(runs[k]), list(runs[k]), "k_", ms=20)
        ax.set_ylabel(label)
    if title:
        ax.set_title(title, fontsize=9 if horizontal else None)
    fig.tight_layout()
    return fig


def worker_learning_curves(histories: Mapping[str, Mapping[str, Sequence[float]]],
                           title: str = ""):  # noqa: ANN201
    """Training loss and validation mean AUROC per epoch, one line per run (e.g. "1 worker",
    "2 workers"), side by side. A history without ``val_mean_auroc`` draws no AUROC line."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for label, hist in histories.items():
        epochs = np.arange(1, len(hist["loss"]) + 1)
        axes[0].plot(epochs, hist["loss"], marker="o", label=label)
        axes[1].plot(epochs, hist.get("val_mean_auroc", [np.nan] * len(epochs)), marker="o",
                     label=label)
    axes[0].set(xlabel="epoch", ylabel="training loss (mean over workers)")
    axes[1].set(xlabel="epoch", ylabel="validation mean AUROC")
    for ax in axes:
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def scaling_panels(panels: Mapping[str, ScalingBlock], workers: Sequence[int],
                   pipelines: Sequence[str] = ("old", "new"),
                   title: str = "Data-parallel scaling (labels: efficiency)"):  # noqa: ANN201
    """Images/s against workers, one panel per entry of ``panels`` (its title -> a
    :class:`~chexnet_utils.bench.scaling.ScalingBlock` of
    :func:`~chexnet_utils.bench.scaling.bench_scaling`'s result: ``result.cpu`` or
    ``result.emulated``), one line per pipeline, each point after the first labelled with its
    scaling efficiency, and the ideal line (the last pipeline's 1-worker rate times the
    workers) dashed."""
    w = list(workers)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    colors = ("tab:gray", "tab:blue", "tab:green", "tab:orange")
    for ax, (panel_title, block) in zip(axes[0], panels.items(), strict=True):
        img_per_s, eff = block.img_per_s, block.efficiency
        base = img_per_s[pipelines[-1]][w[0]] / w[0]
        ax.plot(w, [base * n for n in w], "k--", label="ideal (linear)")
        for p, color in zip(pipelines, colors, strict=False):
            rates = [img_per_s[p][n] for n in w]
            ax.plot(w, rates, marker="o", color=color, label=f"{p} pipeline")
            for n, r in zip(w[1:], rates[1:], strict=True):  # 1 worker is 100 % by definition
                ax.annotate(f"{eff[p][n]:.0%}", (n, r),
                            textcoords="offset points", xytext=(6, -12), color=color,
                            fontsize=9)
        ax.set(xlabel="workers (one core each)", ylabel="training images / s",
               title=panel_title, xticks=w, ylim=(0, None))
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig
