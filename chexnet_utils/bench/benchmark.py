"""Measure input pipelines: images/s, the decode ceiling, idle accelerator time, timelines.

The notebooks' one name for these measurements (``from chexnet_utils.bench import benchmark`` then
``benchmark.compare_pipelines(...)``); the code lives in one module per concern:
:mod:`chexnet_utils.bench.bench_pipeline` (pipelines alone: images/s, ceiling, workers, shard
counts), :mod:`chexnet_utils.bench.bench_training` (training fed by a pipeline: idle fractions),
:mod:`chexnet_utils.bench.bench_timeline` (per-step timelines) and
:mod:`chexnet_utils.platform.timing` (the stopwatch they share). Defined here is only
:func:`bench_pipelines`, all of them in one run, with :func:`format_bench`.

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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chexnet_utils.bench.bench_pipeline import (
    ThroughputResult,
    compare_pipelines,
    decode_ceiling,
    records_per_file,
    shard_counts,
    time_pipeline,
)
from chexnet_utils.bench.bench_timeline import (
    Timeline,
    accel_wait_fraction,
    record_timeline,
)
from chexnet_utils.bench.bench_training import (
    FedTrainingResult,
    TrainingResult,
    compare_training,
    probe_model,
    synthetic_rate,
    time_training,
    train_step_fn,
)
from chexnet_utils.hardware.devices import usable_cores
from chexnet_utils.input.pipelines import (
    DEFAULT_CYCLE_LENGTH,
    DEFAULT_SHUFFLE_BUFFER,
    new_approach,
    old_approach,
)
from chexnet_utils.platform.timing import first_batch

if TYPE_CHECKING:
    import keras

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
    "time_pipeline",
    "time_training",
    "train_step_fn",
]

available_cores = usable_cores
"""Cores this process may run on: :func:`chexnet_utils.hardware.devices.usable_cores` (the
notebooks' ``benchmark.available_cores()``)."""


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

    from chexnet_utils.data.tfrecords import list_shards

    say = log or (lambda _msg: None)
    files = list_shards(tfrecords_dir, split)
    if not files:
        raise ValueError(f"{tfrecords_dir}: no {split} shards (convert with `python -m "
                         f"chexnet_utils tfrecords` first)")
    common: dict[str, Any] = dict(training=True, shuffle_buffer=shuffle_buffer, seed=seed)
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
    synth, _ = synthetic_rate(step, first_batch(pipelines["new"]), train_steps)
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
        "cores": usable_cores(),
        # parameters
        "tfrecords_dir": str(tfrecords_dir), "split": split, "n_files": len(files),
        "image_size": image_size, "batch_size": batch_size, "n_batches": n_batches,
        "repeats": repeats, "warmup_batches": warmup_batches,
        "shuffle_buffer": shuffle_buffer, "ceiling_images": ceiling["n_images"],
        "train_steps": train_steps, "seed": seed,
        "new_cycle_length": DEFAULT_CYCLE_LENGTH,
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
