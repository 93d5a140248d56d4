"""AUROC, exactly, in numpy; and the CheXNet paper's figures to compare with.

* :func:`per_class_auroc`, :func:`mean_auroc` (exact: the Mann-Whitney statistic, the number
  scikit-learn's ``roc_auc_score`` gives, with NaN for a class lacking positives or
  negatives) and :func:`roc_curve` (the points whose area they are). Keras' thresholded
  estimate for training logs is :class:`chexnet_utils.model.models.MeanAUROC`.
* :data:`CHEXNET_PAPER_AUROC` - the paper's per-class test AUROC, and its mean.

Importing it imports no TensorFlow: the unit tests, the callbacks and the plots use it alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from chexnet_utils.data.labels import PATHOLOGIES

__all__ = ["CHEXNET_PAPER_AUROC", "CHEXNET_PAPER_MEAN_AUROC", "binary_auroc", "mean_auroc",
           "per_class_auroc", "roc_curve"]

CHEXNET_PAPER_AUROC: dict[str, float] = {
    "Atelectasis": 0.8094,
    "Cardiomegaly": 0.9248,
    "Effusion": 0.8638,
    "Infiltration": 0.7345,
    "Mass": 0.8676,
    "Nodule": 0.7802,
    "Pneumonia": 0.7680,
    "Pneumothorax": 0.8887,
    "Consolidation": 0.7901,
    "Edema": 0.8878,
    "Emphysema": 0.9371,
    "Fibrosis": 0.8047,
    "Pleural_Thickening": 0.8062,
    "Hernia": 0.9164,
}
"""Per-class test AUROC of CheXNet (Rajpurkar et al. 2017, DenseNet-121, 224 px, on the
NIH ChestX-ray14 test set), in :data:`~chexnet_utils.data.labels.PATHOLOGIES` order."""

CHEXNET_PAPER_MEAN_AUROC: float = 0.841
"""The paper's mean over the 14 classes (``mean(CHEXNET_PAPER_AUROC.values())`` = 0.8414)."""


def _binary_inputs(y_true: Sequence[float] | np.ndarray, y_score: Sequence[float] | np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Flatten one binary problem: positives mask (``y_true >= 0.5``), float scores, and the
    counts of positives and negatives. Raises ``ValueError`` when the lengths differ."""
    t = np.asarray(y_true, dtype=np.float64).reshape(-1) >= 0.5
    s = np.asarray(y_score, dtype=np.float64).reshape(-1)
    if t.shape != s.shape:
        raise ValueError(f"y_true has {t.size} values, y_score {s.size}")
    n_pos = int(t.sum())
    return t, s, n_pos, t.size - n_pos


def binary_auroc(y_true: Sequence[float] | np.ndarray,
                 y_score: Sequence[float] | np.ndarray) -> float:
    """Area under the ROC curve of one binary problem, exactly (the number
    ``sklearn.metrics.roc_auc_score`` gives).

    AUROC is the probability that a random positive scores higher than a random negative
    (ties count one half), i.e. the Mann-Whitney U statistic divided by ``P * N`` (Hanley and
    McNeil 1982, Radiology 143:29-36: the area equals the Wilcoxon statistic). U comes from the
    ranks of all scores, tied scores sharing their average rank: ``U = (sum of the positives'
    ranks) - P (P + 1) / 2``. ``y_true`` entries >= 0.5 are positives. Returns NaN when
    ``y_true`` holds only one class (AUROC is undefined) or a score is not finite.
    """
    t, s, n_pos, n_neg = _binary_inputs(y_true, y_score)
    if n_pos == 0 or n_neg == 0 or not np.all(np.isfinite(s)):
        return math.nan
    _, group, counts = np.unique(s, return_inverse=True, return_counts=True)
    average_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based, ties share the mean
    u = average_rank[group][t].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def roc_curve(y_true: Sequence[float] | np.ndarray,
              y_score: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ROC curve of one binary problem: ``(false positive rate, true positive rate)``,
    the points ``sklearn.metrics.roc_curve(..., drop_intermediate=False)`` gives.

    One point per distinct score, taken as the threshold from the highest score down
    ("positive if score >= threshold"), plus the start point ``(0, 0)``; tied scores move the
    curve diagonally, as they should. The area under these points by the trapezoidal rule is
    exactly :func:`binary_auroc`. ``y_true`` entries >= 0.5 are positives. Returns two
    empty arrays when ``y_true`` holds only one class (no curve exists); raises
    ``ValueError`` for a score that is not finite.
    """
    t, s, n_pos, n_neg = _binary_inputs(y_true, y_score)
    if n_pos == 0 or n_neg == 0:
        return np.zeros(0), np.zeros(0)
    if not np.all(np.isfinite(s)):
        raise ValueError("y_score holds NaN or infinite values: no ROC curve")
    order = np.argsort(-s, kind="stable")
    last_of_tie = np.r_[np.diff(s[order]) != 0, True]  # one point per distinct score
    tps = np.cumsum(t[order])[last_of_tie]
    fps = np.cumsum(~t[order])[last_of_tie]
    return np.r_[0.0, fps / n_neg], np.r_[0.0, tps / n_pos]


def per_class_auroc(y_true: np.ndarray | Sequence[Sequence[float]],
                    y_score: np.ndarray | Sequence[Sequence[float]],
                    names: Sequence[str] = PATHOLOGIES) -> dict[str, float]:
    """AUROC of every column: ``{class name: AUROC}`` (:func:`binary_auroc` per class).

    ``y_true`` (multi-hot) and ``y_score`` (probabilities or any monotone score) have shape
    ``(n_images, n_classes)``; ``names`` names the columns (default: the 14 pathologies).
    A class whose column holds only positives or only negatives gets NaN - common on small
    splits (the synthetic CI test split has no Hernia at all), and :func:`mean_auroc` skips it.
    """
    t = np.asarray(y_true, dtype=np.float64)
    s = np.asarray(y_score, dtype=np.float64)
    if t.ndim != 2 or t.shape != s.shape:
        raise ValueError(f"y_true and y_score must be 2-D of the same shape, got "
                         f"{t.shape} and {s.shape}")
    if t.shape[1] != len(names):
        raise ValueError(f"{t.shape[1]} columns but {len(names)} class names")
    return {name: binary_auroc(t[:, c], s[:, c]) for c, name in enumerate(names)}


def mean_auroc(y_true: np.ndarray | Sequence[Sequence[float]] | Mapping[str, float],
               y_score: np.ndarray | Sequence[Sequence[float]] | None = None) -> float:
    """Mean AUROC over the classes where it is defined (NaN classes are left out).

    Call as ``mean_auroc(y_true, y_score)`` or on the result of :func:`per_class_auroc`
    (``mean_auroc(per_class)``). NaN when no class has both positives and negatives. The
    paper's 0.841 is the mean over all 14 classes; on a split missing some classes the mean
    is over fewer classes, so compare it with the paper only on a large test split.
    """
    if y_score is None:
        if not isinstance(y_true, Mapping):
            raise TypeError("pass (y_true, y_score) or the dict of per_class_auroc")
        values = np.array(list(y_true.values()), dtype=np.float64)
    else:
        t = np.asarray(y_true, dtype=np.float64)
        names = [str(c) for c in range(t.shape[1])] if t.ndim == 2 else []
        values = np.array(list(per_class_auroc(t, np.asarray(y_score), names).values()))
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else math.nan
