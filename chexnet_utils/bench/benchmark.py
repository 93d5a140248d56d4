"""Measure input pipelines: images/s, the decode ceiling, idle accelerator time, timelines.

The notebooks' one name for these measurements (``from chexnet_utils.bench import benchmark`` then
``benchmark.compare_pipelines(...)``); the code lives in one module per concern:
:mod:`chexnet_utils.bench.bench_pipeline` (pipelines alone: images/s, ceiling, workers, shard
counts), :mod:`chexnet_utils.bench.bench_training` (training fed by a pipeline: idle fractions),
:mod:`chexnet_utils.bench.bench_timeline` (per-step timelines) and
:mod:`chexnet_utils.platform.timing` (the stopwatch they share). Defined here is only
:func:`bench_pipelines`, all of them in one run, and its result :class:`PipelinesResult`
(``print(result)``: the table).

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
    All of the above for the old and the new approach in one run (:class:`PipelinesResult`):
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

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chexnet_utils.bench.bench_pipeline import (
    DecodeCeiling,
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
from chexnet_utils.platform.timing import RunMean, first_batch, idle_fraction, mean_std, ratio

if TYPE_CHECKING:
    import keras

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


# --------------------------------------------------------------------------------------------
# The whole comparison
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PipelinesResult:
    """Old vs new approach on one split of TFRecords, one worker (:func:`bench_pipelines`).

    Rates are images/s. ``as_dict()`` is the JSON of ``bench pipelines --json`` (fields and
    derived figures, the keys of the former dict; the ``accel_wait_fraction_*`` keys only
    with an emulated accelerator); ``str(result)`` the table.
    """

    old_img_per_s_runs: list[float]
    """The old approach alone, nothing consuming its batches: images/s of each run."""
    new_img_per_s_runs: list[float]
    """The new approach alone, images/s of each run (alternating with the old one's)."""
    decode_img_per_s_single_core: float
    """One core's parse + decode + preprocess rate, images/s
    (:attr:`DecodeCeiling.img_per_s_single_core`)."""
    cores: int
    """Cores this process may use: the ceiling is the single-core rate times these."""
    train_old_img_per_s: float
    """Training steps of the probe model fed by the old approach, images/s."""
    train_new_img_per_s: float
    """The same fed by the new approach, images/s."""
    train_synthetic_img_per_s: float
    """The same steps on one constant in-memory batch (the model's own speed), images/s."""
    probe_model: str
    """Name of the model trained for the idle fractions."""
    tfrecords_dir: str
    """Folder of the TFRecord shards."""
    split: str
    """Split of the shards read."""
    n_files: int
    """Shards of ``split``."""
    image_size: int
    """Model input, pixels per side."""
    batch_size: int
    """Images per batch."""
    n_batches: int
    """Timed batches per pipeline run (and emulated accelerator steps)."""
    repeats: int
    """Runs per pipeline."""
    warmup_batches: int
    """Untimed batches before each run (and training steps before the timed ones)."""
    shuffle_buffer: int
    """Shuffle buffer of both pipelines, in elements (see ``DEFAULT_SHUFFLE_BUFFER``)."""
    ceiling_images: int
    """Records decoded in each pass of the ceiling (:attr:`DecodeCeiling.n_images`)."""
    train_steps: int
    """Timed training steps per pipeline."""
    seed: int | None
    """Shuffling seed of both pipelines."""
    new_cycle_length: int
    """Files the new approach reads at once (``DEFAULT_CYCLE_LENGTH``)."""
    tensorflow: str
    """TensorFlow version."""
    accel_wait_fraction_old: float | None = None
    """Share of an emulated accelerator's time spent waiting for the old approach
    (:func:`accel_wait_fraction`); ``None`` without ``emulate_accelerator_ms``."""
    accel_wait_fraction_new: float | None = None
    """The same for the new approach."""
    emulate_accelerator_ms: float | None = None
    """Milliseconds per batch of the emulated accelerator, or ``None`` (not emulated)."""

    old_img_per_s = RunMean("old_img_per_s_runs", "Mean images/s of the old approach.")
    new_img_per_s = RunMean("new_img_per_s_runs", "Mean images/s of the new approach.")

    @property
    def old_img_per_s_std(self) -> float:
        """Sample standard deviation of the old approach's runs, images/s (0 for one run)."""
        return mean_std(self.old_img_per_s_runs)[1]

    @property
    def new_img_per_s_std(self) -> float:
        """Sample standard deviation of the new approach's runs, images/s (0 for one run)."""
        return mean_std(self.new_img_per_s_runs)[1]

    @property
    def decode_ceiling_img_per_s(self) -> float:
        """``decode_img_per_s_single_core x cores``: no pipeline here beats it, images/s."""
        return self.decode_img_per_s_single_core * self.cores

    @property
    def new_over_old(self) -> float:
        """New / old images/s (NaN when the old rate is 0)."""
        return ratio(self.new_img_per_s, self.old_img_per_s)

    @property
    def new_over_ceiling(self) -> float:
        """New images/s / the decode ceiling (NaN when the ceiling is 0)."""
        return ratio(self.new_img_per_s, self.decode_ceiling_img_per_s)

    @property
    def idle_fraction_old(self) -> float:
        """``1 - train_old / train_synthetic`` in [0, 1]: share of the step spent waiting for
        the old approach."""
        return idle_fraction(self.train_old_img_per_s, self.train_synthetic_img_per_s)

    @property
    def idle_fraction_new(self) -> float:
        """The same for the new approach."""
        return idle_fraction(self.train_new_img_per_s, self.train_synthetic_img_per_s)

    def as_dict(self) -> dict[str, Any]:
        """The fields and the derived figures: the JSON of ``bench pipelines --json``."""
        d = {**asdict(self), **{name: getattr(self, name) for name in (
            "old_img_per_s", "old_img_per_s_std", "new_img_per_s", "new_img_per_s_std",
            "decode_ceiling_img_per_s", "new_over_old", "new_over_ceiling",
            "idle_fraction_old", "idle_fraction_new")}}
        if self.emulate_accelerator_ms is None:
            for key in ("accel_wait_fraction_old", "accel_wait_fraction_new",
                        "emulate_accelerator_ms"):
                del d[key]
        return d

    def __str__(self) -> str:
        """The rates, the ceiling and the idle fractions as a small readable table (and the
        emulated accelerator's waiting, when one was fed)."""
        def runs(values: list[float]) -> str:
            return ", ".join(f"{v:.1f}" for v in values)

        return "\n".join([
            f"{self.split} shards: {self.n_files} file(s) in {self.tfrecords_dir}; "
            f"{self.image_size} px, batch {self.batch_size}, {self.cores} core(s)",
            "",
            f"{'':<26}{'images/s':>10}",
            f"{'old approach':<26}{self.old_img_per_s:>10.1f} ± {self.old_img_per_s_std:.1f}"
            f"   runs: {runs(self.old_img_per_s_runs)}",
            f"{'new approach':<26}{self.new_img_per_s:>10.1f} ± {self.new_img_per_s_std:.1f}"
            f"   runs: {runs(self.new_img_per_s_runs)}",
            f"{'decode ceiling':<26}{self.decode_ceiling_img_per_s:>10.1f}"
            f"   ({self.decode_img_per_s_single_core:.1f}/core x {self.cores})",
            f"{'new / old':<26}{self.new_over_old:>10.2f}x",
            f"{'new / ceiling':<26}{self.new_over_ceiling:>10.2f}",
            "",
            f"training ({self.probe_model}, {self.train_synthetic_img_per_s:.1f} images/s on a "
            f"constant batch):",
            f"{'  fed by old approach':<26}{self.train_old_img_per_s:>10.1f}"
            f"   idle {self.idle_fraction_old:.0%}",
            f"{'  fed by new approach':<26}{self.train_new_img_per_s:>10.1f}"
            f"   idle {self.idle_fraction_new:.0%}",
            *self._accelerator_lines(),
        ])

    def _accelerator_lines(self) -> list[str]:
        """The emulated accelerator's share of time waiting for data, if one was fed."""
        if self.accel_wait_fraction_old is None or self.accel_wait_fraction_new is None:
            return []
        return [f"emulated accelerator ({self.emulate_accelerator_ms:g} ms per batch) waiting "
                f"for data: old {self.accel_wait_fraction_old:.1%}, "
                f"new {self.accel_wait_fraction_new:.1%}"]


def bench_pipelines(tfrecords_dir: Path | str, image_size: int = 224, batch_size: int = 16,
                    n_batches: int = 20, split: str = "train", repeats: int = 3,
                    warmup_batches: int = 2, shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
                    ceiling_images: int = 64, train_steps: int = 10, seed: int | None = 0,
                    model_fn: Callable[[int], keras.Model] | None = None,
                    log: Callable[[str], None] | None = None,
                    emulate_accelerator_ms: float | None = None) -> PipelinesResult:
    """Old vs new approach on one split of converted TFRecords, in one run.

    Measures (training mode, one worker): the images/s of both pipelines with their runs
    alternating (:func:`compare_pipelines`), the :func:`decode_ceiling`, and the idle
    fraction of a training step fed by each (:func:`time_training` against one
    constant-batch measurement of the model). ``model_fn(image_size)`` builds the compiled
    model for the idle fractions (default: a small probe CNN; CheXNet itself is far too slow
    on a CPU).

    Returns a :class:`PipelinesResult` with ``old_img_per_s``, ``new_img_per_s`` (means),
    ``*_std``, ``*_runs``, ``decode_ceiling_img_per_s``, ``decode_img_per_s_single_core``,
    ``new_over_old``, ``new_over_ceiling``, ``idle_fraction_old``, ``idle_fraction_new``,
    ``train_*_img_per_s``, ``cores``, and the parameters. With ``emulate_accelerator_ms``
    also ``accel_wait_fraction_old`` / ``_new`` (:func:`accel_wait_fraction`, ``n_batches``
    steps of an accelerator taking that many ms per batch; ``None`` without).
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

    accel: dict[str, float] = {}
    if emulate_accelerator_ms is not None:
        say(f"feeding an emulated accelerator ({emulate_accelerator_ms:g} ms per batch)")
        accel = {name: accel_wait_fraction(ds, emulate_accelerator_ms, n_batches,
                                           warmup_batches)
                 for name, ds in pipelines.items()}

    return PipelinesResult(
        old_img_per_s_runs=t["old"].images_per_s, new_img_per_s_runs=t["new"].images_per_s,
        decode_img_per_s_single_core=ceiling.img_per_s_single_core, cores=ceiling.cores,
        train_old_img_per_s=train["old"].real_img_per_s,
        train_new_img_per_s=train["new"].real_img_per_s, train_synthetic_img_per_s=synth,
        probe_model=model.name,
        tfrecords_dir=str(tfrecords_dir), split=split, n_files=len(files),
        image_size=image_size, batch_size=batch_size, n_batches=n_batches, repeats=repeats,
        warmup_batches=warmup_batches, shuffle_buffer=shuffle_buffer,
        ceiling_images=ceiling.n_images, train_steps=train_steps, seed=seed,
        new_cycle_length=DEFAULT_CYCLE_LENGTH, tensorflow=tf.__version__,
        accel_wait_fraction_old=accel.get("old"), accel_wait_fraction_new=accel.get("new"),
        emulate_accelerator_ms=emulate_accelerator_ms)
