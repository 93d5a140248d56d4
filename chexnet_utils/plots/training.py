"""Figures about a trained model: learning curves, ROC curves, Grad-CAM overlays; training
jobs' progress and world size over time (elastic runs)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chexnet_utils.data.labels import PATHOLOGIES
from chexnet_utils.platform.lazy import lazy_module

# matplotlib: imported on first use (chexnet_utils.platform.lazy)
plt = lazy_module("matplotlib.pyplot")


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
    val_auroc = series("val_mean_auroc")
    ax_auc.set_ylim(min(0.45, float(np.nanmin(val_auroc)) - 0.05)
                    if val_auroc is not None else 0.45, 1.0)
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
    from :func:`chexnet_utils.model.auroc.roc_curve`; the dotted diagonal is chance. A class
    whose column has no positives (or no negatives) gets an empty panel saying so.
    """
    from chexnet_utils.model.auroc import binary_auroc, roc_curve

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
    for c, (ax, name) in enumerate(zip(flat, names, strict=False)):
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
    :func:`chexnet_utils.model.explain.grad_cam` returns it.
    """
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
    for ax, (label, heat) in zip(axes[1:], heatmaps.items(), strict=True):
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


def elastic_runs(runs: Mapping[str, Sequence[Mapping[str, Any]]], n_train: int,
                 marks: Mapping[str, Sequence[tuple[float, str]]] | None = None,
                 title: str = ""):  # noqa: ANN201
    """Training jobs side by side, one panel each: progress in epochs (``epoch + images /
    n_train`` at every ``step`` event of :mod:`chexnet_utils.cluster.elastic`) against seconds
    since the job's first event, the world size on the right axis, and ``marks`` (time of
    ``time.time()``, label), e.g. a kill, as dashed lines. A rollback shows as a step down."""
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 3.6), squeeze=False,
                             sharey=True)
    for ax, (label, events) in zip(axes[0], runs.items(), strict=True):
        t0 = events[0]["t"]
        steps = [e for e in events if e["event"] == "step"]
        ax.plot([e["t"] - t0 for e in steps], [e["epoch"] + e["images"] / n_train for e in steps],
                ".", ms=3, color="tab:blue", label="progress (epochs)")
        size_ax = ax.twinx()
        size_t, sizes = _world_size_line(events)
        size_ax.step([x - t0 for x in size_t], sizes, where="post", color="tab:orange",
                     label="workers")
        size_ax.set_ylim(0, max(e["size"] for e in events) + 1)
        size_ax.set_ylabel("workers", color="tab:orange")
        for when, what in (marks or {}).get(label, ()):
            ax.axvline(when - t0, ls="--", color="tab:red")
            ax.annotate(what, (when - t0, 0), rotation=90, fontsize=8, color="tab:red",
                        xytext=(3, 3), textcoords="offset points")
        ax.set(title=label, xlabel="seconds since the job's first event")
    axes[0][0].set_ylabel("progress (epochs)", color="tab:blue")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def _world_size_line(events: Sequence[Mapping[str, Any]]) -> tuple[list[float], list[int]]:
    """(times, sizes) of the workers at each step, with 0 while no job ran: from the last step
    of a job to the first event of the next (a rank 0 whose process first appeared after that
    last step, so a new job, not a worker that joined)."""
    first_seen: dict[int, float] = {}
    for e in events:
        first_seen.setdefault(e["pid"], e["t"])
    times: list[float] = []
    sizes: list[int] = []
    for e in events:
        if e["event"] != "step":
            continue
        if times and first_seen[e["pid"]] > times[-1]:
            times += [times[-1], first_seen[e["pid"]]]
            sizes += [0, 0]
        times.append(e["t"])
        sizes.append(e["size"])
    return times, sizes
