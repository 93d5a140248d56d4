"""What goes wrong when a chest X-ray data set is split by image instead of by patient.

NIH ChestX-ray14 has 112,120 images of 30,805 patients: many patients have several films.
Their films share anatomy, so a model can learn to recognise the *patient* and carry the
patient's labels across. If the same patient is on both sides of a split, the test score
rewards that memorisation and overstates how the model does on new patients. These helpers
make the effect visible: :func:`image_level_split` is the wrong split,
:func:`patients_on_both_sides` counts the damage, and :func:`same_patient_similarity`
shows that films of one patient are more alike than films of two.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from chexnet_utils.data.nih import ImageRecord, Split


def image_level_split(records: Sequence[ImageRecord], test_fraction: float = 0.2,
                      seed: int = 0) -> Split:
    """The *wrong* split: images drawn at random, ignoring who the patient is (no val part)."""
    order = list(records)
    random.Random(seed).shuffle(order)
    n_test = round(len(order) * test_fraction)
    return Split(train=order[n_test:], val=[], test=order[:n_test])


def patients_on_both_sides(split: Split) -> dict[str, float]:
    """How much of the test part belongs to patients who are also in train.

    Returns the number of such patients, and the share of test images that belong to them.
    """
    train_patients = {r.patient_id for r in split.train}
    shared = {r.patient_id for r in split.test} & train_patients
    leaked_images = sum(r.patient_id in shared for r in split.test)
    return {"patients_in_both": float(len(shared)),
            "test_images_of_train_patients": leaked_images / max(1, len(split.test))}


def _thumbnail(path: Path, size: int) -> np.ndarray:
    with Image.open(path) as im:
        im.draft("L", (size * 4, size * 4))
        arr = np.asarray(im.convert("L").resize((size, size), Image.Resampling.BILINEAR),
                         np.float32)
    arr -= arr.mean()
    return arr / (np.linalg.norm(arr) + 1e-6)


def same_patient_similarity(records: Sequence[ImageRecord], image_paths: Mapping[str, Path],
                            n_pairs: int = 40, size: int = 32, seed: int = 0
                            ) -> tuple[np.ndarray, np.ndarray]:
    """Pixel correlation of image pairs from the same patient vs from different patients.

    Draws up to ``n_pairs`` pairs of each kind among images present on disk, compares
    ``size`` x ``size`` thumbnails, and returns the two arrays of correlations.
    """
    rng = random.Random(seed)
    by_patient: dict[int, list[str]] = defaultdict(list)
    for r in records:
        if r.image_index in image_paths:
            by_patient[r.patient_id].append(r.image_index)
    multi = [names for names in by_patient.values() if len(names) >= 2]
    if not multi or len(by_patient) < 2:
        raise ValueError("need at least one patient with two images, and two patients")
    cache: dict[str, np.ndarray] = {}

    def thumb(name: str) -> np.ndarray:
        if name not in cache:
            cache[name] = _thumbnail(image_paths[name], size)
        return cache[name]

    same, different = [], []
    patients = list(by_patient)
    for _ in range(n_pairs):
        a, b = rng.sample(rng.choice(multi), 2)
        same.append(float((thumb(a) * thumb(b)).sum()))
        p, q = rng.sample(patients, 2)
        different.append(float((thumb(rng.choice(by_patient[p])) *
                                thumb(rng.choice(by_patient[q]))).sum()))
    return np.array(same), np.array(different)
