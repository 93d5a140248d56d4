"""The 14 pathology signs a synthetic film can carry, one function per ChestX-ray14 label.

"Pre" signs (:data:`PRE_SIGNS`: Cardiomegaly, Emphysema) change a patient's
:class:`~chexnet_utils.data.synthetic.anatomy.Anatomy` before it is drawn; "post" signs
(:data:`POST_SIGNS`, drawn in :data:`POST_ORDER`) add to the attenuation map of a
:class:`~chexnet_utils.data.synthetic.anatomy.Canvas`. Each sign gets its own random stream, so an
image with and without a label differs only by that label's sign. The signs are meant to be
learnable by a small CNN at 128x128, not to be radiologically faithful.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from chexnet_utils.data.labels import PATHOLOGIES
from chexnet_utils.data.synthetic.anatomy import Anatomy, Canvas, ellipse, smooth_noise, uniform

# --- pathology signs -------------------------------------------------------------------------
# "Pre" signs change the anatomy before it is drawn; "post" signs add to the attenuation map.
# Each gets its own random stream, so an image with and without a label differs only by it.

def _pre_cardiomegaly(an: Anatomy, rng: np.random.Generator) -> Anatomy:
    return replace(an, ha=an.ha * uniform(rng, 1.30, 1.50), hb=an.hb * uniform(rng, 1.12, 1.25),
                   hcx=an.hcx + uniform(rng, 0.02, 0.05))


def _pre_emphysema(an: Anatomy, rng: np.random.Generator) -> Anatomy:
    u = uniform
    drop = u(rng, 0.07, 0.11)
    return replace(an, dome_r=an.dome_r + drop, dome_l=an.dome_l + drop * 0.9,
                   dome_h=an.dome_h * u(rng, 0.2, 0.4), apex=an.apex - u(rng, 0.02, 0.05),
                   xlat=an.xlat + u(rng, 0.02, 0.05), lung_dark=an.lung_dark * u(rng, 1.22, 1.35),
                   mk_amp=an.mk_amp * 0.35, rib_k=an.rib_k * 0.5, rib_n=an.rib_n * 0.9,
                   ha=an.ha * 0.9, hb=an.hb * 0.95)


def _side(rng: np.random.Generator) -> int:
    return -1 if rng.random() < 0.5 else 1


def _lung_box(c: Canvas, an: Anatomy, side: int, y0: float | None = None,
              y1: float | None = None) -> tuple[slice, slice] | None:
    lo, hi = an.xmed - 0.02, an.xlat + 0.02
    x0, x1 = (-hi, -lo) if side < 0 else (lo, hi)
    return c.box(x0, x1, an.apex - 0.02 if y0 is None else y0,
                 an.ylat + 0.02 if y1 is None else y1)


def _sign_atelectasis(c: Canvas, an: Anatomy, rng: np.random.Generator) -> None:
    """A bright plate-like band or a wedge pointing at the hilum, in one lower lung."""
    side = _side(rng)
    amp = uniform(rng, 0.75, 0.95)
    b = _lung_box(c, an, side)
    if not b:
        return
    rs, cs = b
    x, y = c.x[:, cs], c.y[rs]
    if rng.random() < 0.5:
        cx, cy = an.lung_point(side, uniform(rng, 0.35, 0.65), uniform(rng, 0.55, 0.8))
        ang = uniform(rng, -0.3, 0.3)
        ht, hl = uniform(rng, 0.03, 0.05), uniform(rng, 0.16, 0.24)
        ca, sa = math.cos(ang), math.sin(ang)
        d = np.abs((y - cy) * ca - (x - cx) * sa)
        along = np.abs((x - cx) * ca + (y - cy) * sa)
        shape = np.clip((ht - d) * (1 / 0.015), 0, 1) * np.clip((hl - along) * 20.0, 0, 1)
    else:
        px, py = side * x - an.hx, y - an.hy
        phi = np.arctan2(py, px)
        th0, half = uniform(rng, 0.5, 1.2), uniform(rng, 0.22, 0.35)
        r = np.sqrt(px * px + py * py)
        reach = uniform(rng, 0.4, 0.6)
        shape = (np.clip((half - np.abs(phi - th0)) * (1 / 0.08), 0, 1)
                 * np.clip((reach - r) * 20.0, 0, 1) * np.clip((r - 0.06) * 20.0, 0, 1))
    c.A[rs, cs] += shape * (amp * c.dark[rs, cs] + 8.0 * c.inside[rs, cs])


def _sign_effusion(c: Canvas, an: Anatomy, rng: np.random.Generator) -> None:
    """Fluid at the lung base with a meniscus rising laterally (blunted costophrenic angle)."""
    sides = [_side(rng)] if rng.random() < 0.65 else [-1, 1]
    for side in sides:
        hf = uniform(rng, 0.14, 0.28)
        dens = uniform(rng, 0.9, 1.0)
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
    n = smooth_noise(rng, grid, (rs.stop - rs.start, cs.stop - cs.start))
    return np.clip((n - cut) * 1.5, 0.0, 1.0)


_Range = tuple[float, float]


def _lung_region(c: Canvas, an: Anatomy, rng: np.random.Generator, u: _Range, t: _Range,
                 rx: _Range, ry: _Range) -> tuple[slice, slice, float, float, float, float] | None:
    """A random region in one lung: its pixel box and centre/half-axes (None if off the image).

    The centre is at a uniform fraction in ``u`` across the lung and ``t`` down it, the
    half-axes are uniform in ``rx`` and ``ry``; the random draws are made in that order.
    """
    side = _side(rng)
    cx, cy = an.lung_point(side, uniform(rng, *u), uniform(rng, *t))
    hx, hy = uniform(rng, *rx), uniform(rng, *ry)
    b = c.box(cx - hx, cx + hx, cy - hy, cy + hy)
    if not b:
        return None
    return b[0], b[1], cx, cy, hx, hy


def _sign_infiltration(c: Canvas, an: Anatomy, rng: np.random.Generator) -> None:
    """Patchy, ill-defined brightness in one or two lung regions."""
    for _ in range(1 if rng.random() < 0.5 else 2):
        region = _lung_region(c, an, rng, (0.3, 0.7), (0.3, 0.75), (0.16, 0.24), (0.2, 0.3))
        if region is None:
            continue
        rs, cs, cx, cy, rx, ry = region
        blob = ellipse(c.x[:, cs], c.y[rs], cx, cy, rx, ry, min(rx, ry) * 0.5)
        patch = _patchy(rng, rs, cs, 9, -0.3)
        amp = uniform(rng, 0.5, 0.7)
        c.A[rs, cs] += amp * blob * patch * c.dark[rs, cs]


def _sign_mass(c: Canvas, an: Anatomy, rng: np.random.Generator) -> None:
    """One large, bright, slightly lobulated round opacity."""
    side = _side(rng)
    cx, cy = an.lung_point(side, uniform(rng, 0.3, 0.7), uniform(rng, 0.25, 0.75))
    r = uniform(rng, 0.075, 0.12)
    amp = uniform(rng, 60, 85)
    b = c.box(cx - 1.6 * r, cx + 1.6 * r, cy - 1.6 * r, cy + 1.6 * r)
    if not b:
        return
    rs, cs = b
    x, y = c.x[:, cs], c.y[rs]
    m = ellipse(x, y, cx, cy, r * uniform(rng, 0.85, 1.15), r * uniform(rng, 0.85, 1.15), r * 0.25,
                 uniform(rng, 0, math.pi))
    for _ in range(2):
        a = uniform(rng, 0, 2 * math.pi)
        rb = r * uniform(rng, 0.4, 0.6)
        m = np.maximum(m, ellipse(x, y, cx + 0.8 * r * math.cos(a), cy + 0.8 * r * math.sin(a),
                                   rb, rb, rb * 0.3))
    c.A[rs, cs] += amp * m * (0.4 + 0.6 * c.inside[rs, cs])


def _sign_nodule(c: Canvas, an: Anatomy, rng: np.random.Generator) -> None:
    """Several small, bright, round dots scattered in the lungs."""
    for _ in range(int(rng.integers(3, 8))):
        side = _side(rng)
        cx, cy = an.lung_point(side, uniform(rng, 0.15, 0.85), uniform(rng, 0.15, 0.85))
        r = uniform(rng, 0.022, 0.036)
        amp = uniform(rng, 55, 85)
        b = c.box(cx - r - 0.02, cx + r + 0.02, cy - r - 0.02, cy + r + 0.02)
        if not b:
            continue
        rs, cs = b
        c.A[rs, cs] += amp * ellipse(c.x[:, cs], c.y[rs], cx, cy, r, r, 0.012)


def _sign_pneumonia(c: Canvas, an: Anatomy, rng: np.random.Generator) -> None:
    """Patchy consolidation in one lower zone."""
    region = _lung_region(c, an, rng, (0.45, 0.75), (0.6, 0.82), (0.14, 0.2), (0.12, 0.17))
    if region is None:
        return
    rs, cs, cx, cy, rx, ry = region
    blob = ellipse(c.x[:, cs], c.y[rs], cx, cy, rx, ry, min(rx, ry) * 0.4,
                    uniform(rng, -0.5, 0.5))
    patch = 0.45 + 0.55 * _patchy(rng, rs, cs, 6, -0.6)
    amp = uniform(rng, 0.8, 0.95)
    c.A[rs, cs] += blob * patch * (amp * c.dark[rs, cs] + 6.0 * c.inside[rs, cs])


def _sign_pneumothorax(c: Canvas, an: Anatomy, rng: np.random.Generator) -> None:
    """Apical/lateral rim without lung markings, darker, bounded by a thin pleural line."""
    side = _side(rng)
    w0 = uniform(rng, 0.09, 0.16)       # rim width at the apex
    lim = uniform(rng, 0.55, 0.9)       # how far down the lateral wall it reaches
    dark = uniform(rng, 28, 42)
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
    c.A[rs, cs] += line * uniform(rng, 30, 45)


def _sign_consolidation(c: Canvas, an: Anatomy, rng: np.random.Generator) -> None:
    """Dense, homogeneous opacity filling a lobe, sharply limited by a fissure."""
    side = _side(rng)
    upper = rng.random() < 0.45
    tf = uniform(rng, 0.35, 0.5) if upper else uniform(rng, 0.5, 0.65)
    yf = an.apex + tf * (an.ylat - an.apex)
    tilt = uniform(rng, -0.15, 0.15)
    dens = uniform(rng, 0.85, 0.97)
    b = _lung_box(c, an, side)
    if not b:
        return
    rs, cs = b
    dxf = c.x[:, cs] - side * 0.5 * (an.xmed + an.xlat)
    fis = yf + tilt * dxf + uniform(rng, -0.6, 0.6) * dxf * dxf
    d = (fis - c.y[rs]) if upper else (c.y[rs] - fis)
    lobe = np.clip(d * (1 / 0.012), 0, 1)
    tex = 0.88 + 0.12 * np.clip(smooth_noise(rng, 5, lobe.shape), -1, 1)
    c.A[rs, cs] += lobe * tex * (dens * c.dark[rs, cs] + 8.0 * c.inside[rs, cs])


def _sign_edema(c: Canvas, an: Anatomy, rng: np.random.Generator) -> None:
    """Bilateral hazy perihilar brightness (bat wings) and a diffuse haze."""
    sx, sy = uniform(rng, 0.2, 0.28), uniform(rng, 0.28, 0.38)
    amp, haze = uniform(rng, 0.45, 0.65) * an.lung_dark, uniform(rng, 6, 12)
    cxh, cyh = an.hx + uniform(rng, 0.0, 0.05), an.hy + uniform(rng, 0.0, 0.08)
    b = c.box(-1.0, 1.0, an.apex - 0.02, an.ylat + 0.02)
    if not b:
        return
    rs, cs = b
    g = np.exp(-(((c.ax[:, cs] - cxh) * (1.0 / sx)) ** 2 + ((c.y[rs] - cyh) * (1.0 / sy)) ** 2))
    c.A[rs, cs] += (amp * g + haze) * c.L[rs, cs]


def _sign_fibrosis(c: Canvas, an: Anatomy, rng: np.random.Generator) -> None:
    """Reticular (net-like) lines in the peripheral and lower lungs, both sides."""
    f = uniform(rng, 11.0, 14.0)
    a1, a2 = uniform(rng, 0.3, 0.8), uniform(rng, -0.8, -0.3)
    amp = uniform(rng, 0.6, 0.8)
    b = c.box(-1.0, 1.0, an.apex - 0.02, an.ylat + 0.02)
    if not b:
        return
    rs, cs = b
    x, y = c.x[:, cs], c.y[rs]
    shape = (rs.stop - rs.start, cs.stop - cs.start)
    w1 = smooth_noise(rng, 12, shape) * 1.8
    w2 = smooth_noise(rng, 12, shape) * 1.8
    tau = np.float32(2 * math.pi * f)
    s1 = np.cos((x * math.cos(a1) + y * math.sin(a1)) * tau + w1)
    s2 = np.cos((x * math.cos(a2) + y * math.sin(a2)) * tau + w2)
    net = np.clip((np.maximum(s1, s2) - 0.6) * 3.0, 0, 1)
    d = c.edge_distance(rs, cs, an)
    where = np.clip((0.28 - d) * 8.0, 0, 1) * np.clip((c.t[rs] - 0.35) * 4.0, 0, 1)
    c.A[rs, cs] += amp * net * where * (c.dark[rs, cs] + 10.0 * c.inside[rs, cs])


def _sign_pleural_thickening(c: Canvas, an: Anatomy, rng: np.random.Generator) -> None:
    """A bright band lining the lung edge (apical cap or lateral wall), one or both sides."""
    sides = [_side(rng)] if rng.random() < 0.7 else [-1, 1]
    for side in sides:
        thick = uniform(rng, 0.045, 0.07)
        amp = uniform(rng, 0.85, 1.0)
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


def _sign_hernia(c: Canvas, an: Anatomy, rng: np.random.Generator) -> None:
    """Hiatal hernia: a round retrocardiac density above the diaphragm with an air-fluid level."""
    cx = uniform(rng, -0.02, 0.12)
    cy = an.dome_r - uniform(rng, 0.04, 0.1)
    rx = uniform(rng, 0.1, 0.14)
    ry = rx * uniform(rng, 0.75, 0.95)
    level = cy - ry * uniform(rng, 0.0, 0.35)
    b = c.box(cx - rx - 0.03, cx + rx + 0.03, cy - ry - 0.03, cy + ry + 0.03)
    if not b:
        return
    rs, cs = b
    x, y = c.x[:, cs], c.y[rs]
    sac = ellipse(x, y, cx, cy, rx, ry, 0.015)
    inner = ellipse(x, y, cx, cy, rx - 0.02, ry - 0.02, 0.01)
    gas = inner * np.clip((level - y) * (1 / 0.006), 0, 1)
    c.A[rs, cs] += sac * uniform(rng, 25, 40) - gas * uniform(rng, 65, 90) + (sac - inner) * 15.0


PRE_SIGNS = {"Cardiomegaly": _pre_cardiomegaly, "Emphysema": _pre_emphysema}
"""Signs that change the anatomy before it is drawn: ``sign(anatomy, rng) -> anatomy``."""
POST_SIGNS = {
    "Atelectasis": _sign_atelectasis, "Effusion": _sign_effusion,
    "Infiltration": _sign_infiltration, "Mass": _sign_mass, "Nodule": _sign_nodule,
    "Pneumonia": _sign_pneumonia, "Pneumothorax": _sign_pneumothorax,
    "Consolidation": _sign_consolidation, "Edema": _sign_edema, "Fibrosis": _sign_fibrosis,
    "Pleural_Thickening": _sign_pleural_thickening, "Hernia": _sign_hernia,
}
"""Signs drawn onto the canvas after the healthy chest: ``sign(canvas, anatomy, rng)``."""
POST_ORDER = ("Edema", "Infiltration", "Pneumonia", "Consolidation", "Atelectasis", "Effusion",
              "Fibrosis", "Pleural_Thickening", "Mass", "Nodule", "Pneumothorax", "Hernia")
"""Order of drawing the post signs: diffuse ones first, sharp ones (lines, gas) last."""
if set(PRE_SIGNS) | set(POST_SIGNS) != set(PATHOLOGIES):  # pragma: no cover - guards future edits
    raise RuntimeError("every pathology needs exactly one sign")
