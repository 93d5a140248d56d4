"""Where the data lives and how big a run is: every setting a notebook reads.

``CHEXNET_DATA_DIR``
    A ChestX-ray14-style folder (the real NIH download, or a synthetic stand-in). Unset, the
    notebooks use ``data/synthetic-<scale>/`` in the repository and generate it on first use.
``CHEXNET_SCALE``
    ``ci`` (default: minutes on a 2-core laptop), ``workstation`` (a multi-core box, maybe one
    GPU) or ``gpu-node`` (a node with several GPUs and the real data set).
``CHEXNET_WORK_DIR``
    Where derived files (TFRecords, checkpoints, logs, figures) go; default ``build/``.
``CHEXNET_EPOCHS``, ``CHEXNET_BENCH_BATCHES``, ... ``CHEXNET_COMM_MAX_MB`` (:data:`OVERRIDES`)
    ``CHEXNET_EPOCHS``, ``CHEXNET_BENCH_BATCHES``, ``CHEXNET_FEEDING_BATCHES``,
    ``CHEXNET_BENCH_REPEATS``, ``CHEXNET_BENCH_STEPS``, ``CHEXNET_ACCEL_MS``, ``CHEXNET_WORKERS``
    and ``CHEXNET_COMM_MAX_MB`` each override one field of the preset: epochs of the training
    notebooks, batches timed per input-pipeline measurement of notebook 02 and per measurement of
    notebook 07, repeats of each measurement, training steps
    timed per throughput measurement, the emulated accelerator's milliseconds per step, the
    largest number of Horovod engines and the largest tensor (MiB) of the allreduce sweeps
    of notebooks 05 and 06. :func:`scale` resolves them; notebooks read the preset's fields and
    nothing else (no ``SCALE.name == ...`` branches: a setting that differs between presets
    is a field of :class:`Scale`).
``CHEXNET_MIXED_PRECISION``, ``CHEXNET_XLA``
    ``on`` / ``off`` / ``auto`` (default): mixed precision and XLA, on where the process has a
    GPU (:mod:`chexnet_utils.model.accelerator`). On a GPU node the notebooks start one worker per
    visible GPU (``CUDA_VISIBLE_DEVICES``), at most ``max_workers``
    (:func:`chexnet_utils.hardware.devices.worker_plan`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Scale:
    """Sizes for one scale preset: every setting a notebook reads that depends on the scale.

    Each field's docstring names the notebooks that read it (directly, or through
    :mod:`chexnet_utils.data.prepare` / :meth:`chexnet_utils.training.TrainConfig.from_scale`)."""

    name: str
    """The preset's name (``CHEXNET_SCALE``); notebooks print it and record it in results,
    they never branch on it."""
    n_images: int
    """Images in the synthetic stand-in (ignored when ``CHEXNET_DATA_DIR`` is set): made by
    :func:`chexnet_utils.data.prepare.prepare_data` on first use (every notebook); notebook 07 also
    prices caching each preset's data set."""
    source_size: int
    """Side in pixels of the synthetic PNGs (NIH's are 1024); :mod:`chexnet_utils.data.prepare`."""
    image_size: int
    """Side the model sees after resizing (notebooks 01-04 and 07; the engine runs of 04 via
    :meth:`chexnet_utils.training.TrainConfig.from_scale`)."""
    arch: str
    """Model architecture of the training notebooks (03, 04)."""
    batch_size: int
    """Batch per worker (notebooks 02, 03, 04 and 07)."""
    epochs: int
    """Epochs of the training notebooks (03; 04 through
    :meth:`chexnet_utils.training.TrainConfig.from_scale`)."""
    max_workers: int
    """Largest number of Horovod engines the notebooks start (04-06) or simulate (02)."""
    shard_size: int | None
    """Images per TFRecord shard (``None``: about 100 MB per shard, TF's usual advice):
    :func:`chexnet_utils.data.prepare.prepare_tfrecords` (every notebook), notebook 01."""
    bench_batches: int = 8
    """Batches timed per input-pipeline measurement of notebook 02. The ci preset times 5:
    ``make bench-preset`` ran notebook 02 whole with 8 and with 5, alternating, and 5 showed
    the same effects (new / old 1.94x against 1.99x, the idle fractions within 0.01, every
    spread no wider), 18 s sooner; only the old pipeline's wait share under the emulated
    accelerator read higher (0.28 against 0.24: its first batches weigh more)."""
    bench_repeats: int = 3
    """Runs per measurement, alternating between the settings compared; the median is
    reported (notebooks 02 and 03)."""
    bench_steps: int = 8
    """Training steps timed per images/s measurement (notebooks 03 and 04)."""
    bench_warmup: int = 2
    """Untimed batches (or training steps) before each timed run of a pipeline or a training
    step: tracing, filling the buffers (notebooks 02, 03 and 07)."""
    scaling_batch_size: int = 16
    """Batch per worker of notebook 04's scaling measurement. The ci preset halves it: each
    step then decodes half as many full-size images and needs fewer warm-up steps (below),
    so the cell takes about half the time and shows the same old-vs-new contrast (measured
    side by side, ``docs/benchmarks.md``)."""
    scaling_warmup_steps: int = 20
    """Untimed training steps on every engine before each timed images/s window of notebook
    04's scaling measurement: long enough that a pipeline slower than the step has used up
    the decoded batches it buffered before the clock starts. The old approach holds
    ``prefetch(batch_size)``, that is ``batch_size`` whole batches, plus a shuffle buffer of
    :data:`chexnet_utils.bench.scaling.SHUFFLE_BUFFER` decoded images: 16 + 2 batches at batch 16
    (20 steps), 8 + 4 at batch 8 (the ci preset's 16), 32 + 1 at batch 32 (gpu-node's 40).
    Fewer would time stock, not throughput."""
    accel_ms: float = 20.0
    """Milliseconds of emulated accelerator work per step (notebook 04)."""
    comm_max_mb: float = 128.0
    """Largest tensor, in MiB, of notebook 05's allreduce sweeps and notebook 06's fp16 sizes
    (1 KiB, 2 KiB, ... up to it; :func:`chexnet_utils.comm.collectives.default_max_bytes`)."""
    comm_repeats: int = 10
    """Timed repeats per tensor size of the allreduce sweeps (05), fp16 sizes and tensor-fusion
    bursts (06) (the fastest and the median are reported)."""
    comm_image_size: int = 128
    """Image side of the training step that notebook 06 times on its engines (Horovod vs
    MultiWorkerMirroredStrategy, process binding)."""
    comm_batch_size: int = 16
    """Batch per worker of notebook 06's timed training step."""
    comm_steps: int = 10
    """Timed steps per repeat of notebook 06's training step."""
    comm_warmup_steps: int = 3
    """Untimed steps before notebook 06's timed training steps."""
    comm_step_repeats: int = 3
    """Timed blocks of ``comm_steps`` steps in notebook 06 (their median is reported)."""
    comm_cycle_time_clusters: bool = True
    """Notebook 06's tensor-fusion section also starts the two ``HOROVOD_CYCLE_TIME``
    clusters (0.2 ms and 5 ms): two more cluster start-ups."""
    feeding_batches: int = 8
    """Batches timed per measurement of notebook 07 (pipeline options, PyDataset, tf.data
    service). Kept at 8 in the ci preset: with 5 (``make bench-preset``) its cache speed-up
    read 26x with a spread of 1.25 against 38x and 1.01, for 1.4 s saved."""
    feeding_shards: int = 16
    """Train shards notebook 07's toolbox sections read (cache, snapshot, PyDataset)."""
    feeding_repeats: int = 1
    """Runs per measurement in notebook 07 (one: it shows the tools; notebook 02 measures
    with ``bench_repeats``)."""
    elastic_epochs: int = 10
    """Epochs of notebook 10's elastic run and of its checkpoint-restart baseline (a worker is
    killed in the second, one added back later)."""
    service_warmup: int = 3
    """Untimed trainer steps before notebook 07's tf.data service scenario is timed."""


SCALES: dict[str, Scale] = {
    "ci": Scale("ci", n_images=600, source_size=1024, image_size=128, arch="small",
                batch_size=16, epochs=5, max_workers=2, shard_size=32, bench_batches=5,
                bench_repeats=2, bench_steps=6, scaling_batch_size=8, scaling_warmup_steps=16,
                comm_max_mb=32.0, comm_repeats=5, comm_image_size=64,
                comm_cycle_time_clusters=False, feeding_shards=3,
                elastic_epochs=4),
    "workstation": Scale("workstation", n_images=6000, source_size=1024, image_size=224,
                         arch="densenet121", batch_size=16, epochs=5, max_workers=4,
                         shard_size=256, comm_max_mb=128.0),
    "gpu-node": Scale("gpu-node", n_images=20000, source_size=1024, image_size=224,
                      arch="densenet121", batch_size=32, epochs=10, max_workers=8,
                      shard_size=None, bench_batches=50, feeding_batches=50, bench_steps=50,
                      scaling_batch_size=32, scaling_warmup_steps=40, comm_max_mb=256.0),
}

OVERRIDES: dict[str, tuple[str, type]] = {
    "CHEXNET_EPOCHS": ("epochs", int),
    "CHEXNET_BENCH_BATCHES": ("bench_batches", int),
    "CHEXNET_FEEDING_BATCHES": ("feeding_batches", int),
    "CHEXNET_BENCH_REPEATS": ("bench_repeats", int),
    "CHEXNET_BENCH_STEPS": ("bench_steps", int),
    "CHEXNET_ACCEL_MS": ("accel_ms", float),
    "CHEXNET_WORKERS": ("max_workers", int),
    "CHEXNET_COMM_MAX_MB": ("comm_max_mb", float),
}
"""Environment variable -> (field of :class:`Scale`, type); applied by :func:`scale`."""

MAXIMA: dict[str, float] = {
    "epochs": 10_000, "bench_batches": 100_000, "feeding_batches": 100_000,
    "bench_repeats": 1_000, "bench_steps": 100_000,
    "accel_ms": 100_000,       # 100 s of emulated work per step
    "max_workers": 4_096,
}
"""The largest value each :data:`OVERRIDES` field accepts (``comm_max_mb``: a quarter of this
machine's memory, :func:`comm_max_mb_limit`): far above any real run, low enough that a typo
(``CHEXNET_WORKERS=1000000``) fails here, naming the variable, not in engines far away."""


def comm_max_mb_limit() -> float:
    """A quarter of this machine's memory in MiB: the allreduce sweeps hold tensors of
    ``CHEXNET_COMM_MAX_MB`` on every engine, several at a time."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 4 / 2 ** 20
    except (ValueError, OSError):
        return 65_536.0


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

    Raises ``ValueError`` naming the variable when a value is not written in ASCII (Python
    would read ``'٥'`` as 5), does not parse, is not finite (``nan``, ``inf``, ``1e400``), is
    not positive (``CHEXNET_ACCEL_MS=0`` is allowed: no emulated accelerator) or is over its
    :data:`MAXIMA`.
    """
    changes: dict[str, Any] = {}  # field -> a value of its OVERRIDES kind, checked below
    for var, (field, kind) in OVERRIDES.items():
        raw = env.get(var, "").strip()
        if not raw:
            continue
        try:
            if not raw.isascii():
                raise ValueError
            value = kind(raw)
        except ValueError:
            raise ValueError(f"{var}={raw!r} is not a number ({kind.__name__}, ASCII digits)"
                             ) from None
        if not math.isfinite(value):
            raise ValueError(f"{var}={raw!r} is not a finite number")
        if value < 0 or (value == 0 and field != "accel_ms"):
            raise ValueError(f"{var}={raw!r} must be positive")
        limit = MAXIMA[field] if field in MAXIMA else comm_max_mb_limit()
        if value > limit:
            raise ValueError(f"{var}={raw!r} is more than this setting allows ({limit:,.0f})")
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
    """``CHEXNET_WORK_DIR`` if set, else ``build/`` in the repository (created).

    With the real data set (:func:`using_real_data`: clinical images and patient ids) the
    folder is made private to the learner (mode 0700; an existing one of the learner's own
    loses its group and other permissions), so derived TFRecords and checkpoints are not
    readable by every account on the host. Raises ``PermissionError`` with one line naming
    the folder and the variable when it cannot be created or written.
    """
    env = os.environ.get("CHEXNET_WORK_DIR")
    path = Path(env).expanduser().resolve() if env else repo_root() / "build"
    private = using_real_data()
    try:
        path.mkdir(mode=0o700 if private else 0o777, parents=True, exist_ok=True)
        st = path.stat()
        if private and st.st_mode & 0o077 and st.st_uid == os.geteuid():
            path.chmod(0o700)
    except OSError as e:
        raise PermissionError(f"work folder {path} cannot be created or made private "
                              f"({e.strerror}): set CHEXNET_WORK_DIR to a folder you may "
                              "write") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(f"work folder {path} is not writable: set CHEXNET_WORK_DIR to "
                              "a folder you may write")
    return path


def using_real_data() -> bool:
    """True when the user pointed ``CHEXNET_DATA_DIR`` somewhere."""
    return bool(os.environ.get("CHEXNET_DATA_DIR"))
