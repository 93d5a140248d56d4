"""Synthetic ``Data_Entry_2017.csv`` rows: patients, follow-ups, demographics and labels.

:func:`sample_records` draws the metadata of a synthetic ChestX-ray14 (nothing is rendered):
patients with a skewed number of follow-up images, ages, genders, views, pixel spacings and
multi-label ``Finding Labels`` with NIH's prevalences (:data:`TARGET_PREVALENCE`) and
co-occurrences. :func:`split_by_patient` gives the ``train_val_list.txt`` / ``test_list.txt``
split with no patient in both. Every random stream comes from :func:`rng_stream` keyed by the
seed, so the rows are deterministic in ``seed``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from chexnet_utils.data import nih
from chexnet_utils.data.labels import (
    NIH_IMAGES,
    NIH_PREVALENCE,
    NO_FINDING,
    NUM_CLASSES,
    PATHOLOGIES,
)

TARGET_PREVALENCE: dict[str, float] = NIH_PREVALENCE
"""NIH's fraction of images per pathology (and ``No Finding``); the sampler aims at these."""

TEST_FRACTION = 25_596 / NIH_IMAGES
"""Share of images in NIH's ``test_list.txt`` (~0.228); the synthetic split aims at it."""

_P_FINDING = 1.0 - TARGET_PREVALENCE[NO_FINDING]

# Label model: an image has a finding with probability _P_FINDING; then one primary label is
# drawn with _PRIMARY_WEIGHTS and every other label j is added independently with probability
# _EXTRA[primary, j] = _EXTRA_SCALE * affinity * prevalence_j / sum(prevalence). The expected
# prevalence is linear in the weights, which were solved for NIH's prevalences (and rounded).
_AFFINITY_PAIRS: dict[tuple[str, str], float] = {
    ("Effusion", "Atelectasis"): 3.0, ("Effusion", "Infiltration"): 2.0,
    ("Atelectasis", "Infiltration"): 2.0, ("Edema", "Cardiomegaly"): 5.0,
    ("Edema", "Effusion"): 3.0, ("Cardiomegaly", "Effusion"): 3.0, ("Mass", "Nodule"): 3.0,
    ("Pneumonia", "Infiltration"): 3.0, ("Pneumonia", "Consolidation"): 3.0,
    ("Consolidation", "Effusion"): 2.0, ("Consolidation", "Atelectasis"): 2.0,
    ("Emphysema", "Pneumothorax"): 4.0, ("Fibrosis", "Pleural_Thickening"): 3.0,
    ("Edema", "Infiltration"): 2.0, ("Mass", "Pleural_Thickening"): 1.5,
}
_EXTRA_SCALE = 0.45481
_PRIMARY_WEIGHTS = np.array([0.12753, 0.03277, 0.14177, 0.26699, 0.07560, 0.08454, 0.01455,
                             0.07207, 0.05777, 0.02312, 0.03194, 0.02249, 0.04576, 0.00312])


def _extra_matrix() -> np.ndarray:
    idx = {p: i for i, p in enumerate(PATHOLOGIES)}
    aff = np.ones((NUM_CLASSES, NUM_CLASSES))
    for (a, b), v in _AFFINITY_PAIRS.items():
        aff[idx[a], idx[b]] = aff[idx[b], idx[a]] = v
    np.fill_diagonal(aff, 0.0)
    aff[idx["Hernia"], :] *= 0.5  # hernias are mostly reported alone
    prev = np.array([TARGET_PREVALENCE[p] for p in PATHOLOGIES])
    return _EXTRA_SCALE * aff * prev[None, :] / prev.sum()


_EXTRA = _extra_matrix()
_PRIMARY_CDF = np.cumsum(_PRIMARY_WEIGHTS / _PRIMARY_WEIGHTS.sum())
_PRIMARY_CDF[-1] = 1.0


def rng_stream(seed: int, *key: int) -> np.random.Generator:
    """The random stream of ``seed`` for one purpose, named by the integers ``key``."""
    return np.random.default_rng([seed, *key])


def _images_per_patient(n: int, seed: int) -> np.ndarray:
    """Follow-up counts per patient (skewed, mean ~3.6, max 184 like NIH), summing to n."""
    rng = rng_stream(seed, 2, 0)
    chunks: list[np.ndarray] = []
    total = 0
    while total < n:
        # Discretised log-normal: ~40 % of patients have one image, a few have dozens.
        draw = 1 + np.floor(rng.lognormal(mean=0.45, sigma=1.15, size=4096)).astype(np.int64)
        draw = np.minimum(draw, 184)
        chunks.append(draw)
        total += int(draw.sum())
    counts = np.concatenate(chunks)
    cum = np.cumsum(counts)
    last = int(np.searchsorted(cum, n))  # first patient whose images reach n
    counts = counts[: last + 1].copy()
    counts[-1] -= int(cum[last] - n)
    return counts


def _sample_multihot(n: int, seed: int) -> np.ndarray:
    """(n, 14) bool finding matrix with NIH-like prevalences and co-occurrence."""
    has_finding = rng_stream(seed, 3, 0).random(n) < _P_FINDING
    primary = np.searchsorted(_PRIMARY_CDF, rng_stream(seed, 3, 1).random(n), side="right")
    primary = np.minimum(primary, NUM_CLASSES - 1)
    extras = rng_stream(seed, 3, 2).random((n, NUM_CLASSES)) < _EXTRA[primary]
    multi = extras
    multi[np.arange(n), primary] = True
    multi &= has_finding[:, None]
    return multi


def _finding_strings(multi: np.ndarray) -> list[str]:
    codes = multi.astype(np.int64) @ (1 << np.arange(NUM_CLASSES, dtype=np.int64))
    cache: dict[int, str] = {}
    out: list[str] = []
    for code in codes.tolist():
        s = cache.get(code)
        if s is None:
            names = [p for i, p in enumerate(PATHOLOGIES) if code >> i & 1]
            s = cache[code] = "|".join(names) if names else NO_FINDING
        out.append(s)
    return out


def sample_records(n: int, seed: int = 0, size: int = 1024) -> list[nih.ImageRecord]:
    """Draw ``n`` ``Data_Entry_2017.csv`` rows: patients, follow-ups, demographics, labels.

    Patients are numbered 1..P with a skewed number of images each (mean ~3.6), follow-up
    numbers start at 0 per patient, image names are ``{patient:08d}_{follow_up:03d}.png`` and
    the rows are sorted by name, as in NIH's CSV. Ages are 1-95 (growing with follow-ups),
    gender M/F (~56 % M), view PA ~60 % / AP ~40 %, width/height ``size`` and pixel spacing
    ~0.143 mm scaled by ``1024 / size``. Finding labels follow :data:`TARGET_PREVALENCE`
    with multi-label co-occurrence. Nothing is rendered, so this is fast (50,000 rows in well
    under a second) and the first ``k`` rows do not depend on ``n`` beyond truncation of the
    last patient. Deterministic in ``seed``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if size < 1:
        raise ValueError(f"size must be positive, got {size}")
    if n == 0:
        return []
    counts = _images_per_patient(n, seed)
    n_pat = len(counts)
    patient = np.repeat(np.arange(1, n_pat + 1), counts)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    follow_up = np.arange(n) - starts

    male = rng_stream(seed, 4, 0).random(n_pat) < 0.565
    base_age = np.clip(np.rint(rng_stream(seed, 4, 1).normal(47.0, 16.5, n_pat)), 1, 95)
    years_per_visit = rng_stream(seed, 4, 2).uniform(0.0, 0.5, n_pat)
    age = np.clip(base_age[patient - 1] + np.floor(follow_up * years_per_visit[patient - 1]),
                  1, 95).astype(np.int64)

    view_pa = rng_stream(seed, 5, 0).random(n) < 0.60
    spacing_choice = np.searchsorted(np.array([0.8, 0.9]), rng_stream(seed, 5, 1).random(n),
                                     side="right")
    spacings = [round(s * 1024 / size, 6) for s in (0.143, 0.139, 0.168)]

    findings = _finding_strings(_sample_multihot(n, seed))
    genders = np.where(male, "M", "F")[patient - 1].tolist()
    views = np.where(view_pa, "PA", "AP").tolist()
    sp = [spacings[i] for i in spacing_choice.tolist()]
    return [
        nih.ImageRecord(f"{p:08d}_{f:03d}.png", lab, f, p, a, g, v, size, size, s, s)
        for p, f, a, lab, g, v, s in zip(patient.tolist(), follow_up.tolist(), age.tolist(),
                                         findings, genders, views, sp, strict=True)
    ]


def split_by_patient(records: Sequence[nih.ImageRecord], seed: int = 0,
                     test_fraction: float = TEST_FRACTION) -> tuple[list[str], list[str]]:
    """``(train_val_names, test_names)``, both sorted, with no patient in both.

    Patients are taken in a random order (by ``seed``) into the test part while they fit,
    until ``round(test_fraction * n)`` images are reached, so the test share is close to
    NIH's even for a few dozen images. With two or more patients both parts are non-empty.
    """
    by_patient: dict[int, list[str]] = {}
    for r in records:
        by_patient.setdefault(r.patient_id, []).append(r.image_index)
    patients = sorted(by_patient)
    order = rng_stream(seed, 6, 0).permutation(len(patients))
    target = round(test_fraction * len(records))
    test_p: set[int] = set()
    count = 0
    for i in order.tolist():
        p = patients[i]
        c = len(by_patient[p])
        if count + c <= target:
            test_p.add(p)
            count += c
            if count == target:
                break
    if not test_p and len(patients) >= 2:
        test_p.add(min(patients, key=lambda q: (len(by_patient[q]), q)))
    if len(test_p) == len(patients) and len(patients) >= 2:
        test_p.discard(max(test_p, key=lambda q: (len(by_patient[q]), q)))
    test = sorted(name for p in test_p for name in by_patient[p])
    train_val = sorted(name for p in patients if p not in test_p for name in by_patient[p])
    return train_val, test
