"""The 14 ChestX-ray14 pathologies and conversions between ``Finding Labels`` and multi-hot.

The names are spelled exactly as NIH's ``Data_Entry_2017.csv`` spells them (note
``Pleural_Thickening`` with an underscore). An image without any of them is labelled
``No Finding``; several findings are joined with ``|``, e.g. ``Cardiomegaly|Emphysema``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PATHOLOGIES: tuple[str, ...] = (
    "Atelectasis",
    "Cardiomegaly",
    "Effusion",
    "Infiltration",
    "Mass",
    "Nodule",
    "Pneumonia",
    "Pneumothorax",
    "Consolidation",
    "Edema",
    "Emphysema",
    "Fibrosis",
    "Pleural_Thickening",
    "Hernia",
)
"""The 14 pathology names, in the order CheXNet's output vector uses."""

NUM_CLASSES: int = len(PATHOLOGIES)
NO_FINDING: str = "No Finding"
LABEL_SEPARATOR: str = "|"

_INDEX = {name: i for i, name in enumerate(PATHOLOGIES)}


class LabelError(ValueError):
    """A ``Finding Labels`` entry that cannot be turned into a label vector."""


class UnknownLabelError(LabelError):
    """A ``Finding Labels`` entry names something that is not one of the 14 pathologies."""

    def __init__(self, label: str, finding_labels: str) -> None:
        super().__init__(
            f"unknown label {label!r} in Finding Labels {finding_labels!r}; "
            f"expected {NO_FINDING!r} or '|'-joined names from: {', '.join(PATHOLOGIES)}"
        )
        self.label = label


def parse_finding_labels(finding_labels: str) -> list[str]:
    """Split a ``Finding Labels`` string into pathology names (empty for ``No Finding``).

    Whitespace around names is ignored; an empty string or ``No Finding`` gives ``[]``.
    Raises :class:`UnknownLabelError` for a name outside :data:`PATHOLOGIES`, and
    :class:`LabelError` for ``No Finding`` combined with a pathology.
    """
    text = finding_labels.strip()
    if text in ("", NO_FINDING):
        return []
    names = [part.strip() for part in text.split(LABEL_SEPARATOR)]
    if NO_FINDING in names:
        raise LabelError(f"{NO_FINDING!r} combined with other labels in {finding_labels!r}")
    for name in names:
        if name not in _INDEX:
            raise UnknownLabelError(name, finding_labels)
    # Keep the canonical order and drop repeats so equal label sets compare equal.
    return [p for p in PATHOLOGIES if p in set(names)]


def labels_to_multihot(finding_labels: str) -> np.ndarray:
    """``'Cardiomegaly|Emphysema'`` -> float32 vector of length 14 with ones at those classes."""
    vec = np.zeros(NUM_CLASSES, dtype=np.float32)
    for name in parse_finding_labels(finding_labels):
        vec[_INDEX[name]] = 1.0
    return vec


def multihot_to_labels(vector: Sequence[float] | np.ndarray) -> str:
    """Inverse of :func:`labels_to_multihot`: a 14-vector back to a ``Finding Labels`` string.

    Entries >= 0.5 count as present, so thresholded predictions can be passed too.
    """
    arr = np.asarray(vector, dtype=np.float32).reshape(-1)
    if arr.shape[0] != NUM_CLASSES:
        raise ValueError(f"expected a vector of {NUM_CLASSES} values, got {arr.shape[0]}")
    present = [name for name, v in zip(PATHOLOGIES, arr, strict=True) if v >= 0.5]
    return LABEL_SEPARATOR.join(present) if present else NO_FINDING


# NIH ChestX-ray14 (Data_Entry_2017.csv): images carrying each label, out of 112,120.
NIH_IMAGES: int = 112_120
"""Images in NIH ChestX-ray14."""

NIH_LABEL_COUNTS: dict[str, int] = {
    "Atelectasis": 11_559, "Cardiomegaly": 2_776, "Effusion": 13_317, "Infiltration": 19_894,
    "Mass": 5_782, "Nodule": 6_331, "Pneumonia": 1_431, "Pneumothorax": 5_302,
    "Consolidation": 4_667, "Edema": 2_303, "Emphysema": 2_516, "Fibrosis": 1_686,
    "Pleural_Thickening": 3_385, "Hernia": 227, NO_FINDING: 60_361,
}
"""Images per label in NIH's ``Data_Entry_2017.csv`` (the 14 pathologies, then No Finding)."""

NIH_PREVALENCE: dict[str, float] = {
    **{p: NIH_LABEL_COUNTS[p] / NIH_IMAGES for p in PATHOLOGIES},
    NO_FINDING: NIH_LABEL_COUNTS[NO_FINDING] / NIH_IMAGES,
}
"""Share of the 112,120 NIH images carrying each label (No Finding ~0.538, Hernia ~0.002)."""
