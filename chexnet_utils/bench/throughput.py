"""How fast can an input pipeline deliver, and how fast could it at best? (images/s)

The pipeline-only measurements of :mod:`chexnet_utils.bench.benchmark` (notebooks 02 and 07 reach
them as ``benchmark.X``):

:func:`time_pipeline` / :func:`compare_pipelines`
    Images/s a pipeline delivers when nothing consumes its batches; several pipelines are
    timed run by run, alternating, so a burst of load from elsewhere hurts them alike.
:func:`decode_ceiling`
    One core's parse + decode + preprocess rate times the cores: no pipeline on this
    machine beats it (:class:`DecodeCeiling`).
:func:`records_per_file` / :func:`shard_counts`
    Exact counts, no timing: how many images each of N workers decodes and keeps, with
    sharding after decoding (old) and sharding the file names first (new).

Every rate is the mean over ``repeats`` runs with its standard deviation
(:class:`ThroughputResult`); warm-up batches are never timed
(:mod:`chexnet_utils.platform.timing`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from chexnet_utils.hardware.devices import usable_cores
from chexnet_utils.input.pipelines import Files, preprocess
from chexnet_utils.platform.lazy import lazy_module
from chexnet_utils.platform.timing import (
    RunMean,
    alternating,
    mean_std,
    pipeline_run,
    timed_run,
    warm_up,
)

if TYPE_CHECKING:
    import tensorflow as tf

# TensorFlow: imported on first use (chexnet_utils.platform.lazy)
if not TYPE_CHECKING:
    tf = lazy_module("tensorflow")

__all__ = ["DecodeCeiling", "ThroughputResult", "compare_pipelines", "decode_ceiling",
           "records_per_file", "shard_counts", "time_pipeline"]


# --------------------------------------------------------------------------------------------
# Pipeline throughput
# --------------------------------------------------------------------------------------------

@dataclass
class ThroughputResult:
    """Images/s of a pipeline, one value per timed run (warm-up excluded)."""

    images_per_s: list[float]
    """One rate per run."""
    seconds: list[float]
    """Wall time of each run."""
    images: list[int]
    """Images delivered in each run (partial batches counted as they are)."""
    warmup_batches: int
    fresh_iterator: bool

    mean = RunMean("images_per_s", "Mean images/s over the runs.")

    @property
    def std(self) -> float:
        """Sample standard deviation of images/s over the runs (0 for one run)."""
        return mean_std(self.images_per_s)[1]

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(mean=self.mean, std=self.std)
        return d

    def __str__(self) -> str:
        return f"{self.mean:.1f} ± {self.std:.1f} images/s over {len(self.images_per_s)} run(s)"

    @classmethod
    def from_runs(cls, runs: Sequence[tuple[int, float]], warmup_batches: int,
                  fresh_iterator: bool) -> ThroughputResult:
        """From ``(images, seconds)`` of each timed run."""
        return cls(images_per_s=[i / s for i, s in runs], seconds=[s for _, s in runs],
                   images=[i for i, _ in runs], warmup_batches=warmup_batches,
                   fresh_iterator=fresh_iterator)


def _check_counts(n_batches: int, repeats: int, warmup_batches: int) -> None:
    if n_batches < 1 or repeats < 1 or warmup_batches < 0:
        raise ValueError("n_batches and repeats must be >= 1, warmup_batches >= 0")


def compare_pipelines(datasets: Mapping[str, tf.data.Dataset], n_batches: int,
                      warmup_batches: int = 2, repeats: int = 3, progress: bool = False
                      ) -> dict[str, ThroughputResult]:
    """Time several pipelines run by run, alternating between them.

    Each run creates a **fresh iterator**, pulls ``warmup_batches`` untimed (tracing, thread
    start-up, filling the shuffle buffer: the old approach must decode a whole shuffle buffer
    before its first batch), times the next ``n_batches`` and then deletes the iterator.
    Deleting matters: a live iterator keeps filling its prefetch buffers in the background,
    which would steal CPU from the pipeline being timed and hand its own next run batches
    that were made while the clock was stopped. Runs alternate in the order A B, B A, A B ...
    so slow drift of the machine's load affects every pipeline alike.

    A finite dataset (no repeat) shorter than ``warmup_batches + n_batches`` is timed for the
    batches it has; ``ValueError`` if no batch at all is left after the warm-up.
    ``progress=True`` shows a progress bar (one tick per run; tqdm, notebook-aware).
    """
    _check_counts(n_batches, repeats, warmup_batches)
    from tqdm.auto import tqdm

    runs: dict[str, list[tuple[int, float]]] = {name: [] for name in datasets}
    with tqdm(alternating(datasets, repeats), desc="timing runs", unit="run",
              disable=not progress, dynamic_ncols=True) as bar:
        for name in bar:
            images, seconds = pipeline_run(datasets[name], n_batches, warmup_batches)
            if images == 0:
                raise ValueError(f"{name}: no batches left after {warmup_batches} warm-up "
                                 f"batch(es); use a repeating dataset or fewer warm-up batches")
            runs[name].append((images, seconds))
    return {name: ThroughputResult.from_runs(rs, warmup_batches, fresh_iterator=True)
            for name, rs in runs.items()}


def time_pipeline(dataset: tf.data.Dataset, n_batches: int, warmup_batches: int = 2,
                  repeats: int = 3, fresh_iterator: bool = True) -> ThroughputResult:
    """Images/s a pipeline delivers to a consumer that does nothing else.

    ``fresh_iterator=True`` (default): every run starts a new iterator with its own warm-up
    (see :func:`compare_pipelines`), so runs are independent and a finite dataset can be
    timed several times. ``False``: one iterator, warmed up once; the runs continue where
    the previous one stopped (steady state only; a finite dataset may run out).
    """
    if fresh_iterator:
        return compare_pipelines({"_": dataset}, n_batches, warmup_batches, repeats)["_"]
    _check_counts(n_batches, repeats, warmup_batches)
    it = iter(dataset)
    warm_up(it, warmup_batches)
    rs = []
    for _ in range(repeats):
        images, seconds = timed_run(it, n_batches)
        if images == 0:
            break
        rs.append((images, seconds))
    if not rs:
        raise ValueError("no batches left after the warm-up")
    return ThroughputResult.from_runs(rs, warmup_batches, fresh_iterator=False)


# --------------------------------------------------------------------------------------------
# The decode ceiling
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DecodeCeiling:
    """One core's parse + decode + preprocess rate, and the ceiling it sets: that rate times
    the cores (:func:`decode_ceiling`)."""

    per_pass_img_per_s: list[float]
    """Images/s of each timed pass on one core."""
    cores: int
    """Cores this process may use (:func:`chexnet_utils.hardware.devices.usable_cores`)."""
    n_images: int
    """Records read into memory and decoded in every pass."""
    image_size: int
    """Preprocessed size, pixels per side."""

    @property
    def img_per_s_single_core(self) -> float:
        """The best pass, images/s on one core (a ceiling should not be lowered by someone
        else's load)."""
        return max(self.per_pass_img_per_s)

    @property
    def ceiling_img_per_s(self) -> float:
        """``img_per_s_single_core x cores``: no pipeline on this machine beats it, images/s."""
        return self.img_per_s_single_core * self.cores

    def as_dict(self) -> dict[str, Any]:
        """The fields, the single-core rate and the ceiling (the former dict's keys)."""
        return {**asdict(self), "img_per_s_single_core": self.img_per_s_single_core,
                "ceiling_img_per_s": self.ceiling_img_per_s}

    def __str__(self) -> str:
        """The single-core rate, the cores and the ceiling, on one line."""
        return (f"{self.img_per_s_single_core:.1f} images/s on one core x {self.cores} "
                f"core(s) = {self.ceiling_img_per_s:.1f} images/s ({self.n_images} images at "
                f"{self.image_size} px, best of {len(self.per_pass_img_per_s)} pass(es))")


def decode_ceiling(files: Files, image_size: int, n_images: int = 64, repeats: int = 2,
                   training: bool = True, antialias: bool = False,
                   min_seconds: float = 0.5) -> DecodeCeiling:
    """Single-core parse + decode + preprocess rate, times the cores: the best any pipeline
    could do on this machine.

    The first ``n_images`` records are read into memory first (so storage is not measured),
    then run through :func:`chexnet_utils.input.pipelines.preprocess` by a tf.data map with no
    parallelism and batched, consumed by ``Dataset.reduce`` (no Python per image). Its
    ``tf.data.Options`` keep it on one core: a private thread pool of one thread and intra-op
    parallelism 1 (so the resize cannot borrow other cores), and TF's two default rewrites
    that would add parallelism switched off: ``map_parallelization`` (it would parallelise
    the map, which is stateless in evaluation mode) and ``inject_prefetch`` (it would append
    a background prefetch; see :mod:`chexnet_utils.input.pipelines`). One untimed pass over a few
    images traces the function; then ``repeats`` timed passes; the single-core rate is the **best**
    pass (a ceiling should not be lowered by someone else's load).

    Reading it: the old approach decodes on one core, so it should stay near the single-core
    rate (a little above is possible: its prefetch thread overlaps the decoding with the
    consumer's work); the new approach should approach the ceiling.

    Returns a :class:`DecodeCeiling`: ``per_pass_img_per_s``, ``cores``
    (:func:`chexnet_utils.hardware.devices.usable_cores`), ``n_images``, ``image_size``, and as
    properties ``img_per_s_single_core`` (the best pass) and ``ceiling_img_per_s`` (their
    product).
    """
    from chexnet_utils.data.tfrecords import parse_example

    records = list(tf.data.TFRecordDataset([str(f) for f in files]).take(n_images)
                   .as_numpy_iterator())
    if not records:
        raise ValueError("no records in the given files")

    def fn(serialized: Any) -> tuple[Any, Any]:
        ex = parse_example(serialized)
        return preprocess(ex["image_bytes"], ex["label"], image_size, training,
                          antialias=antialias)

    opts = tf.data.Options()
    opts.threading.private_threadpool_size = 1
    opts.threading.max_intra_op_parallelism = 1
    opts.experimental_optimization.map_parallelization = False
    opts.experimental_optimization.inject_prefetch = False

    def pipeline(passes: int) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices(records).repeat(passes)
        return ds.map(fn).batch(32).with_options(opts)

    def count(ds: tf.data.Dataset) -> int:
        # Batches (as the real pipelines make them) consumed by Dataset.reduce, which loops
        # inside TensorFlow: per-image Python or function-call overhead would cost more than
        # decoding a small image and hide what we measure.
        n = ds.reduce(tf.constant(0, tf.int64),
                      lambda acc, el: acc + tf.shape(el[0], out_type=tf.int64)[0])
        return int(n)

    # Untimed: trace and allocate, then time one pass to size the timed ones. Small images
    # decode in microseconds: a timed pass loops over the records often enough to last
    # ``min_seconds``, so start-up costs do not count.
    one = pipeline(1)
    count(one)
    t0 = time.perf_counter()
    count(one)
    one_pass = time.perf_counter() - t0
    ds = pipeline(max(1, math.ceil(min_seconds / max(one_pass, 1e-6))))
    rates = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        n = count(ds)
        rates.append(n / (time.perf_counter() - t0))
    return DecodeCeiling(per_pass_img_per_s=rates, cores=usable_cores(), n_images=len(records),
                         image_size=image_size)



# --------------------------------------------------------------------------------------------
# Exact counts: who decodes and keeps what
# --------------------------------------------------------------------------------------------

def records_per_file(files: Files) -> list[int]:
    """Number of records in each TFRecord file (read by TensorFlow, nothing decoded)."""
    return [int(tf.data.TFRecordDataset(str(f)).reduce(tf.constant(0, tf.int64),
                                                       lambda n, _: n + 1))
            for f in files]


def shard_counts(files: Files, num_workers: int,
                 counts: Sequence[int] | None = None) -> list[dict[str, int]]:
    """Per worker of ``num_workers``: images it decodes and images it keeps, old vs new.

    * old approach (shard after decode): every worker decodes **all** records and keeps
      every N-th (``shard(N, i)`` on the decoded images), so worker ``i`` keeps
      ``len(range(i, total, N))``;
    * new approach (shard the file names first): worker ``i`` opens files ``i, i+N, ...``
      and decodes (and keeps) only their records.

    These are the exact counts of one epoch in evaluation mode (no repeat, nothing dropped);
    pass ``counts`` (records per file, in the order of ``files``) to skip reading the files.
    Returns one dict per worker: ``worker``, ``old_decoded``, ``old_kept``, ``new_files``,
    ``new_decoded``, ``new_kept``.
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    counts = list(counts) if counts is not None else records_per_file(files)
    if len(counts) != len(files):
        raise ValueError(f"{len(counts)} counts for {len(files)} files")
    total = sum(counts)
    rows = []
    for i in range(num_workers):
        own = counts[i::num_workers]  # = from_tensor_slices(files).shard(N, i)
        rows.append({"worker": i, "old_decoded": total,
                     "old_kept": len(range(i, total, num_workers)),
                     "new_files": len(own), "new_decoded": sum(own), "new_kept": sum(own)})
    return rows

