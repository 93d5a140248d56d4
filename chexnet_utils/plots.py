"""Figures the notebooks draw, one function per figure, each returning the matplotlib Figure.

Kept here so the notebooks stay short and every figure is drawn the same way in
``make tutorial`` (saved as PNG with :func:`chexnet_utils.results.save_figure`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from chexnet_utils.costmodel import busbw
from chexnet_utils.hvd_timeline import short_tensor_name
from chexnet_utils.labels import PATHOLOGIES

if TYPE_CHECKING:
    from chexnet_utils.hvd_timeline import TimelineEvent

NIH_PREVALENCE: dict[str, float] = {
    "No Finding": 0.538, "Infiltration": 0.177, "Effusion": 0.119, "Atelectasis": 0.103,
    "Nodule": 0.057, "Mass": 0.052, "Pneumothorax": 0.047, "Consolidation": 0.042,
    "Pleural_Thickening": 0.030, "Cardiomegaly": 0.025, "Emphysema": 0.022, "Edema": 0.021,
    "Fibrosis": 0.015, "Pneumonia": 0.013, "Hernia": 0.002,
}
"""Share of the 112,120 NIH images carrying each label (from ``Data_Entry_2017.csv``)."""


def label_distribution(prevalence: Mapping[str, float], reference: Mapping[str, float]
                       | None = NIH_PREVALENCE, title: str = "Label prevalence"):  # noqa: ANN201
    """Horizontal bars of prevalence per label on a log scale, NIH's beside ours."""
    import matplotlib.pyplot as plt

    names = sorted(prevalence, key=lambda k: prevalence[k])
    y = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(7, 0.32 * len(names) + 1))
    h = 0.4 if reference else 0.8
    ax.barh(y + (h / 2 if reference else 0), [max(prevalence[n], 1e-5) for n in names],
            height=h, label="this data set", color="tab:blue")
    if reference:
        ax.barh(y - h / 2, [reference.get(n, 0) for n in names], height=h,
                label="NIH ChestX-ray14", color="tab:gray", alpha=0.6)
        ax.legend(loc="lower right")
    ax.set_yticks(y, names)
    ax.set_xscale("log")
    ax.set_xlabel("share of images (log scale)")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def cooccurrence_matrix(labels: np.ndarray) -> np.ndarray:
    """``C[i, j]`` = images carrying both pathology i and j (diagonal: images with i)."""
    m = np.asarray(labels, dtype=np.int64)
    return m.T @ m


def cooccurrence(labels: np.ndarray, names: Sequence[str] = PATHOLOGIES):  # noqa: ANN201
    """Heat map of :func:`cooccurrence_matrix` normalised by row: P(column | row)."""
    import matplotlib.pyplot as plt

    c = cooccurrence_matrix(labels).astype(float)
    diag = np.diag(c).copy()
    cond = np.divide(c, diag[:, None], out=np.zeros_like(c), where=diag[:, None] > 0)
    np.fill_diagonal(cond, np.nan)
    fig, ax = plt.subplots(figsize=(7.5, 6.5))
    im = ax.imshow(cond, cmap="viridis", vmin=0)
    ax.set_xticks(range(len(names)), names, rotation=70, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set_title("P(column label | row label)")
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    return fig


def image_grid(images: Sequence[np.ndarray], titles: Sequence[str], cols: int = 4,
               size: float = 2.6):  # noqa: ANN201
    """Grey images in a grid with a (wrapped) title under each."""
    import matplotlib.pyplot as plt

    rows = int(np.ceil(len(images) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(cols * size, rows * (size + 0.5)))
    for ax in np.atleast_1d(axes).ravel():
        ax.axis("off")
    for ax, img, title in zip(np.atleast_1d(axes).ravel(), images, titles):
        ax.imshow(img, cmap="gray", vmin=0, vmax=255)
        ax.set_title(title.replace("|", "\n"), fontsize=8)
    fig.tight_layout()
    return fig


def bars(values: Mapping[str, float], ylabel: str, title: str, errors: Mapping[str, float]
         | None = None, reference: float | None = None, reference_label: str = ""):  # noqa: ANN201
    """Vertical bars with optional error bars and a dashed reference line."""
    import matplotlib.pyplot as plt

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

    ``rows`` are :class:`chexnet_utils.benchmark.Timeline` objects (anything with ``plot(ax,
    y, height)``, ``label`` and ``wait_fraction``): per step a red bar while the accelerator
    waits for its batch and a green bar while it computes. Each row is labelled with its
    ``label`` and the share of the wall time spent waiting, and all rows share one time
    axis, so a pipeline that finishes the same steps sooner has the shorter row.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = list(rows)
    fig, ax = plt.subplots(figsize=(9, 0.75 * len(rows) + 1.6))
    n = len(rows)
    for i, tl in enumerate(rows):
        y = n - 1 - i  # first row on top
        tl.plot(ax=ax, y=y + 0.1, height=0.8)
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


def scaling(workers: Sequence[int], series: Mapping[str, Sequence[float]], ylabel: str,
            title: str, ideal: str | None = None, cap: float | None = None,
            cap_label: str = ""):  # noqa: ANN201
    """Throughput against number of workers, one line per series.

    ``ideal`` names the series whose 1-worker value, times the number of workers, is drawn
    as the dotted "linear scaling" line; ``cap`` draws a dashed horizontal line (e.g. what
    one machine can decode at most).
    """
    import matplotlib.pyplot as plt

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
    import matplotlib.pyplot as plt

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
        for xi, v in zip(pos, values):
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


def learning_curves(history: Mapping[str, Sequence[float]], reference: float | None = None,
                    reference_label: str = "", title: str = ""):  # noqa: ANN201
    """Loss and mean AUROC per epoch, from the ``history`` of a training run.

    ``history`` maps a log name to one value per epoch (``TrainResult.history`` of
    :func:`chexnet_utils.training.train`, or Keras' ``History.history``). Left panel:
    ``loss`` (training) and ``val_loss``; right panel: ``val_mean_auroc`` (exact, on the
    whole validation split) and ``mean_auroc`` (Keras' estimate on the training batches,
    dashed), with an optional dashed ``reference`` line (e.g. the paper's mean AUROC).
    Epochs where ``learning_rate`` dropped are marked with dotted vertical lines. Missing
    series are skipped.
    """
    import matplotlib.pyplot as plt

    n = max((len(v) for v in history.values()), default=0)
    epochs = np.arange(1, n + 1)

    def series(key: str) -> np.ndarray | None:
        values = history.get(key)
        if values is None or len(values) != n:
            return None
        return np.asarray(values, dtype=np.float64)

    fig, (ax_loss, ax_auc) = plt.subplots(1, 2, figsize=(10, 3.6))
    for key, label, style in (("loss", "training", "-o"), ("val_loss", "validation", "-s")):
        v = series(key)
        if v is not None:
            ax_loss.plot(epochs, v, style, label=label)
    for key, label, style in (("val_mean_auroc", "validation (exact)", "-s"),
                              ("mean_auroc", "training batches (Keras estimate)", "--o")):
        v = series(key)
        if v is not None:
            ax_auc.plot(epochs, v, style, label=label)
    if reference is not None:
        ax_auc.axhline(reference, ls="--", color="tab:red", label=reference_label or None)
    lr = series("learning_rate")
    if lr is not None:
        for i in np.flatnonzero(np.diff(lr) < 0):
            for ax in (ax_loss, ax_auc):
                ax.axvline(epochs[i + 1], ls=":", color="gray")
        if np.any(np.diff(lr) < 0):
            ax_loss.plot([], [], ls=":", color="gray", label="learning rate / 10")
    ax_loss.set_ylabel("weighted BCE loss")
    ax_auc.set_ylabel("mean AUROC")
    ax_auc.set_ylim(min(0.45, float(np.nanmin(series("val_mean_auroc"))) - 0.05)
                    if series("val_mean_auroc") is not None else 0.45, 1.0)
    ax_auc.axhline(0.5, color="black", lw=0.8, alpha=0.5)
    for ax in (ax_loss, ax_auc):
        ax.set_xlabel("epoch")
        ax.set_xticks(epochs)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def roc_curves(y_true: np.ndarray, y_score: np.ndarray, names: Sequence[str] = PATHOLOGIES,
               reference: Mapping[str, float] | None = None, cols: int = 5,
               title: str = ""):  # noqa: ANN201
    """One small ROC panel per class, with its AUROC (and ``reference[name]``) in the title.

    ``y_true`` (multi-hot) and ``y_score`` have shape ``(n_images, len(names))``. Curves
    from :func:`chexnet_utils.models.roc_curve`; the dotted diagonal is chance. A class
    whose column has no positives (or no negatives) gets an empty panel saying so.
    """
    import matplotlib.pyplot as plt

    from chexnet_utils.models import binary_auroc, roc_curve

    t = np.asarray(y_true, dtype=np.float64)
    s = np.asarray(y_score, dtype=np.float64)
    if t.ndim != 2 or t.shape != s.shape or t.shape[1] != len(names):
        raise ValueError(f"y_true {t.shape} and y_score {s.shape} must be (n, {len(names)})")
    rows = int(np.ceil(len(names) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(2.3 * cols, 2.35 * rows + 0.4),
                             sharex=True, sharey=True)
    flat = np.atleast_1d(axes).ravel()
    for ax in flat[len(names):]:
        ax.axis("off")
    for c, (ax, name) in enumerate(zip(flat, names)):
        ax.plot([0, 1], [0, 1], ls=":", color="gray", lw=0.8)
        fpr, tpr = roc_curve(t[:, c], s[:, c])
        ref = f" | paper {reference[name]:.2f}" if reference and name in reference else ""
        if fpr.size:
            ax.plot(fpr, tpr, color="tab:blue", lw=1.5)
            ax.set_title(f"{name}\nAUROC {binary_auroc(t[:, c], s[:, c]):.2f}{ref}",
                         fontsize=8)
        else:
            ax.text(0.5, 0.5, "no positives\nin this split" if t[:, c].sum() == 0
                    else "no negatives\nin this split", ha="center", va="center",
                    fontsize=8, color="gray")
            ax.set_title(f"{name}\nAUROC n/a{ref}", fontsize=8)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.tick_params(labelsize=7)
    for ax in flat[::cols]:
        ax.set_ylabel("true positive rate", fontsize=7)
    for ax in flat[len(names) - cols:len(names)]:
        ax.set_xlabel("false positive rate", fontsize=7)
        ax.xaxis.set_tick_params(labelbottom=True)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def grad_cam_overlay(image: np.ndarray, heatmaps: Mapping[str, np.ndarray], title: str = "",
                     alpha: float = 0.45, size: float = 3.2):  # noqa: ANN201
    """The image, then one panel per Grad-CAM heat map laid over it (jet colours, red = high).

    ``image`` is ``(H, W)`` or ``(H, W, C)`` in any value range (a normalised model input
    is fine: the first channel is shown, scaled to its own min..max); ``heatmaps`` maps a
    panel title (e.g. ``"Mass (p=0.93)"``) to a ``(H, W)`` map in [0, 1] as
    :func:`chexnet_utils.explain.grad_cam` returns it.
    """
    import matplotlib.pyplot as plt

    img = np.asarray(image, dtype=np.float64)
    if img.ndim == 3:
        img = img[..., 0]
    lo, hi = float(img.min()), float(img.max())
    grey = (img - lo) / (hi - lo) if hi > lo else np.zeros_like(img)
    n = 1 + len(heatmaps)
    fig, axes = plt.subplots(1, n, figsize=(size * n, size + 0.6))
    axes = np.atleast_1d(axes)
    axes[0].imshow(grey, cmap="gray", vmin=0, vmax=1)
    axes[0].set_title("input", fontsize=9)
    im = None
    for ax, (label, heat) in zip(axes[1:], heatmaps.items()):
        h = np.asarray(heat, dtype=np.float64)
        if h.shape != grey.shape:
            raise ValueError(f"heat map {label!r} has shape {h.shape}, image {grey.shape}")
        ax.imshow(grey, cmap="gray", vmin=0, vmax=1)
        im = ax.imshow(h, cmap="jet", vmin=0, vmax=1, alpha=alpha)
        ax.set_title(label, fontsize=9)
    for ax in axes:
        ax.axis("off")
    if im is not None:
        fig.colorbar(im, ax=list(axes), fraction=0.02, pad=0.01, label="Grad-CAM")
    if title:
        fig.suptitle(title)
    return fig


def gpu_utilisation(runs: Mapping[str, Mapping], title: str = "GPU utilisation (NVML)"):  # noqa: ANN201
    """GPU utilisation over time, one panel per pipeline (``old``, ``new``), one line per GPU.

    ``runs`` is :func:`chexnet_utils.gpu_node.utilisation_old_vs_new`'s result: per pipeline
    ``samples`` (dicts with ``t``, ``gpu``, ``util_percent``), optional ``window`` (the timed
    steps, shaded) and ``summary`` (mean utilisation and idle share, in the panel title).
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 2.4 * len(runs)), sharex=True,
                             squeeze=False)
    for ax, (name, run) in zip(axes[:, 0], runs.items()):
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


__all__ = ["NIH_PREVALENCE", "label_distribution", "cooccurrence",
           "cooccurrence_matrix", "image_grid", "bars", "timelines", "scaling",
           "grouped_bars", "learning_curves", "roc_curves", "grad_cam_overlay",
           "gpu_utilisation", "plot_timeline", "plot_sweeps"]
