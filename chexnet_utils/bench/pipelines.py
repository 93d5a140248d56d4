"""``bench pipelines``: every registered input pipeline on one split of TFRecords, one worker,
in one run (:func:`bench_pipelines`, its result :class:`PipelinesResult`): each pipeline's
images/s alone, the single-core decode ceiling, the idle fraction of a training step fed by
each, and optionally an emulated accelerator's waiting. The pieces it composes are in
:mod:`chexnet_utils.bench.throughput`, :mod:`~chexnet_utils.bench.idle` and
:mod:`~chexnet_utils.bench.timeline`; the notebooks reach all of them through
:mod:`chexnet_utils.bench.benchmark`."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chexnet_utils.bench.idle import (
    probe_model,
    synthetic_rate,
    time_training,
    train_step_fn,
)
from chexnet_utils.bench.registry import BenchCommand
from chexnet_utils.bench.throughput import compare_pipelines, decode_ceiling
from chexnet_utils.bench.timeline import accel_wait_fraction
from chexnet_utils.input.pipelines import (
    DEFAULT_CYCLE_LENGTH,
    DEFAULT_SHUFFLE_BUFFER,
    PIPELINES,
    build_pipeline,
)
from chexnet_utils.platform.lazy import lazy_module
from chexnet_utils.platform.options import Option, option_values
from chexnet_utils.platform.timing import first_batch, idle_fraction, mean_std, ratio

if TYPE_CHECKING:
    import keras

# TensorFlow: imported on first use (chexnet_utils.platform.lazy)
tf = lazy_module("tensorflow")

__all__ = ["COMMAND", "OPTIONS", "PipelinesResult", "bench_pipelines"]



@dataclass(frozen=True)
class PipelinesResult:
    """Input pipelines compared on one split of TFRecords, one worker (:func:`bench_pipelines`):
    every measurement keyed by the pipeline's name (``"old"``, ``"new"`` and any registered
    variant, :func:`chexnet_utils.input.pipelines.register_pipeline`).

    Rates are images/s. ``as_dict()`` is the JSON of ``bench pipelines --json``: flat keys per
    pipeline (``old_img_per_s``, ``train_new_img_per_s``, ``idle_fraction_old``, ...: the
    former keys) and the derived figures (the ``accel_wait_fraction_*`` keys only with an
    emulated accelerator); ``str(result)`` the table.
    """

    img_per_s_runs: dict[str, list[float]]
    """Pipeline -> images/s of each run alone, nothing consuming its batches (the runs of
    the pipelines alternate)."""
    decode_img_per_s_single_core: float
    """One core's parse + decode + preprocess rate, images/s
    (:attr:`DecodeCeiling.img_per_s_single_core`)."""
    cores: int
    """Cores this process may use: the ceiling is the single-core rate times these."""
    train_img_per_s: dict[str, float]
    """Pipeline -> images/s of the probe model's training steps fed by it."""
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
    """Shuffle buffer of every pipeline, in elements (see ``DEFAULT_SHUFFLE_BUFFER``)."""
    ceiling_images: int
    """Records decoded in each pass of the ceiling (:attr:`DecodeCeiling.n_images`)."""
    train_steps: int
    """Timed training steps per pipeline."""
    seed: int | None
    """Shuffling seed of the pipelines."""
    new_cycle_length: int
    """Files the new approach reads at once (``DEFAULT_CYCLE_LENGTH``)."""
    tensorflow: str
    """TensorFlow version."""
    accel_wait_fraction: dict[str, float] | None = None
    """Pipeline -> share of an emulated accelerator's time spent waiting for it
    (:func:`accel_wait_fraction`); ``None`` without ``emulate_accelerator_ms``."""
    emulate_accelerator_ms: float | None = None
    """Milliseconds per batch of the emulated accelerator, or ``None`` (not emulated)."""

    @property
    def pipelines(self) -> tuple[str, ...]:
        """The pipelines measured, in the order they were timed."""
        return tuple(self.img_per_s_runs)

    def img_per_s(self, name: str) -> float:
        """Mean images/s of pipeline ``name`` alone."""
        return mean_std(self.img_per_s_runs[name])[0]

    def img_per_s_std(self, name: str) -> float:
        """Sample standard deviation of its runs, images/s (0 for one run)."""
        return mean_std(self.img_per_s_runs[name])[1]

    def idle_fraction(self, name: str) -> float:
        """``1 - train / train_synthetic`` in [0, 1]: the share of the step spent waiting
        for pipeline ``name``."""
        return idle_fraction(self.train_img_per_s[name], self.train_synthetic_img_per_s)

    @property
    def decode_ceiling_img_per_s(self) -> float:
        """``decode_img_per_s_single_core x cores``: no pipeline here beats it, images/s."""
        return self.decode_img_per_s_single_core * self.cores

    @property
    def new_over_old(self) -> float:
        """New / old images/s (NaN when the old rate is 0)."""
        return ratio(self.img_per_s("new"), self.img_per_s("old"))

    @property
    def new_over_ceiling(self) -> float:
        """New images/s / the decode ceiling (NaN when the ceiling is 0)."""
        return ratio(self.img_per_s("new"), self.decode_ceiling_img_per_s)

    def as_dict(self) -> dict[str, Any]:
        """The fields and the derived figures, flat: the JSON of ``bench pipelines --json``."""
        keyed = ("img_per_s_runs", "train_img_per_s", "accel_wait_fraction")
        d = {k: v for k, v in asdict(self).items() if k not in keyed}
        for name in self.pipelines:
            d.update({f"{name}_img_per_s_runs": self.img_per_s_runs[name],
                      f"{name}_img_per_s": self.img_per_s(name),
                      f"{name}_img_per_s_std": self.img_per_s_std(name),
                      f"train_{name}_img_per_s": self.train_img_per_s[name],
                      f"idle_fraction_{name}": self.idle_fraction(name)})
            if self.accel_wait_fraction is not None:
                d[f"accel_wait_fraction_{name}"] = self.accel_wait_fraction[name]
        d["decode_ceiling_img_per_s"] = self.decode_ceiling_img_per_s
        if "new" in self.pipelines:
            d["new_over_ceiling"] = self.new_over_ceiling
            if "old" in self.pipelines:
                d["new_over_old"] = self.new_over_old
        if self.emulate_accelerator_ms is None:
            del d["emulate_accelerator_ms"]
        return d

    def __str__(self) -> str:
        """The rates, the ceiling and the idle fractions as a small readable table (and the
        emulated accelerator's waiting, when one was fed)."""
        def runs(values: list[float]) -> str:
            return ", ".join(f"{v:.1f}" for v in values)

        lines = [f"{self.split} shards: {self.n_files} file(s) in {self.tfrecords_dir}; "
                 f"{self.image_size} px, batch {self.batch_size}, {self.cores} core(s)",
                 "", f"{'':<26}{'images/s':>10}"]
        lines += [f"{name + ' approach':<26}{self.img_per_s(name):>10.1f} ± "
                  f"{self.img_per_s_std(name):.1f}   runs: {runs(self.img_per_s_runs[name])}"
                  for name in self.pipelines]
        lines.append(f"{'decode ceiling':<26}{self.decode_ceiling_img_per_s:>10.1f}"
                     f"   ({self.decode_img_per_s_single_core:.1f}/core x {self.cores})")
        if {"old", "new"} <= set(self.pipelines):
            lines.append(f"{'new / old':<26}{self.new_over_old:>10.2f}x")
        if "new" in self.pipelines:
            lines.append(f"{'new / ceiling':<26}{self.new_over_ceiling:>10.2f}")
        lines += ["", f"training ({self.probe_model}, {self.train_synthetic_img_per_s:.1f} "
                      f"images/s on a constant batch):"]
        lines += [f"{'  fed by ' + name + ' approach':<26}{self.train_img_per_s[name]:>10.1f}"
                  f"   idle {self.idle_fraction(name):.0%}" for name in self.pipelines]
        if self.accel_wait_fraction is not None:
            waits = ", ".join(f"{name} {self.accel_wait_fraction[name]:.1%}"
                              for name in self.pipelines)
            lines.append(f"emulated accelerator ({self.emulate_accelerator_ms:g} ms per batch) "
                         f"waiting for data: {waits}")
        return "\n".join(lines)


def bench_pipelines(tfrecords_dir: Path | str, image_size: int = 224, batch_size: int = 16,
                    n_batches: int = 20, split: str = "train", repeats: int = 3,
                    warmup_batches: int = 2, shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
                    ceiling_images: int = 64, train_steps: int = 10, seed: int | None = 0,
                    model_fn: Callable[[int], keras.Model] | None = None,
                    log: Callable[[str], None] | None = None,
                    emulate_accelerator_ms: float | None = None,
                    pipelines: Sequence[str] | None = None) -> PipelinesResult:
    """The input pipelines (``pipelines``, default every registered one: old, new and any
    variant added with :func:`~chexnet_utils.input.pipelines.register_pipeline`) on one split
    of converted TFRecords, in one run.

    Measures (training mode, one worker): the images/s of each pipeline with their runs
    alternating (:func:`compare_pipelines`), the :func:`decode_ceiling`, and the idle
    fraction of a training step fed by each (:func:`time_training` against one
    constant-batch measurement of the model). ``model_fn(image_size)`` builds the compiled
    model for the idle fractions (default: a small probe CNN; CheXNet itself is far too slow
    on a CPU).

    Returns a :class:`PipelinesResult`: per pipeline the runs' images/s, the fed training
    rate and its idle fraction; ``decode_ceiling_img_per_s``, ``new_over_old``,
    ``new_over_ceiling``, ``cores`` and the parameters. With ``emulate_accelerator_ms`` also
    each pipeline's ``accel_wait_fraction`` (:func:`accel_wait_fraction`, ``n_batches`` steps
    of an accelerator taking that many ms per batch; ``None`` without).
    """
    from chexnet_utils.data.tfrecords import list_shards

    say = log or (lambda _msg: None)
    files = list_shards(tfrecords_dir, split)
    if not files:
        raise ValueError(f"{tfrecords_dir}: no {split} shards (convert with `python -m "
                         f"chexnet_utils tfrecords` first)")
    common: dict[str, Any] = dict(training=True, shuffle_buffer=shuffle_buffer, seed=seed)
    names = list(PIPELINES if pipelines is None else pipelines)
    if not names:
        raise ValueError("pipelines: name at least one")
    built = {name: build_pipeline(name, files, batch_size, image_size, **common)
             for name in names}
    say(f"timing the {', '.join(names)} pipelines ({repeats} alternating runs of {n_batches} "
        f"batches each)")
    t = compare_pipelines(built, n_batches, warmup_batches, repeats)
    say("measuring the single-core decode rate")
    ceiling = decode_ceiling(files, image_size, n_images=ceiling_images)
    say("timing training steps fed by each pipeline")
    model = (model_fn or probe_model)(image_size)
    step = train_step_fn(model)
    constant = first_batch(built.get("new", built[names[-1]]))  # any batch: its content is moot
    synth, _ = synthetic_rate(step, constant, train_steps)
    train = {name: time_training(model, ds, train_steps, warmup=warmup_batches,
                                 synthetic_img_per_s=synth)
             for name, ds in built.items()}

    accel: dict[str, float] | None = None
    if emulate_accelerator_ms is not None:
        say(f"feeding an emulated accelerator ({emulate_accelerator_ms:g} ms per batch)")
        accel = {name: accel_wait_fraction(ds, emulate_accelerator_ms, n_batches,
                                           warmup_batches)
                 for name, ds in built.items()}

    return PipelinesResult(
        img_per_s_runs={name: t[name].images_per_s for name in names},
        decode_img_per_s_single_core=ceiling.img_per_s_single_core, cores=ceiling.cores,
        train_img_per_s={name: train[name].real_img_per_s for name in names},
        train_synthetic_img_per_s=synth, probe_model=model.name,
        tfrecords_dir=str(tfrecords_dir), split=split, n_files=len(files),
        image_size=image_size, batch_size=batch_size, n_batches=n_batches, repeats=repeats,
        warmup_batches=warmup_batches, shuffle_buffer=shuffle_buffer,
        ceiling_images=ceiling.n_images, train_steps=train_steps, seed=seed,
        new_cycle_length=DEFAULT_CYCLE_LENGTH, tensorflow=tf.__version__,
        accel_wait_fraction=accel, emulate_accelerator_ms=emulate_accelerator_ms)


OPTIONS: dict[str, Option] = {
    "tfrecords_dir": Option("--tfrecords", "converted folder", "DIR"),
    "split": Option("--split", "which shards to read"),
    "image_size": Option("--image-size", "model input side", "PX"),
    "batch_size": Option("--batch-size", "images per batch", "N"),
    "n_batches": Option("--batches", "timed batches per run", "N"),
    "warmup_batches": Option("--warmup", "untimed batches before each run", "N"),
    "repeats": Option("--repeats", "timed runs per pipeline, alternating", "N"),
    "shuffle_buffer": Option("--shuffle-buffer", "shuffle buffer of every pipeline", "N"),
    "ceiling_images": Option("--ceiling-images", "images for the single-core decode rate", "N"),
    "train_steps": Option("--train-steps", "timed training steps for the idle fractions", "N"),
    "emulate_accelerator_ms": Option(
        "--emulate-accelerator", "also feed an emulated accelerator taking MS per batch and "
        "report accel_wait_fraction_<pipeline> (share of its time waiting for data)", "MS"),
    "pipelines": Option("--pipelines", "comma list of the pipelines to time (default: every "
                                       "registered one: old, new and any variant added)", "LIST"),
}
"""``bench pipelines``' options: a parameter of :func:`bench_pipelines` -> its flag and help."""


def _run(args: argparse.Namespace, log: Callable[[str], None]) -> PipelinesResult:
    return bench_pipelines(log=log, **option_values(args, OPTIONS))


COMMAND = BenchCommand("every input pipeline (old, new, variants) on converted TFRecords",
                       bench_pipelines, OPTIONS, _run, json_required=True)
