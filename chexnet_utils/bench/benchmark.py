"""Measure input pipelines: images/s, the decode ceiling, idle accelerator time, timelines.

The notebooks' one name for these measurements (``from chexnet_utils.bench import benchmark`` then
``benchmark.compare_pipelines(...)``); the code lives in one module per concern:
:mod:`chexnet_utils.bench.throughput` (pipelines alone: images/s, ceiling, workers, shard
counts), :mod:`chexnet_utils.bench.idle` (training fed by a pipeline: idle fractions),
:mod:`chexnet_utils.bench.timeline` (per-step timelines) and
:mod:`chexnet_utils.platform.timing` (the stopwatch they share); :func:`bench_pipelines`,
all of them in one run, and its result :class:`PipelinesResult` (``print(result)``: the
table) are ``bench pipelines``' module, :mod:`chexnet_utils.bench.pipelines`.

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
:func:`record_timeline`
    *When* does the accelerator wait? Per step: when the batch was requested, when it was
    ready, when the step finished - the "waiting for data" vs "computing" bars of the
    articles' figures (notebook 02 also feeds it a pipeline of sleeps, to show the
    sum-vs-max effect of pipelining without noise).
:func:`shard_counts`
    How many images does each of N workers decode, and how many does it keep? (exact
    counts, no timing: the shard-after-decode trap in numbers)
:func:`bench_pipelines`
    All of the above for every registered pipeline in one run (:class:`PipelinesResult`):
    the JSON behind ``python -m chexnet_utils bench pipelines``.

On a CPU-only machine the "accelerator" is the same CPU cores: a training step and the input
pipeline compete for them, so idle fractions measured there mix waiting with contention. The
pipeline numbers themselves (images/s, ceiling) are what a GPU node's CPU would deliver.

Measuring on a shared, noisy machine: every rate is the mean over ``repeats`` runs with its
standard deviation, warm-up batches (tracing, filling shuffle buffers, starting threads) are
never timed, and :func:`compare_pipelines` alternates the pipelines run by run so that a
burst of load from elsewhere hurts both alike.
"""

from __future__ import annotations

from chexnet_utils.bench.idle import (
    FedTrainingResult,
    TrainingResult,
    compare_training,
    probe_model,
    time_training,
    train_step_fn,
)
from chexnet_utils.bench.pipelines import PipelinesResult, bench_pipelines
from chexnet_utils.bench.throughput import (
    DecodeCeiling,
    ThroughputResult,
    compare_pipelines,
    decode_ceiling,
    records_per_file,
    shard_counts,
    time_pipeline,
)
from chexnet_utils.bench.timeline import (
    Timeline,
    accel_wait_fraction,
    record_timeline,
)
from chexnet_utils.hardware.devices import usable_cores

__all__ = [
    "DecodeCeiling",
    "FedTrainingResult",
    "PipelinesResult",
    "accel_wait_fraction",
    "ThroughputResult",
    "Timeline",
    "TrainingResult",
    "available_cores",
    "bench_pipelines",
    "compare_pipelines",
    "compare_training",
    "decode_ceiling",
    "probe_model",
    "record_timeline",
    "records_per_file",
    "shard_counts",
    "time_pipeline",
    "time_training",
    "train_step_fn",
]

available_cores = usable_cores
"""Cores this process may run on: :func:`chexnet_utils.hardware.devices.usable_cores` (the
notebooks' ``benchmark.available_cores()``)."""
