"""Figures about the data set: label prevalence vs NIH, co-occurrence, image grids."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from chexnet_utils.data.labels import NIH_PREVALENCE, PATHOLOGIES
from chexnet_utils.platform.lazy import lazy_module

if TYPE_CHECKING:
    from chexnet_utils.bench.conversion import ConversionThroughput

# matplotlib: imported on first use (chexnet_utils.platform.lazy)
plt = lazy_module("matplotlib.pyplot")


def label_distribution(prevalence: Mapping[str, float], reference: Mapping[str, float]
                       | None = NIH_PREVALENCE, title: str = "Label prevalence"):  # noqa: ANN201
    """Horizontal bars of prevalence per label on a log scale, NIH's beside ours."""
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
    rows = int(np.ceil(len(images) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(cols * size, rows * (size + 0.5)))
    for ax in np.atleast_1d(axes).ravel():
        ax.axis("off")
    for ax, img, title in zip(np.atleast_1d(axes).ravel(), images, titles, strict=False):
        ax.imshow(img, cmap="gray", vmin=0, vmax=255)
        ax.set_title(title.replace("|", "\n"), fontsize=8)
    fig.tight_layout()
    return fig


def similarity_histogram(same: Sequence[float] | np.ndarray,
                         different: Sequence[float] | np.ndarray, bins: int = 15):  # noqa: ANN201
    """Overlaid histograms of thumbnail correlations: pairs of films of the *same* patient
    against pairs of *different* patients
    (:func:`chexnet_utils.data.leakage.same_patient_similarity`)."""
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.hist(different, bins=bins, alpha=0.7, label="different patients")
    ax.hist(same, bins=bins, alpha=0.7, label="same patient")
    ax.set_xlabel("thumbnail correlation")
    ax.set_ylabel("image pairs")
    ax.legend()
    fig.tight_layout()
    return fig


def conversion_throughput(bench: ConversionThroughput):  # noqa: ANN201
    """One panel per image size of the result of
    :func:`chexnet_utils.bench.conversion.bench_conversion`: images/s of the conversion with
    each worker count, the speed-up in the panel title."""
    runs = bench.runs
    fig, axes = plt.subplots(1, len(runs), figsize=(9, 3.2), sharey=True, squeeze=False)
    for ax, (size, run) in zip(axes[0], runs.items(), strict=True):
        rates = run.mean_img_per_s
        ax.bar([f"{w} worker(s)" for w in rates], list(rates.values()),
               color=["tab:gray", "tab:blue"][: len(rates)])
        ax.set_title(f"{size} px: {run.speedup:.2f}x")
    axes[0][0].set_ylabel("images / s")
    fig.tight_layout()
    return fig
