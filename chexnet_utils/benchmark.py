"""Measure input pipelines: images/s, the decode ceiling, idle accelerator time, timelines.

What each measurement answers
-----------------------------
:func:`time_pipeline` / :func:`compare_pipelines`
    How fast can a pipeline *deliver* batches when nothing consumes them? (images/s)
:func:`decode_ceiling`
    How fast could it be at best? One core decodes and preprocesses N images/s, so no
    pipeline on this machine beats ``N x cores`` (an upper bound: reading, batching and the
    tf.data machinery cost CPU too, and cores are rarely perfectly independent).
:func:`time_training`
    How much of the training step is spent waiting for data? The same compiled training step
    is timed fed by the pipeline and fed a constant in-memory batch (the accelerator's own
    speed); ``idle_fraction = 1 - real / synthetic``.
:func:`compare_training`
    The same, for several pipelines at once, with each pipeline's speed *alone* measured in
    the same alternating runs: is fed training as fast as ``min(pipeline, model)``, or do
    input and model compete for the cores?
:func:`record_timeline` / :func:`simulate_timeline`
    *When* does the accelerator wait? Per step: when the batch was requested, when it was
    ready, when the step finished - the "waiting for data" vs "computing" bars of the
    articles' figures. The simulation uses sleeps instead of real work so the
    sum-vs-max effect of pipelining shows cleanly on any machine.
:func:`simulated_workers`
    Does the pipeline scale with Horovod workers? Builds worker 0's pipeline for N workers
    and multiplies its useful rate by N (see the assumption there).
:func:`shard_counts`
    How many images does each of N workers decode, and how many does it keep? (exact
    counts, no timing: the shard-after-decode trap in numbers)
:func:`bench_pipelines`
    All of the above for the old and the new approach in one run: the JSON behind
    ``python -m chexnet_utils bench pipelines``.

On a CPU-only machine the "accelerator" is the same CPU cores: a training step and the input
pipeline compete for them, so idle fractions measured there mix waiting with contention. The
pipeline numbers themselves (images/s, ceiling) are what a GPU node's CPU would deliver.

Measuring on a shared, noisy machine: every rate is the mean over ``repeats`` runs with its
standard deviation, warm-up batches (tracing, filling shuffle buffers, starting threads) are
never timed, and :func:`compare_pipelines` alternates the pipelines run by run so that a
burst of load from elsewhere hurts both alike.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chexnet_utils.labels import NUM_CLASSES
from chexnet_utils.pipelines import (
    DEFAULT_SHUFFLE_BUFFER,
    Files,
    PipelineOptions,
    build_pipeline,
    new_approach,
    old_approach,
    preprocess,
)

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

__all__ = [
    "FedTrainingResult",
    "accel_wait_fraction",
    "ThroughputResult",
    "Timeline",
    "TrainingResult",
    "available_cores",
    "bench_pipelines",
    "compare_pipelines",
    "compare_training",
    "decode_ceiling",
    "format_bench",
    "probe_model",
    "record_timeline",
    "records_per_file",
    "shard_counts",
    "simulate_timeline",
    "simulated_workers",
    "time_pipeline",
    "time_training",
    "train_step_fn",
]


def available_cores() -> int:
    """Cores this process may run on (``os.sched_getaffinity``; respects taskset/cgroups
    pinning, unlike ``os.cpu_count``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _batch_len(batch: Any) -> int:
    """Images in one element: the leading dimension of its first component."""
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    if isinstance(first, Mapping):
        first = next(iter(first.values()))
    return int(first.shape[0])


def _block(value: Any) -> None:
    """Wait until ``value`` is computed (fetch a scalar of it to the host)."""
    if value is None:
        return
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for v in value:
            _block(v)
        return
    numpy = getattr(value, "numpy", None)
    if callable(numpy):
        numpy()


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


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

    @property
    def mean(self) -> float:
        """Mean images/s over the runs."""
        return _mean_std(self.images_per_s)[0]

    @property
    def std(self) -> float:
        """Sample standard deviation of images/s over the runs (0 for one run)."""
        return _mean_std(self.images_per_s)[1]

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(mean=self.mean, std=self.std)
        return d

    def __str__(self) -> str:
        return f"{self.mean:.1f} ± {self.std:.1f} images/s over {len(self.images_per_s)} run(s)"


def _next_or_none(it: Iterator[Any]) -> Any:
    try:
        return next(it)
    except StopIteration:
        return None


def _timed_run(it: Iterator[Any], n_batches: int) -> tuple[int, float]:
    """Pull up to ``n_batches`` from ``it``: (images, seconds)."""
    images = 0
    t0 = time.perf_counter()
    for _ in range(n_batches):
        batch = _next_or_none(it)
        if batch is None:
            break
        images += _batch_len(batch)
    return images, time.perf_counter() - t0


def _warm_up(it: Iterator[Any], warmup_batches: int) -> None:
    for _ in range(warmup_batches):
        if _next_or_none(it) is None:
            return


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
    if n_batches < 1 or repeats < 1 or warmup_batches < 0:
        raise ValueError("n_batches and repeats must be >= 1, warmup_batches >= 0")
    from tqdm.auto import tqdm

    runs: dict[str, list[tuple[int, float]]] = {name: [] for name in datasets}
    order = list(datasets)
    schedule = [name for r in range(repeats) for name in (order if r % 2 == 0 else order[::-1])]
    with tqdm(schedule, desc="timing runs", unit="run", disable=not progress,
              dynamic_ncols=True) as bar:
        for name in bar:
            it = iter(datasets[name])
            _warm_up(it, warmup_batches)
            images, seconds = _timed_run(it, n_batches)
            del it
            if images == 0:
                raise ValueError(f"{name}: no batches left after {warmup_batches} warm-up "
                                 f"batch(es); use a repeating dataset or fewer warm-up batches")
            runs[name].append((images, seconds))
    return {
        name: ThroughputResult(images_per_s=[i / s for i, s in rs], seconds=[s for _, s in rs],
                               images=[i for i, _ in rs], warmup_batches=warmup_batches,
                               fresh_iterator=True)
        for name, rs in runs.items()
    }


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
    if n_batches < 1 or repeats < 1 or warmup_batches < 0:
        raise ValueError("n_batches and repeats must be >= 1, warmup_batches >= 0")
    it = iter(dataset)
    _warm_up(it, warmup_batches)
    rs = []
    for _ in range(repeats):
        images, seconds = _timed_run(it, n_batches)
        if images == 0:
            break
        rs.append((images, seconds))
    if not rs:
        raise ValueError("no batches left after the warm-up")
    return ThroughputResult(images_per_s=[i / s for i, s in rs], seconds=[s for _, s in rs],
                            images=[i for i, _ in rs], warmup_batches=warmup_batches,
                            fresh_iterator=False)


# --------------------------------------------------------------------------------------------
# The decode ceiling
# --------------------------------------------------------------------------------------------

def decode_ceiling(files: Files, image_size: int, n_images: int = 64, repeats: int = 2,
                   training: bool = True, antialias: bool = False,
                   min_seconds: float = 0.5) -> dict[str, Any]:
    """Single-core parse + decode + preprocess rate, times the cores: the best any pipeline
    could do on this machine.

    The first ``n_images`` records are read into memory first (so storage is not measured),
    then run through :func:`chexnet_utils.pipelines.preprocess` by a tf.data map with no
    parallelism and batched, consumed by ``Dataset.reduce`` (no Python per image), a private thread pool of one thread and intra-op parallelism 1 (so the
    resize cannot borrow other cores). One untimed pass over a few images traces the
    function; then ``repeats`` timed passes; the single-core rate is the **best** pass (a
    ceiling should not be lowered by someone else's load).

    Reading it: the old approach decodes on one core, so it should stay near the single-core
    rate (a little above is possible: its prefetch thread overlaps the decoding with the
    consumer's work); the new approach should approach the ceiling.

    Returns ``img_per_s_single_core``, ``cores`` (:func:`available_cores`),
    ``ceiling_img_per_s`` (their product), ``per_pass_img_per_s``, ``n_images``,
    ``image_size``.
    """
    import tensorflow as tf

    from chexnet_utils.tfrecords import parse_example

    records = list(tf.data.TFRecordDataset([str(f) for f in files]).take(n_images)
                   .as_numpy_iterator())
    if not records:
        raise ValueError("no records in the given files")

    def fn(serialized):  # type: ignore[no-untyped-def]
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
    best = max(rates)
    cores = available_cores()
    return {"img_per_s_single_core": best, "cores": cores, "ceiling_img_per_s": best * cores,
            "per_pass_img_per_s": rates, "n_images": len(records), "image_size": image_size}


# --------------------------------------------------------------------------------------------
# Training steps: how long does the accelerator wait?
# --------------------------------------------------------------------------------------------

def probe_model(image_size: int, seed: int = 0) -> keras.Model:
    """A small CPU-sized CNN for measuring idle time: 3 strided convolutions, global
    pooling, 14 sigmoid outputs, binary cross-entropy, Adam. Stands in for CheXNet
    (DenseNet-121), which would take seconds per step on a CPU and hide the pipeline."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((image_size, image_size, 3)),
        keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
        keras.layers.Conv2D(64, 3, strides=2, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(NUM_CLASSES, activation="sigmoid"),
    ], name="probe_cnn")
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy")
    return model


_probe_model = probe_model  # the name used before it became public


def train_step_fn(model: keras.Model) -> Callable[[Any], Any]:
    """``step(batch)``: one optimisation step of a compiled Keras model on ``(x, y, ...)``.

    Uses ``model.train_on_batch``, which runs the model's compiled ``train_step`` (a
    ``tf.function``; a custom ``train_step`` - e.g. one that averages gradients with Horovod -
    is honoured) and returns the loss as a host value, i.e. only after the step finished.
    """
    def step(batch: Any) -> Any:
        return model.train_on_batch(batch[0], batch[1])

    return step


@dataclass
class TrainingResult:
    """Training throughput fed by a pipeline vs fed a constant in-memory batch."""

    real_img_per_s: float
    """Training steps fed by the pipeline (input + compute, as in real training)."""
    synthetic_img_per_s: float
    """The same steps on one constant batch: the accelerator's own speed."""
    idle_fraction: float
    """``max(0, 1 - real / synthetic)``: share of the time the accelerator waits for data."""
    n_steps: int
    batch_size: int
    real_seconds: float
    synthetic_seconds: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _synthetic_rate(step: Callable[[Any], Any], batch: Any, n_steps: int) -> tuple[float, float]:
    _block(step(batch))  # same shapes as the timed steps: no retracing below
    t0 = time.perf_counter()
    for _ in range(n_steps):
        _block(step(batch))
    seconds = time.perf_counter() - t0
    return n_steps * _batch_len(batch) / seconds, seconds


def time_training(model: keras.Model, dataset: tf.data.Dataset, n_steps: int = 10,
                  warmup: int = 2, synthetic_img_per_s: float | None = None) -> TrainingResult:
    """Training images/s fed by ``dataset`` vs fed a constant batch, and the idle fraction.

    ``model`` is any compiled Keras model with 14 sigmoid outputs; ``dataset`` yields
    ``(image, label, ...)`` batches and must be long enough (repeat it). Order of work:

    1. one batch is taken from ``dataset`` (its iterator is then deleted);
    2. unless ``synthetic_img_per_s`` is given, ``n_steps`` steps on that constant batch are
       timed after one untimed step (tracing): no input pipeline at all, the accelerator's
       own speed (on a GPU a constant batch stays in device memory; the
       ``tf.data.Dataset.from_tensors(batch).repeat()`` idiom measures the same);
    3. a fresh iterator feeds ``warmup`` untimed steps, then ``n_steps`` timed steps, each
       pulling its batch from the pipeline.

    Pass ``synthetic_img_per_s`` to compare several pipelines against one measurement of
    the model. The two phases never overlap, so no background prefetching leaks into the
    other's timing.
    """
    if n_steps < 1 or warmup < 0:
        raise ValueError("n_steps must be >= 1, warmup >= 0")
    step = train_step_fn(model)
    it = iter(dataset)
    first = _next_or_none(it)
    del it
    if first is None:
        raise ValueError("the dataset is empty")
    batch = (first[0], first[1])
    synth_seconds = None
    if synthetic_img_per_s is None:
        synthetic_img_per_s, synth_seconds = _synthetic_rate(step, batch, n_steps)

    it = iter(dataset)
    for _ in range(warmup):
        b = _next_or_none(it)
        if b is None:
            raise ValueError("the dataset ran out during the warm-up; repeat it")
        _block(step(b))
    images = 0
    t0 = time.perf_counter()
    for _ in range(n_steps):
        b = _next_or_none(it)
        if b is None:
            break
        _block(step(b))
        images += _batch_len(b)
    seconds = time.perf_counter() - t0
    del it
    if images == 0:
        raise ValueError("the dataset ran out before the timed steps; repeat it")
    real = images / seconds
    idle = min(1.0, max(0.0, 1.0 - real / synthetic_img_per_s))
    return TrainingResult(real_img_per_s=real, synthetic_img_per_s=synthetic_img_per_s,
                          idle_fraction=idle, n_steps=n_steps, batch_size=_batch_len(batch),
                          real_seconds=seconds, synthetic_seconds=synth_seconds)


@dataclass
class FedTrainingResult:
    """One pipeline, three speeds measured side by side (one value per run each)."""

    pipeline_img_per_s: list[float]
    """The pipeline alone, nothing consuming its batches (as :func:`time_pipeline`)."""
    fed_img_per_s: list[float]
    """Training steps fed by the pipeline (as :func:`time_training`)."""
    in_memory_img_per_s: list[float]
    """The same training steps on one constant in-memory batch: the model's own speed."""
    n_steps: int
    batch_size: int

    @property
    def pipeline(self) -> float:
        return _mean_std(self.pipeline_img_per_s)[0]

    @property
    def fed(self) -> float:
        return _mean_std(self.fed_img_per_s)[0]

    @property
    def in_memory(self) -> float:
        return _mean_std(self.in_memory_img_per_s)[0]

    @property
    def idle_fraction(self) -> float:
        """``1 - fed / in-memory`` (clipped to [0, 1]), as in :class:`TrainingResult`."""
        return min(1.0, max(0.0, 1.0 - self.fed / self.in_memory)) if self.in_memory else 0.0

    @property
    def pipelined_bound(self) -> float:
        """``min(pipeline, in-memory)``: fed training if input and model overlapped perfectly
        on *separate* hardware (a step costs the max of the two halves)."""
        return min(self.pipeline, self.in_memory)

    @property
    def sequential_bound(self) -> float:
        """``1 / (1/pipeline + 1/in-memory)``: fed training if the two halves ran one after
        the other on separate hardware (a step costs the sum)."""
        if self.pipeline <= 0 or self.in_memory <= 0:
            return 0.0
        return 1.0 / (1.0 / self.pipeline + 1.0 / self.in_memory)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(pipeline=self.pipeline, fed=self.fed, in_memory=self.in_memory,
                 idle_fraction=self.idle_fraction, pipelined_bound=self.pipelined_bound,
                 sequential_bound=self.sequential_bound)
        return d


def compare_training(model: keras.Model, datasets: Mapping[str, tf.data.Dataset],
                     n_steps: int = 10, warmup: int = 2, repeats: int = 3,
                     progress: bool = False) -> dict[str, FedTrainingResult]:
    """For each pipeline: its speed alone, training fed by it, and the model on an in-memory
    batch - all measured in the same alternating runs, so the three can be compared.

    Why alternate: on a shared or CPU-only machine the speed of everything drifts with the
    load. Comparing a pipeline measured a minute ago with training measured now mixes that
    drift into the answer. Here each run measures, for one pipeline after the other (order
    A B, B A, ... as :func:`compare_pipelines`): the pipeline alone (fresh iterator,
    ``warmup`` untimed batches, ``n_steps`` timed), then ``n_steps`` training steps fed by a
    fresh iterator after ``warmup`` untimed steps (as :func:`time_training`), then
    ``n_steps`` steps on that pipeline's first batch held in memory.

    ``model`` is a compiled Keras model (see :func:`probe_model`); every dataset must
    repeat. ``progress=True`` shows a progress bar (one tick per pipeline and run).
    """
    if n_steps < 1 or repeats < 1 or warmup < 0:
        raise ValueError("n_steps and repeats must be >= 1, warmup >= 0")
    from tqdm.auto import tqdm

    step = train_step_fn(model)
    constant: dict[str, Any] = {}
    for name, ds in datasets.items():
        it = iter(ds)
        first = _next_or_none(it)
        del it
        if first is None:
            raise ValueError(f"{name}: the dataset is empty")
        constant[name] = (first[0], first[1])
    runs: dict[str, dict[str, list[float]]] = {
        name: {"pipeline": [], "fed": [], "in_memory": []} for name in datasets}
    order = list(datasets)
    schedule = [name for r in range(repeats) for name in (order if r % 2 == 0 else order[::-1])]
    with tqdm(schedule, desc="training runs", unit="run", disable=not progress,
              dynamic_ncols=True) as bar:
        for name in bar:
            ds = datasets[name]
            # the pipeline alone
            it = iter(ds)
            _warm_up(it, warmup)
            images, seconds = _timed_run(it, n_steps)
            del it
            if images == 0:
                raise ValueError(f"{name}: the dataset ran out; repeat it")
            runs[name]["pipeline"].append(images / seconds)
            # training fed by it
            it = iter(ds)
            for _ in range(warmup):
                b = _next_or_none(it)
                if b is None:
                    raise ValueError(f"{name}: the dataset ran out during the warm-up")
                _block(step(b))
            images = 0
            t0 = time.perf_counter()
            for _ in range(n_steps):
                b = _next_or_none(it)
                if b is None:
                    break
                _block(step(b))
                images += _batch_len(b)
            seconds = time.perf_counter() - t0
            del it
            runs[name]["fed"].append(images / seconds)
            # the model alone
            runs[name]["in_memory"].append(_synthetic_rate(step, constant[name], n_steps)[0])
    return {name: FedTrainingResult(pipeline_img_per_s=r["pipeline"], fed_img_per_s=r["fed"],
                                    in_memory_img_per_s=r["in_memory"], n_steps=n_steps,
                                    batch_size=_batch_len(constant[name]))
            for name, r in runs.items()}


# --------------------------------------------------------------------------------------------
# Timelines: when does the accelerator wait?
# --------------------------------------------------------------------------------------------

@dataclass
class Timeline:
    """Per training step: when its batch was requested, ready, and the step done.

    Times are seconds since the first recorded request. ``wait`` = ready - request (the
    accelerator idles, waiting for data); ``compute`` = done - ready (the step itself).
    """

    t_request: list[float] = field(default_factory=list)
    t_batch_ready: list[float] = field(default_factory=list)
    t_step_done: list[float] = field(default_factory=list)
    label: str = ""

    @property
    def wait_s(self) -> list[float]:
        return [r - q for q, r in zip(self.t_request, self.t_batch_ready)]

    @property
    def compute_s(self) -> list[float]:
        return [d - r for r, d in zip(self.t_batch_ready, self.t_step_done)]

    @property
    def total_s(self) -> float:
        return self.t_step_done[-1] if self.t_step_done else 0.0

    @property
    def step_s(self) -> float:
        """Mean wall time per step."""
        return self.total_s / len(self.t_step_done) if self.t_step_done else 0.0

    @property
    def wait_fraction(self) -> float:
        """Share of the wall time spent waiting for data."""
        return sum(self.wait_s) / self.total_s if self.total_s > 0 else 0.0

    def segments(self) -> dict[str, list[tuple[float, float]]]:
        """``{"wait": [(start, duration), ...], "compute": [...]}`` for matplotlib's
        ``broken_barh``."""
        return {"wait": [(q, r - q) for q, r in zip(self.t_request, self.t_batch_ready)],
                "compute": [(r, d - r) for r, d in zip(self.t_batch_ready, self.t_step_done)]}

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(wait_fraction=self.wait_fraction, step_s=self.step_s, total_s=self.total_s)
        return d

    def plot(self, ax: Any = None, y: float = 0.0, height: float = 0.8) -> Any:
        """Draw the bars (red: waiting for data, green: computing) on ``ax``; returns ax."""
        if ax is None:
            import matplotlib.pyplot as plt

            ax = plt.gca()
        seg = self.segments()
        ax.broken_barh(seg["wait"], (y, height), color="tab:red", label="waiting for data")
        ax.broken_barh(seg["compute"], (y, height), color="tab:green", label="computing")
        return ax


def record_timeline(dataset: tf.data.Dataset | Any, step_fn: Callable[[Any], Any],
                    n_steps: int, warmup: int = 1, label: str = "") -> Timeline:
    """Run ``n_steps`` of ``step_fn(batch)`` fed by ``dataset`` and record each step's
    (t_request, t_batch_ready, t_step_done).

    ``warmup`` steps run first, unrecorded (tracing). ``step_fn`` may return tensors: the
    recorder waits for them (fetches them to the host) before stamping "done", so a step is
    not counted as finished while the device still works on it. Any iterable works as
    ``dataset``.
    """
    it = iter(dataset)
    for _ in range(warmup):
        batch = _next_or_none(it)
        if batch is None:
            raise ValueError("the dataset ran out during the warm-up; repeat it")
        _block(step_fn(batch))
    tl = Timeline(label=label)
    t0 = time.perf_counter()
    for _ in range(n_steps):
        t_req = time.perf_counter()
        batch = _next_or_none(it)
        if batch is None:
            break
        t_ready = time.perf_counter()
        _block(step_fn(batch))
        t_done = time.perf_counter()
        tl.t_request.append(t_req - t0)
        tl.t_batch_ready.append(t_ready - t0)
        tl.t_step_done.append(t_done - t0)
    del it
    return tl


def simulate_timeline(cpu_ms: float, accel_ms: float, n_steps: int = 8,
                      pipelined: bool = True) -> Timeline:
    """A training loop with fake work: the input pipeline "prepares" each batch for
    ``cpu_ms`` and the "accelerator" computes for ``accel_ms`` (both sleep).

    ``pipelined=False``: a tf.data pipeline without prefetch (TF's automatic prefetch
    injection switched off), so the batch is made only when asked for - a step costs
    ``cpu_ms + accel_ms``. ``pipelined=True``: ``.prefetch(1)`` makes the next batch in a
    background thread while the current step runs - a step costs ``max(cpu_ms, accel_ms)``.
    Sleeping instead of computing keeps the picture clean on any number of cores.
    """
    import tensorflow as tf

    def produce(i):  # type: ignore[no-untyped-def]
        time.sleep(cpu_ms / 1000.0)
        return i

    ds = tf.data.Dataset.range(n_steps + 1).map(
        lambda i: tf.py_function(produce, [i], tf.int64))
    if pipelined:
        ds = ds.prefetch(1)
    opts = tf.data.Options()
    opts.experimental_optimization.inject_prefetch = False
    opts.experimental_optimization.map_parallelization = False
    ds = ds.with_options(opts)

    def step(_batch: Any) -> None:
        time.sleep(accel_ms / 1000.0)

    return record_timeline(ds, step, n_steps, warmup=1,
                           label="pipelined (prefetch)" if pipelined else "sequential")


# --------------------------------------------------------------------------------------------
# Horovod workers, simulated on one machine
# --------------------------------------------------------------------------------------------

def simulated_workers(files: Files, approach: str | PipelineOptions, num_workers: int,
                      batch_size: int = 16, image_size: int = 224, n_batches: int = 10,
                      warmup_batches: int = 2, repeats: int = 1, **kwargs: Any
                      ) -> dict[str, Any]:
    """Useful throughput of ``num_workers`` Horovod workers, from worker 0's pipeline.

    Builds the training pipeline of worker 0 of ``num_workers`` (``approach``: ``"old"``,
    ``"new"`` or :class:`PipelineOptions`) and times the images it delivers: its *useful*
    rate, since images decoded for nothing (the old approach decodes every record and keeps
    one in N) are never delivered. Returns ``per_worker_img_per_s`` and
    ``aggregate_img_per_s = per_worker x num_workers``.

    **Assumption**: the workers run on N separate machines, each like this one, with storage
    that is not the bottleneck; so the N workers do not compete and the aggregate is N times
    one worker's rate. On one machine they would share its cores. Under that assumption the
    old approach stays flat (each worker still decodes everything: per-worker rate ~1/N) and
    the new approach grows ~N-fold (each worker decodes only its own files). ``kwargs`` go to
    the pipeline builder (e.g. ``shuffle_buffer``, ``seed``).
    """
    ds = build_pipeline(approach, files, batch_size, image_size, training=True,
                        num_workers=num_workers, worker_index=0, **kwargs)
    res = time_pipeline(ds, n_batches, warmup_batches, repeats)
    name = approach if isinstance(approach, str) else "options"
    return {"approach": name, "num_workers": num_workers,
            "per_worker_img_per_s": res.mean, "per_worker_std": res.std,
            "aggregate_img_per_s": res.mean * num_workers,
            "assumption": "one worker per machine; aggregate = per-worker rate x workers"}


def accel_wait_fraction(dataset: tf.data.Dataset, accelerator_ms: float, n_steps: int = 20,
                        warmup: int = 2) -> float:
    """Share of an emulated accelerator's time spent waiting for data (the articles' idle
    GPU): each step "computes" by sleeping ``accelerator_ms`` (no CPU used, so the pipeline
    keeps every core, as on a GPU host), fed by ``dataset``; the result is
    :attr:`Timeline.wait_fraction` of :func:`record_timeline`."""
    if accelerator_ms <= 0:
        raise ValueError(f"accelerator_ms must be > 0, got {accelerator_ms}")

    def step(_batch: Any) -> None:
        time.sleep(accelerator_ms / 1000.0)

    return record_timeline(dataset, step, n_steps, warmup=warmup).wait_fraction


def records_per_file(files: Files) -> list[int]:
    """Number of records in each TFRecord file (read by TensorFlow, nothing decoded)."""
    import tensorflow as tf

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


# --------------------------------------------------------------------------------------------
# The whole comparison
# --------------------------------------------------------------------------------------------

def bench_pipelines(tfrecords_dir: Path | str, image_size: int = 224, batch_size: int = 16,
                    n_batches: int = 20, split: str = "train", repeats: int = 3,
                    warmup_batches: int = 2, shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
                    ceiling_images: int = 64, train_steps: int = 10, seed: int | None = 0,
                    model_fn: Callable[[int], keras.Model] | None = None,
                    log: Callable[[str], None] | None = None,
                    emulate_accelerator_ms: float | None = None) -> dict[str, Any]:
    """Old vs new approach on one split of converted TFRecords, in one run.

    Measures (training mode, one worker): the images/s of both pipelines with their runs
    alternating (:func:`compare_pipelines`), the :func:`decode_ceiling`, and the idle
    fraction of a training step fed by each (:func:`time_training` against one
    constant-batch measurement of the model). ``model_fn(image_size)`` builds the compiled
    model for the idle fractions (default: a small probe CNN; CheXNet itself is far too slow
    on a CPU).

    Returns a JSON-ready dict with ``old_img_per_s``, ``new_img_per_s`` (means),
    ``*_std``, ``*_runs``, ``decode_ceiling_img_per_s``, ``decode_img_per_s_single_core``,
    ``new_over_old``, ``new_over_ceiling``, ``idle_fraction_old``, ``idle_fraction_new``,
    ``train_*_img_per_s``, ``cores``, and the parameters. With ``emulate_accelerator_ms``
    also ``accel_wait_fraction_old`` / ``_new`` (:func:`accel_wait_fraction`, ``n_batches``
    steps of an accelerator taking that many ms per batch).
    """
    import tensorflow as tf

    from chexnet_utils.tfrecords import list_shards

    say = log or (lambda _msg: None)
    files = list_shards(tfrecords_dir, split)
    if not files:
        raise ValueError(f"{tfrecords_dir}: no {split} shards (convert with `python -m "
                         f"chexnet_utils tfrecords` first)")
    common = dict(training=True, shuffle_buffer=shuffle_buffer, seed=seed)
    pipelines = {
        "old": old_approach(files, batch_size, image_size, **common),
        "new": new_approach(files, batch_size, image_size, **common),
    }
    say(f"timing the old and new pipelines ({repeats} alternating runs of {n_batches} "
        f"batches each)")
    t = compare_pipelines(pipelines, n_batches, warmup_batches, repeats)
    say("measuring the single-core decode rate")
    ceiling = decode_ceiling(files, image_size, n_images=ceiling_images)
    say("timing training steps fed by each pipeline")
    model = (model_fn or probe_model)(image_size)
    step = train_step_fn(model)
    first = next(iter(pipelines["new"]))
    synth, _ = _synthetic_rate(step, (first[0], first[1]), train_steps)
    train = {name: time_training(model, ds, train_steps, warmup=warmup_batches,
                                 synthetic_img_per_s=synth)
             for name, ds in pipelines.items()}

    accel: dict[str, Any] = {}
    if emulate_accelerator_ms is not None:
        say(f"feeding an emulated accelerator ({emulate_accelerator_ms:g} ms per batch)")
        accel = {f"accel_wait_fraction_{name}": accel_wait_fraction(
                     ds, emulate_accelerator_ms, n_batches, warmup_batches)
                 for name, ds in pipelines.items()}
        accel["emulate_accelerator_ms"] = emulate_accelerator_ms

    old, new = t["old"].mean, t["new"].mean
    ceil = ceiling["ceiling_img_per_s"]
    return {**accel,
        "old_img_per_s": old, "old_img_per_s_std": t["old"].std,
        "old_img_per_s_runs": t["old"].images_per_s,
        "new_img_per_s": new, "new_img_per_s_std": t["new"].std,
        "new_img_per_s_runs": t["new"].images_per_s,
        "decode_ceiling_img_per_s": ceil,
        "decode_img_per_s_single_core": ceiling["img_per_s_single_core"],
        "new_over_old": new / old if old > 0 else math.nan,
        "new_over_ceiling": new / ceil if ceil > 0 else math.nan,
        "idle_fraction_old": train["old"].idle_fraction,
        "idle_fraction_new": train["new"].idle_fraction,
        "train_old_img_per_s": train["old"].real_img_per_s,
        "train_new_img_per_s": train["new"].real_img_per_s,
        "train_synthetic_img_per_s": synth,
        "probe_model": model.name,
        "cores": available_cores(),
        # parameters
        "tfrecords_dir": str(tfrecords_dir), "split": split, "n_files": len(files),
        "image_size": image_size, "batch_size": batch_size, "n_batches": n_batches,
        "repeats": repeats, "warmup_batches": warmup_batches,
        "shuffle_buffer": shuffle_buffer, "ceiling_images": ceiling["n_images"],
        "train_steps": train_steps, "seed": seed,
        "new_options": PipelineOptions().describe(),
        "tensorflow": tf.__version__,
    }


def format_bench(r: Mapping[str, Any]) -> str:
    """The result of :func:`bench_pipelines` as a small readable table."""
    def runs(key: str) -> str:
        return ", ".join(f"{v:.1f}" for v in r.get(key, []))

    lines = [
        f"{r['split']} shards: {r['n_files']} file(s) in {r['tfrecords_dir']}; "
        f"{r['image_size']} px, batch {r['batch_size']}, {r['cores']} core(s)",
        "",
        f"{'':<26}{'images/s':>10}",
        f"{'old approach':<26}{r['old_img_per_s']:>10.1f} ± {r['old_img_per_s_std']:.1f}"
        f"   runs: {runs('old_img_per_s_runs')}",
        f"{'new approach':<26}{r['new_img_per_s']:>10.1f} ± {r['new_img_per_s_std']:.1f}"
        f"   runs: {runs('new_img_per_s_runs')}",
        f"{'decode ceiling':<26}{r['decode_ceiling_img_per_s']:>10.1f}"
        f"   ({r['decode_img_per_s_single_core']:.1f}/core x {r['cores']})",
        f"{'new / old':<26}{r['new_over_old']:>10.2f}x",
        f"{'new / ceiling':<26}{r['new_over_ceiling']:>10.2f}",
        "",
        f"training ({r['probe_model']}, {r['train_synthetic_img_per_s']:.1f} images/s on a "
        f"constant batch):",
        f"{'  fed by old approach':<26}{r['train_old_img_per_s']:>10.1f}"
        f"   idle {r['idle_fraction_old']:.0%}",
        f"{'  fed by new approach':<26}{r['train_new_img_per_s']:>10.1f}"
        f"   idle {r['idle_fraction_new']:.0%}",
    ]
    return "\n".join(lines)
