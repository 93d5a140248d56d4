"""A synthetic stand-in for NIH ChestX-ray14, written in the exact NIH layout.

:func:`generate_dataset` writes::

    OUT_DIR/
      Data_Entry_2017.csv              # nih.write_data_entry, 11 fields like NIH's
      train_val_list.txt               # split by patient (~77 % of images)
      test_list.txt                    # ~23 % of images, like NIH's 25,596 / 112,120
      images_001/images/00000001_000.png
      ...                              # ``per_folder`` PNGs per folder (NIH: ~10,000)
      SYNTHETIC.json                   # marker: {n, size, seed, generator version, ...}

so that :meth:`chexnet_utils.nih.NIHDataset.load` reads it unchanged. The images are 8-bit
greyscale PNGs that look like frontal (PA/AP) chest films: dark air around a bright body with
neck and shoulders, two dark lung fields with vessel markings, ribs, clavicles, trachea, spine,
the heart shadow to the image's right of the midline (the patient's left), diaphragm domes and
a gastric bubble. Each of the 14 pathologies adds its own sign (an enlarged heart, fluid at a lung base,
a dark rim without markings, a round mass, ...) with random position, size and intensity; the
signs are meant to be learnable by a small CNN at 128x128, not to be radiologically faithful.

Labels are drawn with NIH's prevalences (No Finding ~54 %, Infiltration ~18 %, ...) and
co-occurrences (Effusion with Atelectasis, Edema with Cardiomegaly, ...); patients have
several follow-up images (~3.6 on average, skewed) and each patient keeps the same anatomy
across follow-ups, so a split that is not by patient leaks, as it would on the real data.

Everything is deterministic in ``seed``: each image's random stream is derived from
``(seed, image index)`` and its anatomy from ``(seed, patient id)``, so the files are
byte-identical whatever the number of worker processes.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from chexnet_utils import nih
from chexnet_utils.atomic import write_text_atomic
from chexnet_utils.labels import NO_FINDING, NUM_CLASSES, PATHOLOGIES, parse_finding_labels
from chexnet_utils.processes import worker_init

__all__ = [
    "GENERATOR_VERSION",
    "MARKER_NAME",
    "TARGET_PREVALENCE",
    "TEST_FRACTION",
    "sample_records",
    "split_by_patient",
    "render_image",
    "encode_png",
    "generate_dataset",
    "ensure_dataset",
    "read_marker",
]

GENERATOR_VERSION = 1
"""Bumped whenever the output for a given (n, size, seed) changes."""

MARKER_NAME = "SYNTHETIC.json"
_GENERATOR_ID = "chexnet_utils.synthetic"

# NIH ChestX-ray14 (Data_Entry_2017.csv): images per pathology out of 112,120.
_NIH_IMAGES = 112_120
_NIH_COUNTS: dict[str, int] = {
    "Atelectasis": 11_559, "Cardiomegaly": 2_776, "Effusion": 13_317, "Infiltration": 19_894,
    "Mass": 5_782, "Nodule": 6_331, "Pneumonia": 1_431, "Pneumothorax": 5_302,
    "Consolidation": 4_667, "Edema": 2_303, "Emphysema": 2_516, "Fibrosis": 1_686,
    "Pleural_Thickening": 3_385, "Hernia": 227,
}
_NIH_NO_FINDING = 60_361

TARGET_PREVALENCE: dict[str, float] = {
    **{p: _NIH_COUNTS[p] / _NIH_IMAGES for p in PATHOLOGIES},
    NO_FINDING: _NIH_NO_FINDING / _NIH_IMAGES,
}
"""NIH's fraction of images per pathology (and ``No Finding``); the sampler aims at these."""

TEST_FRACTION = 25_596 / _NIH_IMAGES
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

_NAME_RE = re.compile(r"\d{8}_\d{3}\.png")


# --------------------------------------------------------------------------------------------
# Metadata and labels
# --------------------------------------------------------------------------------------------

def _stream(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng([seed, *key])


def _images_per_patient(n: int, seed: int) -> np.ndarray:
    """Follow-up counts per patient (skewed, mean ~3.6, max 184 like NIH), summing to n."""
    rng = _stream(seed, 2, 0)
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
    has_finding = _stream(seed, 3, 0).random(n) < _P_FINDING
    primary = np.searchsorted(_PRIMARY_CDF, _stream(seed, 3, 1).random(n), side="right")
    primary = np.minimum(primary, NUM_CLASSES - 1)
    extras = _stream(seed, 3, 2).random((n, NUM_CLASSES)) < _EXTRA[primary]
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

    male = _stream(seed, 4, 0).random(n_pat) < 0.565
    base_age = np.clip(np.rint(_stream(seed, 4, 1).normal(47.0, 16.5, n_pat)), 1, 95)
    years_per_visit = _stream(seed, 4, 2).uniform(0.0, 0.5, n_pat)
    age = np.clip(base_age[patient - 1] + np.floor(follow_up * years_per_visit[patient - 1]),
                  1, 95).astype(np.int64)

    view_pa = _stream(seed, 5, 0).random(n) < 0.60
    spacing_choice = np.searchsorted(np.array([0.8, 0.9]), _stream(seed, 5, 1).random(n),
                                     side="right")
    spacings = [round(s * 1024 / size, 6) for s in (0.143, 0.139, 0.168)]

    findings = _finding_strings(_sample_multihot(n, seed))
    genders = np.where(male, "M", "F")[patient - 1].tolist()
    views = np.where(view_pa, "PA", "AP").tolist()
    sp = [spacings[i] for i in spacing_choice.tolist()]
    return [
        nih.ImageRecord(f"{p:08d}_{f:03d}.png", lab, f, p, a, g, v, size, size, s, s)
        for p, f, a, lab, g, v, s in zip(patient.tolist(), follow_up.tolist(), age.tolist(),
                                         findings, genders, views, sp)
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
    order = _stream(seed, 6, 0).permutation(len(patients))
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


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------

_RENDER_MAX = 512
"""Images larger than this are rendered at this side and upscaled (X-rays are smooth)."""

_LUT_STEPS = 4  # attenuation units are quantised to 1/4 for the tone-curve lookup
_LUT_MAX = 400.0


@dataclass(frozen=True)
class _Anatomy:
    """One patient's chest, in normalised image coordinates (x, y in [-1, 1], y downwards).

    Both lungs share one outline mirrored about the midline: between the mediastinal border
    ``xmed`` and the lateral wall ``xlat``, from the apex down to the diaphragm dome of its
    side. The heart (tilted ellipse) lies over the left lung, i.e. on the image's right.
    """

    bw: float      # torso half-width
    nw: float      # neck half-width
    sy: float      # top of the shoulders (y)
    xmed: float    # mediastinal border |x| of the lungs
    xlat: float    # lateral wall |x| of the lungs
    apex: float    # lung apex (y)
    dome_r: float  # top of the right hemidiaphragm (image left)
    dome_l: float  # top of the left hemidiaphragm (image right), usually lower
    dome_h: float  # how much lower the diaphragm is at the costophrenic angle than at its top
    hcx: float     # heart centre x (positive: image right = patient's left)
    ha: float      # heart half-axes and tilt
    hb: float
    hang: float
    hx: float      # hilum |x|, y
    hy: float
    tissue: float  # soft-tissue attenuation
    lung_dark: float
    mk_amp: float  # vessel markings
    mk_n: float
    rib_n: float
    rib_k: float
    rib_x0: float
    rib_phase: float
    spine_w: float

    @property
    def ylat(self) -> float:
        """Lowest point of the lungs (the costophrenic angles)."""
        return max(self.dome_r, self.dome_l) + self.dome_h

    @property
    def xapex(self) -> float:
        return self.xmed + 0.3 * (self.xlat - self.xmed)

    def dome_top(self, side: int) -> float:
        return self.dome_r if side < 0 else self.dome_l

    def lung_edges(self, t: Any) -> tuple[Any, Any]:
        """Medial and lateral |x| of the lung outline at relative height ``t`` (0 = apex)."""
        xa = self.xapex
        if isinstance(t, np.ndarray):
            sq = np.sqrt
            tl, tm = np.clip(t * (1 / 0.45), 0, 1), np.clip(t * (1 / 0.2), 0, 1)
        else:
            sq = math.sqrt  # type: ignore[assignment]
            tl, tm = min(max(t / 0.45, 0.0), 1.0), min(max(t / 0.2, 0.0), 1.0)
        return xa - (xa - self.xmed) * sq(tm), xa + (self.xlat - xa) * sq(tl)

    def lung_point(self, side: int, u: float, t: float) -> tuple[float, float]:
        """(x, y) at fraction ``u`` from the mediastinal to the lateral edge, height ``t``."""
        m, lat = self.lung_edges(t)
        return side * (m + u * (lat - m)), self.apex + t * (self.ylat - self.apex)


def _u(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(rng.uniform(lo, hi))


def _draw_anatomy(rng: np.random.Generator) -> _Anatomy:
    dome_r = _u(rng, 0.40, 0.50)
    return _Anatomy(
        bw=_u(rng, 0.78, 0.88), nw=_u(rng, 0.15, 0.20), sy=_u(rng, -0.80, -0.70),
        xmed=_u(rng, 0.08, 0.12), xlat=_u(rng, 0.60, 0.68), apex=_u(rng, -0.72, -0.62),
        dome_r=dome_r, dome_l=dome_r + _u(rng, 0.02, 0.06), dome_h=_u(rng, 0.09, 0.14),
        hcx=_u(rng, 0.10, 0.14), ha=_u(rng, 0.27, 0.30), hb=_u(rng, 0.19, 0.22),
        hang=_u(rng, 0.30, 0.50), hx=_u(rng, 0.15, 0.19), hy=_u(rng, -0.12, -0.02),
        tissue=_u(rng, 140, 158), lung_dark=_u(rng, 78, 92), mk_amp=_u(rng, 12, 18),
        mk_n=_u(rng, 14, 20), rib_n=_u(rng, 8.5, 10.0), rib_k=_u(rng, 0.8, 1.2),
        rib_x0=_u(rng, 0.32, 0.40), rib_phase=_u(rng, 0.0, 1.0), spine_w=_u(rng, 0.05, 0.065),
    )


@dataclass(frozen=True)
class _Shot:
    """Per-image acquisition: positioning, breath, exposure, and seeds for the textures."""

    dx: float
    dy: float
    breath: float
    gain: float
    offset: float
    gamma: float
    bg: float
    noise_amp: float
    seeds: tuple[int, ...]  # illumination, markings, noise, parenchyma


def _draw_shot(rng: np.random.Generator) -> _Shot:
    return _Shot(dx=_u(rng, -0.03, 0.03), dy=_u(rng, -0.03, 0.03), breath=_u(rng, -0.03, 0.03),
                 gain=_u(rng, 0.92, 1.08), offset=_u(rng, -6, 6), gamma=_u(rng, 0.9, 1.1),
                 bg=_u(rng, 8, 20), noise_amp=_u(rng, 3.0, 4.5),
                 seeds=tuple(int(s) for s in rng.integers(0, 2**63, size=4)))


class _Canvas:
    """Attenuation image being built (float32, bigger = brighter) plus the lung maps."""

    def __init__(self, w: int, dx: float, dy: float) -> None:
        self.w = w
        self.dx, self.dy = dx, dy
        coords = (np.arange(w, dtype=np.float32) + 0.5) * np.float32(2.0 / w) - np.float32(1.0)
        self.x = (coords - np.float32(dx))[None, :]  # image left (x < 0) = patient's right
        self.y = (coords - np.float32(dy))[:, None]  # y grows downwards
        self.ax = np.abs(self.x)
        self.A = np.zeros((w, w), np.float32)
        # Filled by _render_base (full-size maps, or (w, 1) columns for per-row values):
        self.t = self.y        # relative lung height, 0 at the apex, 1 at the CP angles
        self.xm = self.y       # mediastinal and lateral lung edge per row
        self.xl = self.y
        self.inside = self.A   # 1 inside the lung outline (edge ~1 px), 0 outside
        self.below = self.A    # 1 above the diaphragm
        self.L = self.A        # soft lung mask (how much lung darkness)
        self.mark = self.A     # vessel markings (attenuation added inside the lungs)
        self.dark = self.A     # lung darkness subtracted from the soft tissue (>= 0)

    def box(self, x0: float, x1: float, y0: float, y1: float
            ) -> tuple[slice, slice] | None:
        """Pixel slices covering anatomical [x0, x1] x [y0, y1] (None if off the image)."""
        f = self.w / 2.0
        c0 = max(0, int(math.floor((x0 + self.dx + 1.0) * f - 0.5)))
        c1 = min(self.w, int(math.ceil((x1 + self.dx + 1.0) * f - 0.5)) + 1)
        r0 = max(0, int(math.floor((y0 + self.dy + 1.0) * f - 0.5)))
        r1 = min(self.w, int(math.ceil((y1 + self.dy + 1.0) * f - 0.5)) + 1)
        if c1 <= c0 or r1 <= r0:
            return None
        return slice(r0, r1), slice(c0, c1)

    def edge_distance(self, rs: slice, cs: slice, an: _Anatomy) -> np.ndarray:
        """Distance (normalised units) to the lateral or apical lung outline."""
        dlat = self.xl[rs] - self.ax[:, cs]
        dtop = self.y[rs] - an.apex
        return np.minimum(dlat, dtop)


def _ellipse(x: np.ndarray, y: np.ndarray, cx: float, cy: float, rx: float, ry: float,
             edge: float, angle: float = 0.0) -> np.ndarray:
    """Soft ellipse: 1 inside, 0 outside, ramp of about ``edge`` (normalised units) wide."""
    dx, dy = x - cx, y - cy
    if angle:
        c, s = math.cos(angle), math.sin(angle)
        dx, dy = dx * c + dy * s, dy * c - dx * s
    q = (dx * (1.0 / rx)) ** 2 + (dy * (1.0 / ry)) ** 2
    k = min(rx, ry) / (2.0 * max(edge, 1e-4))
    return np.clip((1.0 - q) * k, 0.0, 1.0)


def _smooth_noise(rng: np.random.Generator, grid: int, shape: tuple[int, int]) -> np.ndarray:
    """Low-frequency noise (~N(0,1) at ``grid`` x ``grid`` knots, bicubic in between)."""
    g = rng.standard_normal((grid, grid)).astype(np.float32)
    h, w = shape
    return np.asarray(Image.fromarray(g).resize((w, h), Image.Resampling.BICUBIC))


def _render_base(c: _Canvas, an: _Anatomy, shot: _Shot) -> None:
    x, y, ax, A = c.x, c.y, c.ax, c.A
    w = c.w
    # Body: neck, rounded shoulders, torso.
    t = np.clip((y - (an.sy - 0.02)) * (1 / 0.4), 0.0, 1.0)
    half = an.nw + (an.bw - an.nw) * np.sqrt(1.0 - (1.0 - t) ** 2)
    A[:] = np.clip((half - ax) * (1 / 0.05), 0.0, 1.0)
    # Soft tissue is thicker towards the middle and the abdomen.
    prof = an.tissue * (0.9 + 0.1 * np.clip(y + 0.4, 0.0, 1.0))
    A *= prof.astype(np.float32)
    A += shot.bg

    # Lungs: outline per row, cut at the bottom by the diaphragm domes.
    tl = (y - an.apex) * (1.0 / (an.ylat - an.apex))
    xm, xl = an.lung_edges(tl)
    xm = np.where(tl > 0, xm, np.float32(9.0))  # no lung above the apex
    tx = (ax - 0.5 * (an.xmed + an.xlat)) * (2.0 / (an.xlat - an.xmed))
    top = np.where(x < 0, np.float32(an.dome_r), np.float32(an.dome_l))
    dome = top + an.dome_h * np.minimum(tx * tx, 1.6)
    below = np.clip((dome - y) * (1 / 0.015), 0.0, 1.0)
    dmed = ax - xm
    dlat = xl - ax
    edge = 1.0 / max(2.0 / w, 0.006)
    inside = np.clip(dmed * edge, 0, 1) * np.clip(dlat * edge, 0, 1) * below
    # Lung darkness fades towards the edges (thinner lung) and the bases (soft tissue).
    L = (np.clip(dmed * (1 / 0.05), 0, 1) * np.clip(dlat * (1 / 0.07), 0, 1) * below
         * (1.0 - 0.22 * np.clip(tl * 2.0 - 1.0, 0.0, 1.0)))

    # Vessel markings: wiggly, tapering lines radiating from the hila.
    rng_mk = np.random.default_rng(shot.seeds[1])
    warp = _smooth_noise(rng_mk, 14, (w, w))
    gate = _smooth_noise(rng_mk, 20, (w, w))
    px = ax - an.hx
    py = y - an.hy
    rr = np.sqrt(px * px + py * py)
    theta = np.arctan2(py, px)
    streak = np.clip(np.cos(theta * an.mk_n + warp * 1.2) - 0.55, 0.0, 1.0)
    streak *= np.clip(gate + 0.9, 0.0, 1.0)
    fall = np.clip(1.0 - rr * (1 / 0.9), 0.0, 1.0) * np.clip(rr * (1 / 0.1), 0.0, 1.0)
    mark = streak * fall * (an.mk_amp * 2.2) * L
    paren = _smooth_noise(np.random.default_rng(shot.seeds[3]), 28, (w, w))
    lungsig = L * (an.lung_dark + 4.0 * paren) - mark
    A -= lungsig
    c.t, c.xm, c.xl, c.inside, c.below, c.L, c.mark = tl, xm, xl, inside, below, L, mark
    c.dark = lungsig

    # Trachea.
    b = c.box(-0.05, 0.05, -1.0, an.hy - 0.12)
    if b:
        rs, cs = b
        tr = np.clip((0.028 - ax[:, cs]) * (1 / 0.01), 0, 1)
        A[rs, cs] -= tr * 22.0 * np.clip((an.hy - 0.14 - y[rs]) * 10.0, 0, 1)
    # Heart and aortic knob: soft-tissue density in front of the lungs.
    R = an.ha + 0.05
    hcy = an.dome_l - an.hb * 0.6
    b = c.box(an.hcx - R, an.hcx + R, hcy - R, hcy + R)
    if b:
        rs, cs = b
        heart = _ellipse(x[:, cs], y[rs], an.hcx, hcy, an.ha, an.hb, 0.015, an.hang)
        A[rs, cs] += heart * (lungsig[rs, cs] * 0.95 + 3.0)
        L[rs, cs] *= 1.0 - heart
        lungsig[rs, cs] *= 1.0 - heart
    kx, ky = an.xmed + 0.02, an.hy - 0.24
    b = c.box(kx - 0.08, kx + 0.08, ky - 0.08, ky + 0.08)
    if b:
        rs, cs = b
        knob = _ellipse(x[:, cs], y[rs], kx, ky, 0.06, 0.055, 0.015)
        A[rs, cs] += knob * (lungsig[rs, cs] * 0.9 + 3.0)
        L[rs, cs] *= 1.0 - knob
        lungsig[rs, cs] *= 1.0 - knob
    # Hila.
    b = c.box(-0.4, 0.4, an.hy - 0.2, an.hy + 0.2)
    if b:
        rs, cs = b
        hd = ((ax[:, cs] - an.hx) * (1 / 0.05)) ** 2 + ((y[rs] - an.hy) * (1 / 0.09)) ** 2
        A[rs, cs] += 16.0 * np.exp(-hd)

    # Spine with vertebral modulation.
    b = c.box(-an.spine_w - 0.03, an.spine_w + 0.03, an.sy - 0.1, 1.0)
    if b:
        rs, cs = b
        vert = 0.7 + 0.3 * np.cos(y[rs] * np.float32(2 * math.pi * 8))
        A[rs, cs] += 14.0 * np.clip((an.spine_w - ax[:, cs]) * (1 / 0.012), 0, 1) * vert

    # Posterior ribs: rising from the spine, arching down along the lateral wall.
    b = c.box(-an.xlat - 0.08, an.xlat + 0.08, an.apex - 0.12, an.ylat + 0.05)
    if b:
        rs, cs = b
        d = ax[:, cs] - an.rib_x0
        v = y[rs] - np.where(d > 0, an.rib_k * 3.5, an.rib_k) * d * d
        ph = np.clip((v - (an.apex - 0.1)) * (1.0 / (an.ylat - an.apex + 0.1)), 0.0, 1.0)
        ph = ph ** 0.85 * an.rib_n + an.rib_phase
        band = np.clip((np.cos(ph * np.float32(2 * math.pi)) - 0.3) * 2.5, 0.0, 1.0)
        cage = (np.clip((an.xlat + 0.05 - ax[:, cs]) * 30.0, 0, 1)
                * np.clip((ax[:, cs] - an.spine_w) * 30.0, 0, 1)
                * np.clip((y[rs] - (an.apex - 0.1)) * 20.0, 0, 1))
        A[rs, cs] += band * cage * (6.0 + 15.0 * L[rs, cs]) * below[rs, cs]

    # Clavicles: from the sternum out and up to the shoulders.
    b = c.box(-0.65, 0.65, an.sy - 0.05, an.apex + 0.25)
    if b:
        rs, cs = b
        axc = ax[:, cs]
        yc = an.apex + 0.14 - 0.28 * (axc - 0.05) + 0.12 * (axc - 0.05) ** 2
        cl = np.clip((0.035 - np.abs(y[rs] - yc)) * (1 / 0.012), 0, 1)
        cl *= np.clip((axc - 0.05) * 30, 0, 1) * np.clip((0.62 - axc) * 20, 0, 1)
        A[rs, cs] += 24.0 * cl

    # Gastric bubble under the left hemidiaphragm.
    gx, gy = 0.5 * (an.xmed + an.xlat) + 0.05, an.dome_l + 0.12
    b = c.box(gx - 0.12, gx + 0.12, gy - 0.07, gy + 0.07)
    if b:
        rs, cs = b
        A[rs, cs] -= 35.0 * _ellipse(x[:, cs], y[rs], gx, gy, 0.09, 0.045, 0.02)

    # Uneven exposure.
    A += _smooth_noise(np.random.default_rng(shot.seeds[0]), 3, (w, w)) * 6.0


# --- pathology signs -------------------------------------------------------------------------
# "Pre" signs change the anatomy before it is drawn; "post" signs add to the attenuation map.
# Each gets its own random stream, so an image with and without a label differs only by it.

def _pre_cardiomegaly(an: _Anatomy, rng: np.random.Generator) -> _Anatomy:
    return replace(an, ha=an.ha * _u(rng, 1.30, 1.50), hb=an.hb * _u(rng, 1.12, 1.25),
                   hcx=an.hcx + _u(rng, 0.02, 0.05))


def _pre_emphysema(an: _Anatomy, rng: np.random.Generator) -> _Anatomy:
    drop = _u(rng, 0.07, 0.11)
    return replace(an, dome_r=an.dome_r + drop, dome_l=an.dome_l + drop * 0.9,
                   dome_h=an.dome_h * _u(rng, 0.2, 0.4), apex=an.apex - _u(rng, 0.02, 0.05),
                   xlat=an.xlat + _u(rng, 0.02, 0.05), lung_dark=an.lung_dark * _u(rng, 1.22, 1.35),
                   mk_amp=an.mk_amp * 0.35, rib_k=an.rib_k * 0.5, rib_n=an.rib_n * 0.9,
                   ha=an.ha * 0.9, hb=an.hb * 0.95)


def _side(rng: np.random.Generator) -> int:
    return -1 if rng.random() < 0.5 else 1


def _lung_box(c: _Canvas, an: _Anatomy, side: int, y0: float | None = None,
              y1: float | None = None) -> tuple[slice, slice] | None:
    lo, hi = an.xmed - 0.02, an.xlat + 0.02
    x0, x1 = (-hi, -lo) if side < 0 else (lo, hi)
    return c.box(x0, x1, an.apex - 0.02 if y0 is None else y0,
                 an.ylat + 0.02 if y1 is None else y1)


def _sign_atelectasis(c: _Canvas, an: _Anatomy, rng: np.random.Generator) -> None:
    """A bright plate-like band or a wedge pointing at the hilum, in one lower lung."""
    side = _side(rng)
    amp = _u(rng, 0.75, 0.95)
    b = _lung_box(c, an, side)
    if not b:
        return
    rs, cs = b
    x, y = c.x[:, cs], c.y[rs]
    if rng.random() < 0.5:
        cx, cy = an.lung_point(side, _u(rng, 0.35, 0.65), _u(rng, 0.55, 0.8))
        ang = _u(rng, -0.3, 0.3)
        ht, hl = _u(rng, 0.03, 0.05), _u(rng, 0.16, 0.24)
        ca, sa = math.cos(ang), math.sin(ang)
        d = np.abs((y - cy) * ca - (x - cx) * sa)
        along = np.abs((x - cx) * ca + (y - cy) * sa)
        shape = np.clip((ht - d) * (1 / 0.015), 0, 1) * np.clip((hl - along) * 20.0, 0, 1)
    else:
        px, py = side * x - an.hx, y - an.hy
        phi = np.arctan2(py, px)
        th0, half = _u(rng, 0.5, 1.2), _u(rng, 0.22, 0.35)
        r = np.sqrt(px * px + py * py)
        reach = _u(rng, 0.4, 0.6)
        shape = (np.clip((half - np.abs(phi - th0)) * (1 / 0.08), 0, 1)
                 * np.clip((reach - r) * 20.0, 0, 1) * np.clip((r - 0.06) * 20.0, 0, 1))
    c.A[rs, cs] += shape * (amp * c.dark[rs, cs] + 8.0 * c.inside[rs, cs])


def _sign_effusion(c: _Canvas, an: _Anatomy, rng: np.random.Generator) -> None:
    """Fluid at the lung base with a meniscus rising laterally (blunted costophrenic angle)."""
    sides = [_side(rng)] if rng.random() < 0.65 else [-1, 1]
    for side in sides:
        hf = _u(rng, 0.14, 0.28)
        dens = _u(rng, 0.9, 1.0)
        top = an.dome_top(side)
        b = _lung_box(c, an, side, y0=top - 1.3 * hf - 0.05)
        if not b:
            continue
        rs, cs = b
        u = np.clip((c.ax[:, cs] - c.xm[rs]) / np.maximum(c.xl[rs] - c.xm[rs], 1e-3), 0, 1)
        ytop = top - hf * (0.3 + 1.0 * u * u)
        fluid = np.clip((c.y[rs] - ytop) * (1 / 0.03), 0, 1)
        c.A[rs, cs] += fluid * (dens * c.dark[rs, cs] + 12.0 * c.inside[rs, cs])


def _patchy(rng: np.random.Generator, rs: slice, cs: slice, grid: int, cut: float
            ) -> np.ndarray:
    n = _smooth_noise(rng, grid, (rs.stop - rs.start, cs.stop - cs.start))
    return np.clip((n - cut) * 1.5, 0.0, 1.0)


def _sign_infiltration(c: _Canvas, an: _Anatomy, rng: np.random.Generator) -> None:
    """Patchy, ill-defined brightness in one or two lung regions."""
    for _ in range(1 if rng.random() < 0.5 else 2):
        side = _side(rng)
        cx, cy = an.lung_point(side, _u(rng, 0.3, 0.7), _u(rng, 0.3, 0.75))
        rx, ry = _u(rng, 0.16, 0.24), _u(rng, 0.2, 0.3)
        b = c.box(cx - rx, cx + rx, cy - ry, cy + ry)
        if not b:
            continue
        rs, cs = b
        blob = _ellipse(c.x[:, cs], c.y[rs], cx, cy, rx, ry, min(rx, ry) * 0.5)
        patch = _patchy(rng, rs, cs, 9, -0.3)
        amp = _u(rng, 0.5, 0.7)
        c.A[rs, cs] += amp * blob * patch * c.dark[rs, cs]


def _sign_mass(c: _Canvas, an: _Anatomy, rng: np.random.Generator) -> None:
    """One large, bright, slightly lobulated round opacity."""
    side = _side(rng)
    cx, cy = an.lung_point(side, _u(rng, 0.3, 0.7), _u(rng, 0.25, 0.75))
    r = _u(rng, 0.075, 0.12)
    amp = _u(rng, 60, 85)
    b = c.box(cx - 1.6 * r, cx + 1.6 * r, cy - 1.6 * r, cy + 1.6 * r)
    if not b:
        return
    rs, cs = b
    x, y = c.x[:, cs], c.y[rs]
    m = _ellipse(x, y, cx, cy, r * _u(rng, 0.85, 1.15), r * _u(rng, 0.85, 1.15), r * 0.25,
                 _u(rng, 0, math.pi))
    for _ in range(2):
        a = _u(rng, 0, 2 * math.pi)
        rb = r * _u(rng, 0.4, 0.6)
        m = np.maximum(m, _ellipse(x, y, cx + 0.8 * r * math.cos(a), cy + 0.8 * r * math.sin(a),
                                   rb, rb, rb * 0.3))
    c.A[rs, cs] += amp * m * (0.4 + 0.6 * c.inside[rs, cs])


def _sign_nodule(c: _Canvas, an: _Anatomy, rng: np.random.Generator) -> None:
    """Several small, bright, round dots scattered in the lungs."""
    for _ in range(int(rng.integers(3, 8))):
        side = _side(rng)
        cx, cy = an.lung_point(side, _u(rng, 0.15, 0.85), _u(rng, 0.15, 0.85))
        r = _u(rng, 0.022, 0.036)
        amp = _u(rng, 55, 85)
        b = c.box(cx - r - 0.02, cx + r + 0.02, cy - r - 0.02, cy + r + 0.02)
        if not b:
            continue
        rs, cs = b
        c.A[rs, cs] += amp * _ellipse(c.x[:, cs], c.y[rs], cx, cy, r, r, 0.012)


def _sign_pneumonia(c: _Canvas, an: _Anatomy, rng: np.random.Generator) -> None:
    """Patchy consolidation in one lower zone."""
    side = _side(rng)
    cx, cy = an.lung_point(side, _u(rng, 0.45, 0.75), _u(rng, 0.6, 0.82))
    rx, ry = _u(rng, 0.14, 0.2), _u(rng, 0.12, 0.17)
    b = c.box(cx - rx, cx + rx, cy - ry, cy + ry)
    if not b:
        return
    rs, cs = b
    blob = _ellipse(c.x[:, cs], c.y[rs], cx, cy, rx, ry, min(rx, ry) * 0.4,
                    _u(rng, -0.5, 0.5))
    patch = 0.45 + 0.55 * _patchy(rng, rs, cs, 6, -0.6)
    amp = _u(rng, 0.8, 0.95)
    c.A[rs, cs] += blob * patch * (amp * c.dark[rs, cs] + 6.0 * c.inside[rs, cs])


def _sign_pneumothorax(c: _Canvas, an: _Anatomy, rng: np.random.Generator) -> None:
    """Apical/lateral rim without lung markings, darker, bounded by a thin pleural line."""
    side = _side(rng)
    w0 = _u(rng, 0.09, 0.16)       # rim width at the apex
    lim = _u(rng, 0.55, 0.9)       # how far down the lateral wall it reaches
    dark = _u(rng, 28, 42)
    b = _lung_box(c, an, side)
    if not b:
        return
    rs, cs = b
    d = c.edge_distance(rs, cs, an)
    wt = w0 * np.clip(1.0 - c.t[rs] * (1.0 / lim), 0.0, 1.0)
    inside = c.inside[rs, cs]
    zone = np.clip((wt - d) * (1 / 0.01), 0, 1) * inside
    line = np.clip(1.0 - np.abs(d - wt) * (1 / 0.012), 0, 1) * inside * (wt > 0.01)
    c.A[rs, cs] -= zone * (c.mark[rs, cs] + dark)
    c.A[rs, cs] += line * _u(rng, 30, 45)


def _sign_consolidation(c: _Canvas, an: _Anatomy, rng: np.random.Generator) -> None:
    """Dense, homogeneous opacity filling a lobe, sharply limited by a fissure."""
    side = _side(rng)
    upper = rng.random() < 0.45
    tf = _u(rng, 0.35, 0.5) if upper else _u(rng, 0.5, 0.65)
    yf = an.apex + tf * (an.ylat - an.apex)
    tilt = _u(rng, -0.15, 0.15)
    dens = _u(rng, 0.85, 0.97)
    b = _lung_box(c, an, side)
    if not b:
        return
    rs, cs = b
    dxf = c.x[:, cs] - side * 0.5 * (an.xmed + an.xlat)
    fis = yf + tilt * dxf + _u(rng, -0.6, 0.6) * dxf * dxf
    d = (fis - c.y[rs]) if upper else (c.y[rs] - fis)
    lobe = np.clip(d * (1 / 0.012), 0, 1)
    tex = 0.88 + 0.12 * np.clip(_smooth_noise(rng, 5, lobe.shape), -1, 1)
    c.A[rs, cs] += lobe * tex * (dens * c.dark[rs, cs] + 8.0 * c.inside[rs, cs])


def _sign_edema(c: _Canvas, an: _Anatomy, rng: np.random.Generator) -> None:
    """Bilateral hazy perihilar brightness (bat wings) and a diffuse haze."""
    sx, sy = _u(rng, 0.2, 0.28), _u(rng, 0.28, 0.38)
    amp, haze = _u(rng, 0.45, 0.65) * an.lung_dark, _u(rng, 6, 12)
    cxh, cyh = an.hx + _u(rng, 0.0, 0.05), an.hy + _u(rng, 0.0, 0.08)
    b = c.box(-1.0, 1.0, an.apex - 0.02, an.ylat + 0.02)
    if not b:
        return
    rs, cs = b
    g = np.exp(-(((c.ax[:, cs] - cxh) * (1.0 / sx)) ** 2 + ((c.y[rs] - cyh) * (1.0 / sy)) ** 2))
    c.A[rs, cs] += (amp * g + haze) * c.L[rs, cs]


def _sign_fibrosis(c: _Canvas, an: _Anatomy, rng: np.random.Generator) -> None:
    """Reticular (net-like) lines in the peripheral and lower lungs, both sides."""
    f = _u(rng, 11.0, 14.0)
    a1, a2 = _u(rng, 0.3, 0.8), _u(rng, -0.8, -0.3)
    amp = _u(rng, 0.6, 0.8)
    b = c.box(-1.0, 1.0, an.apex - 0.02, an.ylat + 0.02)
    if not b:
        return
    rs, cs = b
    x, y = c.x[:, cs], c.y[rs]
    shape = (rs.stop - rs.start, cs.stop - cs.start)
    w1 = _smooth_noise(rng, 12, shape) * 1.8
    w2 = _smooth_noise(rng, 12, shape) * 1.8
    tau = np.float32(2 * math.pi * f)
    s1 = np.cos((x * math.cos(a1) + y * math.sin(a1)) * tau + w1)
    s2 = np.cos((x * math.cos(a2) + y * math.sin(a2)) * tau + w2)
    net = np.clip((np.maximum(s1, s2) - 0.6) * 3.0, 0, 1)
    d = c.edge_distance(rs, cs, an)
    where = np.clip((0.28 - d) * 8.0, 0, 1) * np.clip((c.t[rs] - 0.35) * 4.0, 0, 1)
    c.A[rs, cs] += amp * net * where * (c.dark[rs, cs] + 10.0 * c.inside[rs, cs])


def _sign_pleural_thickening(c: _Canvas, an: _Anatomy, rng: np.random.Generator) -> None:
    """A bright band lining the lung edge (apical cap or lateral wall), one or both sides."""
    sides = [_side(rng)] if rng.random() < 0.7 else [-1, 1]
    for side in sides:
        thick = _u(rng, 0.045, 0.07)
        amp = _u(rng, 0.85, 1.0)
        apical = rng.random() < 0.5
        b = _lung_box(c, an, side)
        if not b:
            continue
        rs, cs = b
        t = c.t[rs]
        sector = np.clip((0.3 - t) * 10, 0, 1) if apical else (
            np.clip((t - 0.2) * 10, 0, 1) * np.clip((0.9 - t) * 10, 0, 1))
        d = c.edge_distance(rs, cs, an)
        rim = np.clip((thick - d) * (1 / 0.01), 0, 1)
        c.A[rs, cs] += rim * sector * (amp * c.dark[rs, cs] + 25.0 * c.inside[rs, cs])


def _sign_hernia(c: _Canvas, an: _Anatomy, rng: np.random.Generator) -> None:
    """Hiatal hernia: a round retrocardiac density above the diaphragm with an air-fluid level."""
    cx = _u(rng, -0.02, 0.12)
    cy = an.dome_r - _u(rng, 0.04, 0.1)
    rx = _u(rng, 0.1, 0.14)
    ry = rx * _u(rng, 0.75, 0.95)
    level = cy - ry * _u(rng, 0.0, 0.35)
    b = c.box(cx - rx - 0.03, cx + rx + 0.03, cy - ry - 0.03, cy + ry + 0.03)
    if not b:
        return
    rs, cs = b
    x, y = c.x[:, cs], c.y[rs]
    sac = _ellipse(x, y, cx, cy, rx, ry, 0.015)
    inner = _ellipse(x, y, cx, cy, rx - 0.02, ry - 0.02, 0.01)
    gas = inner * np.clip((level - y) * (1 / 0.006), 0, 1)
    c.A[rs, cs] += sac * _u(rng, 25, 40) - gas * _u(rng, 65, 90) + (sac - inner) * 15.0


_PRE = {"Cardiomegaly": _pre_cardiomegaly, "Emphysema": _pre_emphysema}
_POST = {
    "Atelectasis": _sign_atelectasis, "Effusion": _sign_effusion,
    "Infiltration": _sign_infiltration, "Mass": _sign_mass, "Nodule": _sign_nodule,
    "Pneumonia": _sign_pneumonia, "Pneumothorax": _sign_pneumothorax,
    "Consolidation": _sign_consolidation, "Edema": _sign_edema, "Fibrosis": _sign_fibrosis,
    "Pleural_Thickening": _sign_pleural_thickening, "Hernia": _sign_hernia,
}
# Order of drawing the post signs: diffuse ones first, sharp ones (lines, gas) last.
_POST_ORDER = ("Edema", "Infiltration", "Pneumonia", "Consolidation", "Atelectasis", "Effusion",
               "Fibrosis", "Pleural_Thickening", "Mass", "Nodule", "Pneumothorax", "Hernia")
if set(_PRE) | set(_POST) != set(PATHOLOGIES):  # pragma: no cover - guards future edits
    raise RuntimeError("every pathology needs exactly one sign")


def _tone_lut(shot: _Shot) -> np.ndarray:
    """Attenuation (quantised to 1/_LUT_STEPS) -> 8-bit grey: exposure, knee, gamma."""
    a = np.arange(int(_LUT_MAX * _LUT_STEPS), dtype=np.float64) / _LUT_STEPS
    z = np.maximum(a * shot.gain + shot.offset, 0.0)
    knee = 205.0
    z = np.where(z < knee, z, knee + 48.0 * (1.0 - np.exp(-(z - knee) / 48.0)))
    z = 255.0 * (z / 255.0) ** shot.gamma
    return np.clip(np.rint(z), 0, 255).astype(np.uint8)


def _as_present(labels: Sequence[str] | np.ndarray | str) -> np.ndarray:
    if isinstance(labels, str):
        names = parse_finding_labels(labels)
    elif isinstance(labels, np.ndarray) and labels.dtype.kind in "biuf":
        vec = labels.reshape(-1)
        if vec.shape[0] != NUM_CLASSES:
            raise ValueError(f"expected a multi-hot vector of {NUM_CLASSES}, got {labels.shape}")
        return vec >= 0.5
    else:
        names = list(labels)
        unknown = [s for s in names if s not in PATHOLOGIES and s != NO_FINDING]
        if unknown:
            raise ValueError(f"unknown label(s) {unknown}; expected names from {PATHOLOGIES}")
    return np.array([p in names for p in PATHOLOGIES])


def render_image(
    labels: Sequence[str] | np.ndarray | str,
    size: int = 1024,
    rng: np.random.Generator | int | None = None,
    *,
    patient_rng: np.random.Generator | int | None = None,
    view: str = "PA",
) -> np.ndarray:
    """Render one synthetic frontal chest film as a ``(size, size)`` uint8 array.

    ``labels``: pathology names (``[]`` or ``["No Finding"]`` for none), a ``Finding Labels``
    string like ``"Effusion|Mass"``, or a 14-long multi-hot vector in :data:`PATHOLOGIES`
    order. ``rng`` drives the acquisition (position, exposure, noise) and each sign's jitter;
    ``patient_rng`` (default: ``rng``) drives the anatomy, so two images with the same
    ``patient_rng`` seed look like the same patient. ``view="AP"`` magnifies the heart a little
    and lowers contrast, as bedside AP films do.

    The random streams are consumed identically whatever the labels, so rendering the same
    seeds with and without a label changes only that label's sign. Sides above 512 px are
    rendered at 512 and upscaled (bilinear) before the fine noise is added.
    """
    if size < 16:
        raise ValueError(f"size must be >= 16, got {size}")
    present = _as_present(labels)
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    if patient_rng is None:
        an = _draw_anatomy(rng)
    else:
        prng = (patient_rng if isinstance(patient_rng, np.random.Generator)
                else np.random.default_rng(patient_rng))
        an = _draw_anatomy(prng)
    shot = _draw_shot(rng)
    sign_seeds = [int(s) for s in rng.integers(0, 2**63, size=NUM_CLASSES)]
    if view.upper() == "AP":
        an = replace(an, ha=an.ha * 1.07, hb=an.hb * 1.05, dome_r=an.dome_r - 0.03,
                     dome_l=an.dome_l - 0.03, lung_dark=an.lung_dark * 0.95)
    shift = shot.breath
    an = replace(an, dome_r=an.dome_r + shift, dome_l=an.dome_l + shift)
    for k, name in enumerate(PATHOLOGIES):
        if present[k] and name in _PRE:
            an = _PRE[name](an, np.random.default_rng(sign_seeds[k]))

    w = min(size, _RENDER_MAX)
    c = _Canvas(w, shot.dx, shot.dy)
    _render_base(c, an, shot)
    index = {p: i for i, p in enumerate(PATHOLOGIES)}
    for name in _POST_ORDER:
        k = index[name]
        if present[k]:
            _POST[name](c, an, np.random.default_rng(sign_seeds[k]))

    noise_rng = np.random.default_rng(shot.seeds[2])
    A = c.A
    A += (noise_rng.random((w, w), dtype=np.float32) - np.float32(0.5)) * np.float32(
        shot.noise_amp)
    np.clip(A * np.float32(_LUT_STEPS), 0, _LUT_MAX * _LUT_STEPS - 1, out=A)
    img = _tone_lut(shot)[A.astype(np.uint16)]
    if w != size:
        img = np.asarray(Image.fromarray(img).resize((size, size), Image.Resampling.BILINEAR))
        # Fine grain at full resolution: -1, 0, +1 grey level.
        grain = noise_rng.integers(0, 3, size=(size, size), dtype=np.uint8)
        img = np.clip(img, 1, 254)
        img -= np.uint8(1)
        img += grain
    return np.ascontiguousarray(img)


def encode_png(img: np.ndarray, path: Path | str, compress_level: int = 3) -> int:
    """Write ``img`` (uint8 HxW) as an 8-bit greyscale PNG atomically; return its size in bytes.

    The data go to a temporary name next to ``path`` (which the ``*.png`` globs of
    :func:`nih.find_images` do not match) and are moved into place with ``os.replace``, so an
    interrupted run never leaves a truncated PNG behind.
    """
    img = np.asarray(img)
    if img.dtype != np.uint8 or img.ndim != 2:
        raise ValueError(f"expected a 2-D uint8 image, got {img.dtype} {img.shape}")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            Image.fromarray(img).save(f, format="PNG", compress_level=compress_level)
            nbytes = f.tell()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return nbytes


# --------------------------------------------------------------------------------------------
# Writing a data set
# --------------------------------------------------------------------------------------------

def _image_rng(seed: int, index: int) -> np.random.Generator:
    return _stream(seed, 0, index)


def _patient_rng(seed: int, patient_id: int) -> np.random.Generator:
    return _stream(seed, 1, patient_id)


def _folder(index: int, per_folder: int) -> str:
    return f"images_{index // per_folder + 1:03d}"


def _render_task(task: tuple[int, int, int, str, str, int, str, int]) -> tuple[int, int]:
    """Worker (module level, so it pickles under 'spawn'): render and write one image."""
    seed, index, patient_id, finding_labels, view, size, path, level = task
    img = render_image(finding_labels, size, _image_rng(seed, index),
                       patient_rng=_patient_rng(seed, patient_id), view=view)
    return index, encode_png(img, path, compress_level=level)


def read_marker(out_dir: Path | str) -> dict[str, Any] | None:
    """The parsed ``SYNTHETIC.json`` of a synthetic data set, or None if absent or unreadable."""
    path = Path(out_dir) / MARKER_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("generator") != _GENERATOR_ID:
        return None
    return data


def _marker(n: int, size: int, seed: int, per_folder: int, complete: bool,
            extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "generator": _GENERATOR_ID,
        "version": GENERATOR_VERSION,
        "n": n,
        "size": size,
        "seed": seed,
        "per_folder": per_folder,
        "complete": complete,
        "note": "Synthetic stand-in for NIH ChestX-ray14 written by chexnet_utils.synthetic; "
                "not real patient data.",
        **(extra or {}),
    }


def _same_params(marker: dict[str, Any] | None, n: int, size: int, seed: int,
                 per_folder: int) -> bool:
    return bool(marker) and all(marker.get(k) == v for k, v in (  # type: ignore[union-attr]
        ("version", GENERATOR_VERSION), ("n", n), ("size", size), ("seed", seed),
        ("per_folder", per_folder)))


def _layout_files(root: Path) -> list[Path]:
    """Files of the NIH layout this module writes (and may replace) under ``root``."""
    files: list[Path] = []
    for name in (nih.CSV_NAME, nih.TRAIN_VAL_LIST, nih.TEST_LIST):
        if (root / name).is_file():
            files.append(root / name)
    for d in [root / "images", *(p / "images" for p in root.glob("images_[0-9][0-9][0-9]")),
              *root.glob("images_[0-9][0-9][0-9]")]:
        if d.is_dir():
            files.extend(p for p in d.iterdir() if p.is_file() and (
                _NAME_RE.fullmatch(p.name) or (p.name.startswith(".") and
                                               p.name.endswith(".tmp"))))
    return files


def generate_dataset(
    out_dir: Path | str,
    n: int = 600,
    size: int = 1024,
    seed: int = 0,
    workers: int | None = None,
    per_folder: int = 10_000,
    progress: bool = True,
    overwrite: bool = False,
    *,
    resume: bool = False,
    compress_level: int = 3,
    mp_context: str | None = None,
) -> Path:
    """Write a synthetic ChestX-ray14 of ``n`` images of ``size`` px into ``out_dir``.

    The layout is NIH's (see the module docstring); :meth:`nih.NIHDataset.load` reads it.
    Images are rendered by ``workers`` processes (default ``os.cpu_count()``; 1 renders in
    this process) with a tqdm progress bar; the output is byte-identical whatever ``workers``.

    ``out_dir`` may be missing, empty (hidden files such as ``.gitkeep`` do not count), or a
    previous output of this function (it has a ``SYNTHETIC.json``): then its images, CSV and
    lists are replaced. Any other non-empty
    directory raises :class:`FileExistsError` unless ``overwrite=True``, which deletes the
    NIH-layout files there (``Data_Entry_2017.csv``, the two lists and ``NNNNNNNN_NNN.png``
    under ``images/`` and ``images_NNN/images/``) and leaves other files alone.

    ``resume=True`` keeps the PNGs of an interrupted run with the same parameters (they are
    written atomically, so every PNG present is complete). The CSV, the split lists and the
    final ``SYNTHETIC.json`` (``"complete": true``) are written after all images.
    ``compress_level`` is zlib's (3: ~40 ms and ~400 KB per 1024 px image).
    ``mp_context`` picks the multiprocessing start method ("spawn", "fork", "forkserver";
    default: the platform's); the worker is a module-level function, so all of them work.
    Returns ``out_dir`` as a :class:`~pathlib.Path`.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if size < 16:
        raise ValueError(f"size must be >= 16, got {size}")
    if per_folder < 1:
        raise ValueError(f"per_folder must be >= 1, got {per_folder}")
    if (n - 1) // per_folder + 1 > 999:
        raise ValueError(f"{n} images at {per_folder} per folder need more than 999 "
                         "images_NNN folders; raise per_folder")
    root = Path(out_dir)
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"{root} exists and is not a directory")
    marker = read_marker(root) if root.is_dir() else None
    visible = root.is_dir() and any(not p.name.startswith(".") for p in root.iterdir())
    if visible and marker is None and not overwrite:
        raise FileExistsError(
            f"{root} is not empty and has no {MARKER_NAME}, so it is not a previous synthetic "
            "data set (it may be the real NIH download). Choose an empty or new directory, or "
            "pass overwrite=True to replace its NIH-layout files.")
    root.mkdir(parents=True, exist_ok=True)

    records = sample_records(n, seed, size)
    train_val, test = split_by_patient(records, seed)
    keep_existing = resume and _same_params(marker, n, size, seed, per_folder)
    targets = {r.image_index: root / _folder(i, per_folder) / "images" / r.image_index
               for i, r in enumerate(records)}

    # Mark the directory as ours before touching anything else, then clear stale files.
    write_text_atomic(root / MARKER_NAME,
                       json.dumps(_marker(n, size, seed, per_folder, False), indent=2) + "\n")
    for f in _layout_files(root):
        if keep_existing and targets.get(f.name) == f:
            continue
        f.unlink(missing_ok=True)
    for d in sorted(root.glob("images_[0-9][0-9][0-9]/images")) + sorted(
            root.glob("images_[0-9][0-9][0-9]")) + [root / "images"]:
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
    for folder in {p.parent for p in targets.values()}:
        folder.mkdir(parents=True, exist_ok=True)

    tasks = [(seed, i, r.patient_id, r.finding_labels, r.view_position, size,
              str(targets[r.image_index]), compress_level)
             for i, r in enumerate(records)
             if not (keep_existing and targets[r.image_index].is_file())]
    workers = (os.cpu_count() or 1) if workers is None else max(1, int(workers))
    workers = min(workers, max(1, len(tasks)))

    bar = tqdm(total=len(tasks), desc=f"synthetic {size}px", unit="img", disable=not progress)
    try:
        if workers == 1:
            for t in tasks:
                _render_task(t)
                bar.update(1)
        else:
            chunk = max(1, min(32, len(tasks) // (workers * 8)))
            with multiprocessing.get_context(mp_context).Pool(
                    workers, initializer=worker_init, initargs=(os.getpid(),)) as pool:
                for _ in pool.imap_unordered(_render_task, tasks, chunksize=chunk):
                    bar.update(1)
    finally:
        bar.close()

    png_bytes = sum(p.stat().st_size for p in targets.values())
    nih.write_data_entry(root / f".{nih.CSV_NAME}.tmp", records)
    os.replace(root / f".{nih.CSV_NAME}.tmp", root / nih.CSV_NAME)
    write_text_atomic(root / nih.TRAIN_VAL_LIST, "".join(f"{x}\n" for x in train_val))
    write_text_atomic(root / nih.TEST_LIST, "".join(f"{x}\n" for x in test))
    extra = {"images": n, "patients": len({r.patient_id for r in records}),
             "train_val": len(train_val), "test": len(test), "png_bytes": png_bytes}
    write_text_atomic(root / MARKER_NAME,
                       json.dumps(_marker(n, size, seed, per_folder, True, extra), indent=2)
                       + "\n")
    return root


def ensure_dataset(
    out_dir: Path | str,
    n: int = 600,
    size: int = 1024,
    seed: int = 0,
    workers: int | None = None,
    per_folder: int = 10_000,
    progress: bool = True,
) -> Path:
    """Return ``out_dir``, generating it first unless it already holds this exact data set.

    "This exact data set" means a complete ``SYNTHETIC.json`` with the same ``n``, ``size``,
    ``seed``, ``per_folder`` and generator version, and the CSV and lists present. An
    interrupted run with the same parameters is resumed; a different synthetic data set is
    replaced; a non-synthetic, non-empty directory raises :class:`FileExistsError`.
    """
    root = Path(out_dir)
    marker = read_marker(root)
    if (_same_params(marker, n, size, seed, per_folder) and marker is not None
            and marker.get("complete") is True
            and all((root / f).is_file() for f in (nih.CSV_NAME, nih.TRAIN_VAL_LIST,
                                                     nih.TEST_LIST))):
        return root
    return generate_dataset(root, n=n, size=size, seed=seed, workers=workers,
                            per_folder=per_folder, progress=progress, resume=True)
