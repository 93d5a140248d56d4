"""The healthy chest of a synthetic film: one patient's anatomy, one shot, the base image.

:class:`Anatomy` holds a patient's chest geometry and densities (drawn once per patient by
:func:`draw_anatomy`, so follow-ups look alike), :class:`Shot` one acquisition (position,
breath, exposure, texture seeds), :class:`Canvas` the attenuation map being built with its
lung masks, and :func:`render_base` draws body, lungs with vessel markings, trachea, heart,
hila, spine, ribs, clavicles and the gastric bubble onto it. The pathology signs of
:mod:`chexnet_utils.data.synthetic.findings` are drawn on top; :mod:`.render` turns the map into
grey levels.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image


@dataclass(frozen=True)
class Anatomy:
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
        sq: Callable[[Any], Any]  # np.sqrt or math.sqrt, with tl and tm arrays or floats
        tl: Any
        tm: Any
        if isinstance(t, np.ndarray):
            sq = np.sqrt
            tl, tm = np.clip(t * (1 / 0.45), 0, 1), np.clip(t * (1 / 0.2), 0, 1)
        else:
            sq = math.sqrt
            tl, tm = min(max(t / 0.45, 0.0), 1.0), min(max(t / 0.2, 0.0), 1.0)
        return xa - (xa - self.xmed) * sq(tm), xa + (self.xlat - xa) * sq(tl)

    def lung_point(self, side: int, u: float, t: float) -> tuple[float, float]:
        """(x, y) at fraction ``u`` from the mediastinal to the lateral edge, height ``t``."""
        m, lat = self.lung_edges(t)
        return side * (m + u * (lat - m)), self.apex + t * (self.ylat - self.apex)


def uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    """One draw of ``rng`` uniform in ``[lo, hi)``, as a Python float."""
    return float(rng.uniform(lo, hi))


def draw_anatomy(rng: np.random.Generator) -> Anatomy:
    """A random patient's chest (the draws are made in the order of the fields below)."""
    u = uniform
    dome_r = u(rng, 0.40, 0.50)
    return Anatomy(
        bw=u(rng, 0.78, 0.88), nw=u(rng, 0.15, 0.20), sy=u(rng, -0.80, -0.70),
        xmed=u(rng, 0.08, 0.12), xlat=u(rng, 0.60, 0.68), apex=u(rng, -0.72, -0.62),
        dome_r=dome_r, dome_l=dome_r + u(rng, 0.02, 0.06), dome_h=u(rng, 0.09, 0.14),
        hcx=u(rng, 0.10, 0.14), ha=u(rng, 0.27, 0.30), hb=u(rng, 0.19, 0.22),
        hang=u(rng, 0.30, 0.50), hx=u(rng, 0.15, 0.19), hy=u(rng, -0.12, -0.02),
        tissue=u(rng, 140, 158), lung_dark=u(rng, 78, 92), mk_amp=u(rng, 12, 18),
        mk_n=u(rng, 14, 20), rib_n=u(rng, 8.5, 10.0), rib_k=u(rng, 0.8, 1.2),
        rib_x0=u(rng, 0.32, 0.40), rib_phase=u(rng, 0.0, 1.0), spine_w=u(rng, 0.05, 0.065),
    )


@dataclass(frozen=True)
class Shot:
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


def draw_shot(rng: np.random.Generator) -> Shot:
    """A random acquisition of one image (positioning, exposure, texture seeds)."""
    u = uniform
    return Shot(dx=u(rng, -0.03, 0.03), dy=u(rng, -0.03, 0.03), breath=u(rng, -0.03, 0.03),
                gain=u(rng, 0.92, 1.08), offset=u(rng, -6, 6), gamma=u(rng, 0.9, 1.1),
                bg=u(rng, 8, 20), noise_amp=u(rng, 3.0, 4.5),
                seeds=tuple(int(s) for s in rng.integers(0, 2**63, size=4)))


class Canvas:
    """Attenuation image being built (float32, bigger = brighter) plus the lung maps."""

    def __init__(self, w: int, dx: float, dy: float) -> None:
        self.w = w
        self.dx, self.dy = dx, dy
        coords = (np.arange(w, dtype=np.float32) + 0.5) * np.float32(2.0 / w) - np.float32(1.0)
        self.x = (coords - np.float32(dx))[None, :]  # image left (x < 0) = patient's right
        self.y = (coords - np.float32(dy))[:, None]  # y grows downwards
        self.ax = np.abs(self.x)
        self.A = np.zeros((w, w), np.float32)
        # Filled by render_base (full-size maps, or (w, 1) columns for per-row values):
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

    def edge_distance(self, rs: slice, cs: slice, an: Anatomy) -> np.ndarray:
        """Distance (normalised units) to the lateral or apical lung outline."""
        dlat = self.xl[rs] - self.ax[:, cs]
        dtop = self.y[rs] - an.apex
        return np.minimum(dlat, dtop)


def ellipse(x: np.ndarray, y: np.ndarray, cx: float, cy: float, rx: float, ry: float,
             edge: float, angle: float = 0.0) -> np.ndarray:
    """Soft ellipse: 1 inside, 0 outside, ramp of about ``edge`` (normalised units) wide."""
    dx, dy = x - cx, y - cy
    if angle:
        c, s = math.cos(angle), math.sin(angle)
        dx, dy = dx * c + dy * s, dy * c - dx * s
    q = (dx * (1.0 / rx)) ** 2 + (dy * (1.0 / ry)) ** 2
    k = min(rx, ry) / (2.0 * max(edge, 1e-4))
    return np.clip((1.0 - q) * k, 0.0, 1.0)


def smooth_noise(rng: np.random.Generator, grid: int, shape: tuple[int, ...]) -> np.ndarray:
    """Low-frequency noise (~N(0,1) at ``grid`` x ``grid`` knots, bicubic in between) of
    ``shape`` ``(height, width)``."""
    g = rng.standard_normal((grid, grid)).astype(np.float32)
    h, w = shape
    return np.asarray(Image.fromarray(g).resize((w, h), Image.Resampling.BICUBIC))


def render_base(c: Canvas, an: Anatomy, shot: Shot) -> None:
    """Draw the healthy chest of ``an`` as taken by ``shot`` into ``c`` (before the signs):
    body, lungs (kept on ``c`` for the signs), mediastinum, bones, gastric bubble, exposure."""
    _draw_body(c, an, shot)
    _draw_lungs(c, an, shot)
    _draw_mediastinum(c, an)
    _draw_bones(c, an)
    _draw_gastric_bubble(c, an)
    # Uneven exposure.
    c.A += smooth_noise(np.random.default_rng(shot.seeds[0]), 3, (c.w, c.w)) * 6.0


def _draw_body(c: Canvas, an: Anatomy, shot: Shot) -> None:
    """Neck, shoulders and torso: soft tissue over the background."""
    y, ax, A = c.y, c.ax, c.A
    # Body: neck, rounded shoulders, torso.
    t = np.clip((y - (an.sy - 0.02)) * (1 / 0.4), 0.0, 1.0)
    half = an.nw + (an.bw - an.nw) * np.sqrt(1.0 - (1.0 - t) ** 2)
    A[:] = np.clip((half - ax) * (1 / 0.05), 0.0, 1.0)
    # Soft tissue is thicker towards the middle and the abdomen.
    prof = an.tissue * (0.9 + 0.1 * np.clip(y + 0.4, 0.0, 1.0))
    A *= prof.astype(np.float32)
    A += shot.bg


def _draw_lungs(c: Canvas, an: Anatomy, shot: Shot) -> None:
    """The lung fields with their vessel markings; their geometry goes onto ``c``."""
    x, y, ax, A = c.x, c.y, c.ax, c.A
    w = c.w
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
    warp = smooth_noise(rng_mk, 14, (w, w))
    gate = smooth_noise(rng_mk, 20, (w, w))
    px = ax - an.hx
    py = y - an.hy
    rr = np.sqrt(px * px + py * py)
    theta = np.arctan2(py, px)
    streak = np.clip(np.cos(theta * an.mk_n + warp * 1.2) - 0.55, 0.0, 1.0)
    streak *= np.clip(gate + 0.9, 0.0, 1.0)
    fall = np.clip(1.0 - rr * (1 / 0.9), 0.0, 1.0) * np.clip(rr * (1 / 0.1), 0.0, 1.0)
    mark = streak * fall * (an.mk_amp * 2.2) * L
    paren = smooth_noise(np.random.default_rng(shot.seeds[3]), 28, (w, w))
    lungsig = L * (an.lung_dark + 4.0 * paren) - mark
    A -= lungsig
    c.t, c.xm, c.xl, c.inside, c.below, c.L, c.mark = tl, xm, xl, inside, below, L, mark
    c.dark = lungsig


def _draw_mediastinum(c: Canvas, an: Anatomy) -> None:
    """Trachea, heart, aortic knob and hila (the heart and knob cover lung)."""
    x, y, ax, A = c.x, c.y, c.ax, c.A
    L, lungsig = c.L, c.dark
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
        heart = ellipse(x[:, cs], y[rs], an.hcx, hcy, an.ha, an.hb, 0.015, an.hang)
        A[rs, cs] += heart * (lungsig[rs, cs] * 0.95 + 3.0)
        L[rs, cs] *= 1.0 - heart
        lungsig[rs, cs] *= 1.0 - heart
    kx, ky = an.xmed + 0.02, an.hy - 0.24
    b = c.box(kx - 0.08, kx + 0.08, ky - 0.08, ky + 0.08)
    if b:
        rs, cs = b
        knob = ellipse(x[:, cs], y[rs], kx, ky, 0.06, 0.055, 0.015)
        A[rs, cs] += knob * (lungsig[rs, cs] * 0.9 + 3.0)
        L[rs, cs] *= 1.0 - knob
        lungsig[rs, cs] *= 1.0 - knob
    # Hila.
    b = c.box(-0.4, 0.4, an.hy - 0.2, an.hy + 0.2)
    if b:
        rs, cs = b
        hd = ((ax[:, cs] - an.hx) * (1 / 0.05)) ** 2 + ((y[rs] - an.hy) * (1 / 0.09)) ** 2
        A[rs, cs] += 16.0 * np.exp(-hd)


def _draw_bones(c: Canvas, an: Anatomy) -> None:
    """Spine, posterior ribs and clavicles."""
    y, ax, A = c.y, c.ax, c.A
    L, below = c.L, c.below
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


def _draw_gastric_bubble(c: Canvas, an: Anatomy) -> None:
    """The gas bubble under the left hemidiaphragm."""
    x, y, A = c.x, c.y, c.A
    # Gastric bubble under the left hemidiaphragm.
    gx, gy = 0.5 * (an.xmed + an.xlat) + 0.05, an.dome_l + 0.12
    b = c.box(gx - 0.12, gx + 0.12, gy - 0.07, gy + 0.07)
    if b:
        rs, cs = b
        A[rs, cs] -= 35.0 * ellipse(x[:, cs], y[rs], gx, gy, 0.09, 0.045, 0.02)
