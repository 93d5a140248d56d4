"""One synthetic chest film: :func:`render_image` (labels -> uint8 array) and :func:`encode_png`.

:func:`render_image` draws a patient's anatomy and one shot (:mod:`.anatomy`), applies the
pathology signs of the labels present (:mod:`.findings`), adds noise and maps attenuation to
8-bit grey through a tone curve; sides above :data:`_RENDER_MAX` are rendered smaller and
upscaled. :func:`encode_png` writes the result as a greyscale PNG atomically.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from PIL import Image

from chexnet_utils.data.labels import NO_FINDING, NUM_CLASSES, PATHOLOGIES, parse_finding_labels
from chexnet_utils.data.synthetic.anatomy import Canvas, Shot, draw_anatomy, draw_shot, render_base
from chexnet_utils.data.synthetic.findings import POST_ORDER, POST_SIGNS, PRE_SIGNS
from chexnet_utils.platform.atomic import atomic_path
from chexnet_utils.platform.checks import require_at_least

_RENDER_MAX = 512
"""Images larger than this are rendered at this side and upscaled (X-rays are smooth)."""

_LUT_STEPS = 4  # attenuation units are quantised to 1/4 for the tone-curve lookup
_LUT_MAX = 400.0


def _tone_lut(shot: Shot) -> np.ndarray:
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
    require_at_least(16, size=size)
    present = _as_present(labels)
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    if patient_rng is None:
        an = draw_anatomy(rng)
    else:
        prng = (patient_rng if isinstance(patient_rng, np.random.Generator)
                else np.random.default_rng(patient_rng))
        an = draw_anatomy(prng)
    shot = draw_shot(rng)
    sign_seeds = [int(s) for s in rng.integers(0, 2**63, size=NUM_CLASSES)]
    if view.upper() == "AP":
        an = replace(an, ha=an.ha * 1.07, hb=an.hb * 1.05, dome_r=an.dome_r - 0.03,
                     dome_l=an.dome_l - 0.03, lung_dark=an.lung_dark * 0.95)
    shift = shot.breath
    an = replace(an, dome_r=an.dome_r + shift, dome_l=an.dome_l + shift)
    for k, name in enumerate(PATHOLOGIES):
        if present[k] and name in PRE_SIGNS:
            an = PRE_SIGNS[name](an, np.random.default_rng(sign_seeds[k]))

    w = min(size, _RENDER_MAX)
    c = Canvas(w, shot.dx, shot.dy)
    render_base(c, an, shot)
    index = {p: i for i, p in enumerate(PATHOLOGIES)}
    for name in POST_ORDER:
        k = index[name]
        if present[k]:
            POST_SIGNS[name](c, an, np.random.default_rng(sign_seeds[k]))

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
    :func:`nih.find_images` do not match) and are moved into place with ``os.replace``
    (:func:`~chexnet_utils.platform.atomic.atomic_path`), so an interrupted run never leaves a
    truncated PNG behind.
    """
    img = np.asarray(img)
    if img.dtype != np.uint8 or img.ndim != 2:
        raise ValueError(f"expected a 2-D uint8 image, got {img.dtype} {img.shape}")
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        Image.fromarray(img).save(f, format="PNG", compress_level=compress_level)
        nbytes = f.tell()
    return nbytes
