"""Figures about the data set: label prevalence vs NIH, co-occurrence, image grids."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from chexnet_utils.labels import PATHOLOGIES


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
