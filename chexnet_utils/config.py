"""Where the data lives and how big a run is: the two knobs every notebook reads.

``CHEXNET_DATA_DIR``
    A ChestX-ray14-style folder (the real NIH download, or a synthetic stand-in). Unset, the
    notebooks use ``data/synthetic-<scale>/`` in the repository and generate it on first use.
``CHEXNET_SCALE``
    ``ci`` (default: minutes on a 2-core laptop), ``workstation`` (a multi-core box, maybe one
    GPU) or ``gpu-node`` (a node with several GPUs and the real data set).
``CHEXNET_WORK_DIR``
    Where derived files (TFRecords, checkpoints, logs, figures) go; default ``build/``.
``CHEXNET_EPOCHS``, ``CHEXNET_BENCH_BATCHES``, ``CHEXNET_BENCH_REPEATS``, ``CHEXNET_BENCH_STEPS``, ``CHEXNET_ACCEL_MS``, ``CHEXNET_WORKERS``
    Override one field of the preset (:data:`OVERRIDES`): epochs of the training notebooks,
    batches timed per input-pipeline measurement, repeats of each measurement, training steps
    timed per throughput measurement, the emulated accelerator's milliseconds per step and
    the largest number of Horovod engines. :func:`scale` resolves them; notebooks read the
    preset's fields and nothing else.
``CHEXNET_MIXED_PRECISION``, ``CHEXNET_XLA``
    ``on`` / ``off`` / ``auto`` (default): mixed precision and XLA, on where the process has a
    GPU (:mod:`chexnet_utils.accelerator`). On a GPU node the notebooks start one worker per
    visible GPU (``CUDA_VISIBLE_DEVICES``), at most ``max_workers``
    (:func:`chexnet_utils.devices.worker_plan`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Scale:
    """Sizes for one scale preset."""

    name: str
    n_images: int
    """Images in the synthetic stand-in (ignored when ``CHEXNET_DATA_DIR`` is set)."""
    source_size: int
    """Side in pixels of the synthetic PNGs (NIH's are 1024)."""
    image_size: int
    """Side the model sees after resizing."""
    arch: str
    """Model architecture for training notebooks."""
    batch_size: int
    epochs: int
    max_workers: int
    """Largest number of Horovod engines the notebooks start."""
    shard_size: int | None
    """Images per TFRecord shard (``None``: about 100 MB per shard, TF's usual advice)."""
    bench_batches: int = 8
    """Batches timed per input-pipeline measurement (notebooks 02 and 06)."""
    bench_repeats: int = 3
    """Runs per measurement; the median is reported (notebooks 02 and 03)."""
    bench_steps: int = 8
    """Training steps timed per images/s measurement (notebooks 03 and 04)."""
    accel_ms: float = 20.0
    """Milliseconds of emulated accelerator work per step (notebooks 04 and 06)."""


SCALES: dict[str, Scale] = {
    "ci": Scale("ci", n_images=600, source_size=1024, image_size=128, arch="small",
                batch_size=16, epochs=5, max_workers=2, shard_size=32, bench_repeats=2,
                bench_steps=6),
    "workstation": Scale("workstation", n_images=6000, source_size=1024, image_size=224,
                         arch="densenet121", batch_size=16, epochs=5, max_workers=4,
                         shard_size=256),
    "gpu-node": Scale("gpu-node", n_images=20000, source_size=1024, image_size=224,
                      arch="densenet121", batch_size=32, epochs=10, max_workers=8,
                      shard_size=None, bench_batches=50, bench_steps=50),
}

OVERRIDES: dict[str, tuple[str, type]] = {
    "CHEXNET_EPOCHS": ("epochs", int),
    "CHEXNET_BENCH_BATCHES": ("bench_batches", int),
    "CHEXNET_BENCH_REPEATS": ("bench_repeats", int),
    "CHEXNET_BENCH_STEPS": ("bench_steps", int),
    "CHEXNET_ACCEL_MS": ("accel_ms", float),
    "CHEXNET_WORKERS": ("max_workers", int),
}
"""Environment variable -> (field of :class:`Scale`, type); applied by :func:`scale`."""


def repo_root() -> Path:
    """The checkout this package is installed from (editable install)."""
    return Path(__file__).resolve().parent.parent


def scale(name: str | None = None) -> Scale:
    """The preset named by ``name`` or ``CHEXNET_SCALE`` (default ``ci``)."""
    key = (name or os.environ.get("CHEXNET_SCALE") or "ci").strip().lower()
    try:
        preset = SCALES[key]
    except KeyError:
        raise ValueError(f"CHEXNET_SCALE={key!r} is not one of {sorted(SCALES)}") from None
    return with_overrides(preset, os.environ)


def with_overrides(preset: Scale, env: Mapping[str, str]) -> Scale:
    """``preset`` with the fields named in :data:`OVERRIDES` taken from ``env`` where set.

    Raises ``ValueError`` naming the variable when a value does not parse or is not positive
    (``CHEXNET_ACCEL_MS=0`` is allowed: no emulated accelerator).
    """
    changes: dict[str, int | float] = {}
    for var, (field, kind) in OVERRIDES.items():
        raw = env.get(var, "").strip()
        if not raw:
            continue
        try:
            value = kind(raw)
        except ValueError:
            raise ValueError(f"{var}={raw!r} is not a number ({kind.__name__})") from None
        if value < 0 or (value == 0 and field != "accel_ms"):
            raise ValueError(f"{var}={raw!r} must be positive")
        changes[field] = value
    return replace(preset, **changes) if changes else preset


def data_dir(s: Scale | None = None) -> Path:
    """``CHEXNET_DATA_DIR`` if set, else ``data/synthetic-<scale>`` in the repository."""
    env = os.environ.get("CHEXNET_DATA_DIR")
    if env:
        return Path(env).expanduser().resolve()
    s = s or scale()
    return repo_root() / "data" / f"synthetic-{s.name}"


def work_dir() -> Path:
    """``CHEXNET_WORK_DIR`` if set, else ``build/`` in the repository (created)."""
    env = os.environ.get("CHEXNET_WORK_DIR")
    path = Path(env).expanduser().resolve() if env else repo_root() / "build"
    path.mkdir(parents=True, exist_ok=True)
    return path


def using_real_data() -> bool:
    """True when the user pointed ``CHEXNET_DATA_DIR`` somewhere."""
    return bool(os.environ.get("CHEXNET_DATA_DIR"))
