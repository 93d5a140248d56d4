"""How much of a training step is spent waiting for data? (the idle fraction)

The training measurements of :mod:`chexnet_utils.bench.benchmark` (notebooks 02 and 03 reach them
as ``benchmark.X``):

:func:`probe_model` / :func:`train_step_fn`
    A small CPU-sized CNN standing in for CheXNet, and one compiled optimisation step of it.
:func:`time_training`
    The same training step fed by the pipeline and fed a constant in-memory batch (the
    accelerator's own speed); ``idle_fraction = 1 - real / synthetic``
    (:class:`TrainingResult`).
:func:`compare_training`
    The same for several pipelines at once, with each pipeline's speed *alone* measured in
    the same alternating runs (:class:`FedTrainingResult`): is fed training as fast as
    ``min(pipeline, model)``, or do input and model compete for the cores?

On a CPU-only machine the "accelerator" is the same CPU cores, so idle fractions measured
there mix waiting with contention.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from chexnet_utils.data.labels import NUM_CLASSES
from chexnet_utils.platform.lazy import lazy_module
from chexnet_utils.platform.timing import (
    RunMean,
    alternating,
    batch_len,
    block,
    fed_run,
    first_batch,
    idle_fraction,
    pipeline_run,
)
from chexnet_utils.training.dataparallel import Recipe

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

# Keras: imported on first use (chexnet_utils.platform.lazy)
if not TYPE_CHECKING:
    keras = lazy_module("keras")

__all__ = ["FedTrainingResult", "TrainingResult", "compare_training", "probe_model",
           "synthetic_rate", "time_training", "train_step_fn"]


# --------------------------------------------------------------------------------------------
# Training steps: how long does the accelerator wait?
# --------------------------------------------------------------------------------------------

def probe_model(image_size: int, seed: int = 0) -> keras.Model:
    """A small CPU-sized CNN for measuring idle time: 3 strided convolutions, global
    pooling, 14 sigmoid outputs, binary cross-entropy, Adam. Stands in for CheXNet
    (DenseNet-121), which would take seconds per step on a CPU and hide the pipeline."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((image_size, image_size, 3)),
        keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
        keras.layers.Conv2D(64, 3, strides=2, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(NUM_CLASSES, activation="sigmoid"),
    ], name="probe_cnn")
    Recipe().compile(model, "binary_crossentropy", size=1)  # train()'s Adam, one worker
    return model


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


def synthetic_rate(step: Callable[[Any], Any], batch: Any, n_steps: int) -> tuple[float, float]:
    """(images/s, seconds) of ``n_steps`` calls of ``step`` on one constant ``batch``, after
    one untimed call: the model's own speed, no input pipeline at all."""
    block(step(batch))  # same shapes as the timed steps: no retracing below
    t0 = time.perf_counter()
    for _ in range(n_steps):
        block(step(batch))
    seconds = time.perf_counter() - t0
    return n_steps * batch_len(batch) / seconds, seconds


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
    batch = first_batch(dataset)
    synth_seconds = None
    if synthetic_img_per_s is None:
        synthetic_img_per_s, synth_seconds = synthetic_rate(step, batch, n_steps)

    images, seconds = fed_run(step, dataset, n_steps, warmup)
    if images == 0:
        raise ValueError("the dataset ran out before the timed steps; repeat it")
    real = images / seconds
    idle = idle_fraction(real, synthetic_img_per_s)
    return TrainingResult(real_img_per_s=real, synthetic_img_per_s=synthetic_img_per_s,
                          idle_fraction=idle, n_steps=n_steps, batch_size=batch_len(batch),
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

    pipeline = RunMean("pipeline_img_per_s", "Mean images/s of the pipeline alone.")
    fed = RunMean("fed_img_per_s", "Mean images/s of training fed by the pipeline.")
    in_memory = RunMean("in_memory_img_per_s",
                        "Mean images/s of training on the in-memory batch.")

    @property
    def idle_fraction(self) -> float:
        """``1 - fed / in-memory`` (clipped to [0, 1]; NaN without an in-memory rate), as in
        :class:`TrainingResult` (:func:`~chexnet_utils.platform.timing.idle_fraction`)."""
        return idle_fraction(self.fed, self.in_memory)

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
    constant = {name: first_batch(ds, f"{name}: the dataset") for name, ds in datasets.items()}
    runs: dict[str, dict[str, list[float]]] = {
        name: {"pipeline": [], "fed": [], "in_memory": []} for name in datasets}
    with tqdm(alternating(datasets, repeats), desc="training runs", unit="run",
              disable=not progress, dynamic_ncols=True) as bar:
        for name in bar:
            ds = datasets[name]
            # the pipeline alone
            images, seconds = pipeline_run(ds, n_steps, warmup)
            if images == 0:
                raise ValueError(f"{name}: the dataset ran out; repeat it")
            runs[name]["pipeline"].append(images / seconds)
            # training fed by it
            images, seconds = fed_run(step, ds, n_steps, warmup, f"{name}: the dataset")
            runs[name]["fed"].append(images / seconds)
            # the model alone
            runs[name]["in_memory"].append(synthetic_rate(step, constant[name], n_steps)[0])
    return {name: FedTrainingResult(pipeline_img_per_s=r["pipeline"], fed_img_per_s=r["fed"],
                                    in_memory_img_per_s=r["in_memory"], n_steps=n_steps,
                                    batch_size=batch_len(constant[name]))
            for name, r in runs.items()}

