"""The tf.data service measured: a one-core trainer decoding locally vs fed by a service worker.

:func:`bench_service` starts a :class:`~chexnet_utils.input.tfdata_service.TFDataService`
(dispatcher and one worker on their own core) and a trainer process on another core
(``python -m chexnet_utils.bench.service trainer ...``, :func:`trainer_run`), which measures
the compute ``c`` and the decoding ``d`` per image, then training fed locally (about
``d + c`` per image) against training fed by the service (about ``max(d, c)``), alternating.
It returns a :class:`ServiceResult`: the measured runs and the parameters as fields, the
rates, ``d``, ``c`` and the predictions as properties, ``print(result)`` the table.
Notebook 07 and ``python -m chexnet_utils bench service``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from chexnet_utils.bench.registry import BenchCommand, full_size_tfrecords, tfrecords_argument
from chexnet_utils.hardware.devices import usable_cpus
from chexnet_utils.input.tfdata_service import (
    PROCESSING_MODES,
    ProcessingMode,
    TFDataService,
    distribute,
    next_within,
    role_command,
)
from chexnet_utils.model.architectures import Architecture
from chexnet_utils.platform.lazy import lazy_module
from chexnet_utils.platform.options import Option, option_values
from chexnet_utils.platform.processes import set_parent_death_signal
from chexnet_utils.platform.timing import RunMean, batch_len, block, ratio
from chexnet_utils.training.dataparallel import Recipe

if TYPE_CHECKING:
    import tensorflow as tf

# Keras, TensorFlow: imported on first use (chexnet_utils.platform.lazy)
keras = lazy_module("keras")
if not TYPE_CHECKING:
    tf = lazy_module("tensorflow")

__all__ = ["COMMAND", "OPTIONS", "ServiceResult", "bench_service", "trainer_run"]


@dataclass(frozen=True)
class ServiceResult:
    """One-core trainer decoding locally vs fed by a tf.data service worker
    (:func:`bench_service`): the trainer's runs, its cores and the parameters.

    Rates are images/s; ``d`` and ``c`` are seconds of decoding and of training compute per
    image, shown in ms (:attr:`d_ms`, :attr:`c_ms`). ``as_dict()`` is the JSON of
    ``bench service --json`` (fields and derived figures, the keys of the former dict);
    ``str(result)`` the table.
    """

    compute_img_per_s_runs: list[float]
    """Training compute alone, one constant batch (``1 / c``), images/s per repeat."""
    decode_img_per_s_runs: list[float]
    """The new pipeline alone on the trainer's core, nothing consuming (``1 / d``), images/s
    per repeat."""
    local_img_per_s_runs: list[float]
    """Training fed by the pipeline run locally (decode and compute share the core), images/s
    per repeat."""
    service_img_per_s_runs: list[float]
    """Training fed by the service worker (the trainer only computes), images/s per repeat."""
    n_files: int
    """Shards of ``split`` the pipeline reads."""
    model: str
    """Name of the Keras model trained."""
    arch: Architecture
    """Architecture of :func:`chexnet_utils.model.models.build_chexnet` (``"small"``: the
    CPU-sized model)."""
    trainer_cpus: list[int]
    """Cores the trainer process was confined to."""
    worker_cpus: list[int]
    """Cores of the service's dispatcher and worker."""
    processing_mode: ProcessingMode
    """The service's processing mode (``"parallel_epochs"`` or ``"distributed_epoch"``)."""
    image_size: int
    """Model input, pixels per side."""
    batch_size: int
    """Images per training step."""
    n_steps: int
    """Timed steps per run."""
    warmup: int
    """Untimed steps before each run."""
    repeats: int
    """Runs of each kind (compute, decode, local, service), alternating."""
    split: str
    """Split of the shards read (``"train"``)."""
    tfrecords_dir: str
    """Folder of the TFRecord shards."""
    service_stopped_cleanly: bool
    """The service's processes all ended and left no port open."""
    load_average_start: list[float]
    """``os.getloadavg()`` (1, 5, 15 min) before the measurement."""
    load_average: list[float]
    """``os.getloadavg()`` after it (other jobs on the cores distort the figures)."""

    compute_img_per_s = RunMean("compute_img_per_s_runs",
                                "Mean training compute rate (``1 / c``), images/s.")
    decode_img_per_s = RunMean("decode_img_per_s_runs",
                               "Mean decode rate of one core (``1 / d``), images/s.")
    local_img_per_s = RunMean("local_img_per_s_runs",
                              "Mean training rate fed locally, images/s.")
    service_img_per_s = RunMean("service_img_per_s_runs",
                                "Mean training rate fed by the service, images/s.")

    @property
    def service_over_local(self) -> float:
        """Measured speed-up of the service: service / local images/s."""
        return ratio(self.service_img_per_s, self.local_img_per_s)

    def _d_c(self) -> tuple[float, float]:
        """``(d, c)``: seconds of decoding and of compute per image."""
        return ratio(1.0, self.decode_img_per_s), ratio(1.0, self.compute_img_per_s)

    @property
    def d_ms(self) -> float:
        """``d``: decoding per image on one core, ms (``1000 / decode_img_per_s``)."""
        return 1000 * self._d_c()[0]

    @property
    def c_ms(self) -> float:
        """``c``: training compute per image, ms (``1000 / compute_img_per_s``)."""
        return 1000 * self._d_c()[1]

    @property
    def predicted_local_img_per_s(self) -> float:
        """``1 / (d + c)``: decoding and compute one after the other on one core, images/s."""
        d, c = self._d_c()
        return ratio(1.0, d + c)

    @property
    def predicted_service_img_per_s(self) -> float:
        """``1 / max(d, c)``: the slower of decoding (worker) and compute (trainer), images/s."""
        return ratio(1.0, max(self._d_c()))

    @property
    def predicted_speedup(self) -> float:
        """``(d + c) / max(d, c)``: the predicted service / local (at most 2, when d = c)."""
        d, c = self._d_c()
        return ratio(d + c, max(d, c))

    @property
    def service_over_predicted(self) -> float:
        """Measured over predicted speed-up (1: the prediction holds)."""
        return ratio(self.service_over_local, self.predicted_speedup)

    @property
    def bytes_per_image(self) -> int:
        """What the service ships per image: ``image_size`` squared, 3 float32 channels."""
        return self.image_size * self.image_size * 3 * 4

    @property
    def service_MB_per_s(self) -> float:
        """What the measured service rate ships, MB/s (10^6 bytes)."""
        return self.service_img_per_s * self.bytes_per_image / 1e6

    def as_dict(self) -> dict[str, Any]:
        """The fields and the derived figures: the JSON of ``bench service --json``."""
        return {**asdict(self), **{name: getattr(self, name) for name in (
            "compute_img_per_s", "decode_img_per_s", "local_img_per_s", "service_img_per_s",
            "service_over_local", "d_ms", "c_ms", "predicted_local_img_per_s",
            "predicted_service_img_per_s", "predicted_speedup", "bytes_per_image",
            "service_MB_per_s", "service_over_predicted")}}

    def __str__(self) -> str:
        """The measured and predicted rates as a small table."""
        return "\n".join([
            f"one-core trainer (core(s) {self.trainer_cpus}), {self.arch} model at "
            f"{self.image_size} px, batch {self.batch_size}; service worker on core(s) "
            f"{self.worker_cpus} ({self.processing_mode})",
            f"  decode d = {self.d_ms:.1f} ms/image, compute c = {self.c_ms:.1f} ms/image",
            f"  {'':<22}{'measured':>10}{'predicted':>11}",
            f"  {'local (d + c)':<22}{self.local_img_per_s:>10.1f}"
            f"{self.predicted_local_img_per_s:>11.1f}  images/s",
            f"  {'service (max(d, c))':<22}{self.service_img_per_s:>10.1f}"
            f"{self.predicted_service_img_per_s:>11.1f}  images/s",
            f"  {'service / local':<22}{self.service_over_local:>9.2f}x"
            f"{self.predicted_speedup:>10.2f}x",
            f"  load average (1 min) at the start {self.load_average_start[0]:.2f}, at the end "
            f"{self.load_average[0]:.2f} (other jobs on the cores distort the figures)",
        ])


def _timed_steps(step: Any, it: Iterator[Any], n_steps: int, warmup: int) -> float:
    """Training images/s over ``n_steps`` steps pulled from ``it`` after ``warmup`` steps."""
    for _ in range(warmup):
        block(step(next_within(it, 120)))
    images = 0
    t0 = time.perf_counter()
    for _ in range(n_steps):
        b = next_within(it, 120)
        block(step(b))
        images += batch_len(b)
    return images / (time.perf_counter() - t0)


def _drain(it: Iterator[Any], slow_s: float, limit: int = 500) -> int:
    """Take (untimed) what the service buffered while the trainer did something else: pull
    elements until one takes longer than ``slow_s`` to arrive (it had to be produced).
    Returns how many were taken."""
    for n in range(limit):
        t0 = time.perf_counter()
        next_within(it, 120)
        if time.perf_counter() - t0 > slow_s:
            return n + 1
    return limit


def trainer_run(tfrecords_dir: str, target: str, image_size: int = 128, batch_size: int = 16,
                n_steps: int = 30, warmup: int = 5, repeats: int = 2, split: str = "train",
                processing_mode: ProcessingMode = "parallel_epochs", arch: Architecture = "small",
                seed: int = 0, prefetch: int = 4) -> dict[str, Any]:
    """The trainer of :func:`bench_service`, run in a process confined to its cores (one).

    Measures, in this order: ``c``, seconds of training compute per image (steps on one
    constant batch); ``d``, seconds of decoding per image (the new pipeline alone, nothing
    consuming); then ``repeats`` alternating runs of training fed by the new pipeline run
    **locally** (decode and compute share the core: about ``d + c`` per image) and fed by the
    **service** (``distribute(...)``: the trainer only computes, about ``max(d, c)``), with
    ``prefetch`` received batches buffered on the trainer (when ``d`` and ``c`` are close, a
    step that happens to be slow on either side would otherwise stall the other). Call
    with TensorFlow configured to one intra/inter-op thread before this point.

    Returns the runs (``*_img_per_s_runs``: their means are :class:`ServiceResult`'s),
    ``n_files``, ``model`` and ``arch`` as a dict: the trainer process prints it as one JSON
    line, from which :func:`bench_service` builds its :class:`ServiceResult`.
    """
    from chexnet_utils.bench.idle import synthetic_rate, train_step_fn
    from chexnet_utils.bench.throughput import time_pipeline
    from chexnet_utils.data.tfrecords import list_shards
    from chexnet_utils.input.pipelines import new_approach
    from chexnet_utils.model.models import build_chexnet

    files = list_shards(tfrecords_dir, split)
    if not files:
        raise ValueError(f"{tfrecords_dir}: no {split} shards")

    def pipeline() -> tf.data.Dataset:
        return new_approach(files, batch_size, image_size, training=True, seed=seed)

    keras.utils.set_random_seed(seed)
    model = build_chexnet(arch, image_size)
    Recipe().compile(model, "binary_crossentropy", size=1)  # train()'s Adam, one worker
    step = train_step_fn(model)
    first = next(iter(pipeline()))
    batch = (first[0], first[1])
    runs: dict[str, list[float]] = {"local": [], "service": [], "compute": [], "decode": []}
    # One service job for all runs (its worker starts once); each service run first takes
    # `warmup` untimed steps, which also drain what the worker buffered meanwhile.
    service_it = iter(distribute(pipeline(), target, processing_mode).prefetch(prefetch))
    _timed_steps(step, service_it, 1, 2 * warmup)
    for _ in range(repeats):  # c, d, local, service: each repeat measures all four
        runs["compute"].append(synthetic_rate(step, batch, n_steps)[0])
        runs["decode"].append(time_pipeline(pipeline(), n_steps, warmup, 1).mean)
        it = iter(pipeline())
        runs["local"].append(_timed_steps(step, it, n_steps, warmup))
        del it
        # a batch made on the worker's core takes about batch_size x d: half of that means
        # "not from a buffer"
        _drain(service_it, 0.5 * batch_size / runs["decode"][-1])
        runs["service"].append(_timed_steps(step, service_it, n_steps, warmup))
    del service_it
    return {"compute_img_per_s_runs": runs["compute"], "decode_img_per_s_runs": runs["decode"],
            "local_img_per_s_runs": runs["local"], "service_img_per_s_runs": runs["service"],
            "n_files": len(files), "model": model.name, "arch": arch}


def bench_service(tfrecords_dir: str | os.PathLike[str], image_size: int = 128,
                  batch_size: int = 16, n_steps: int = 30, warmup: int = 5, repeats: int = 2,
                  split: str = "train", processing_mode: ProcessingMode = "parallel_epochs",
                  arch: Architecture = "small", trainer_cpus: Iterable[int] = (0,),
                  worker_cpus: Iterable[int] = (1,), timeout: float = 900.0,
                  log: Any = None) -> ServiceResult:
    """A GPU host whose cores are all busy, on a CPU: local decoding vs a tf.data service.

    The trainer is a separate process pinned to ``trainer_cpus`` (one core) with one
    intra/inter-op thread: it trains the CPU-sized model (compute ``c`` per image) and, in
    the local runs, also decodes the full-size shards (``d`` per image), so a step costs
    about ``d + c``. In the service runs a worker process pinned to ``worker_cpus`` decodes
    and the trainer only computes: about ``max(d, c)``. Returns a :class:`ServiceResult`:
    the runs and the parameters, with ``local_img_per_s``, ``service_img_per_s``,
    ``service_over_local``, ``d_ms``, ``c_ms``, ``predicted_speedup = (d + c) / max(d, c)``,
    ``bytes_per_image`` (what the service ships per image) as properties; ``print(result)``
    shows them as a table.
    """
    say = log or (lambda _msg: None)
    trainer_cpus, worker_cpus = tuple(trainer_cpus), tuple(worker_cpus)
    if set(trainer_cpus) & set(worker_cpus):
        raise ValueError("trainer and service worker must run on different cores")
    avail = set(usable_cpus())
    if not set(trainer_cpus) | set(worker_cpus) <= avail:
        raise ValueError(f"cores {sorted(set(trainer_cpus) | set(worker_cpus))} not all "
                         f"available (this process may use {sorted(avail)})")
    load_start = list(os.getloadavg())
    say(f"starting a tf.data service (dispatcher + 1 worker on core(s) {list(worker_cpus)})")
    with TFDataService(num_workers=1, worker_cpus=[worker_cpus],
                       dispatcher_cpus=worker_cpus) as svc:
        say(f"trainer on core(s) {list(trainer_cpus)}: measuring c, d, then local vs service")
        cmd, env = role_command("trainer", [
            "--tfrecords", str(tfrecords_dir), "--target", svc.target,
            "--image-size", str(image_size), "--batch-size", str(batch_size),
            "--steps", str(n_steps), "--warmup", str(warmup), "--repeats", str(repeats),
            "--split", split, "--mode", processing_mode, "--arch", arch], trainer_cpus,
            module=__name__)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        stop_report = svc.stop()
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the trainer failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[-2000:]}")
    r = json.loads(lines[-1])
    return ServiceResult(
        compute_img_per_s_runs=r["compute_img_per_s_runs"],
        decode_img_per_s_runs=r["decode_img_per_s_runs"],
        local_img_per_s_runs=r["local_img_per_s_runs"],
        service_img_per_s_runs=r["service_img_per_s_runs"],
        n_files=r["n_files"], model=r["model"], arch=r["arch"],
        trainer_cpus=list(trainer_cpus), worker_cpus=list(worker_cpus),
        processing_mode=processing_mode, image_size=image_size, batch_size=batch_size,
        n_steps=n_steps, warmup=warmup, repeats=repeats, split=split,
        tfrecords_dir=str(tfrecords_dir), service_stopped_cleanly=not (
            stop_report["left"] or stop_report["open_ports"]),
        load_average_start=load_start, load_average=list(os.getloadavg()))


def _trainer_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m chexnet_utils.bench.service trainer")
    p.add_argument("--parent", type=int, default=None)
    p.add_argument("--cpus", default="0")
    p.add_argument("--tfrecords", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--split", default="train")
    p.add_argument("--mode", default="parallel_epochs", choices=PROCESSING_MODES)
    p.add_argument("--arch", default="small")
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    set_parent_death_signal(signal.SIGKILL, a.parent)
    os.sched_setaffinity(0, {int(c) for c in a.cpus.split(",")})

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    r = trainer_run(a.tfrecords, a.target, a.image_size, a.batch_size, a.steps, a.warmup,
                    a.repeats, a.split, a.mode, a.arch)
    print(json.dumps(r), flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the bench's trainer process (``trainer ...``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["trainer"]:
        print("usage: python -m chexnet_utils.bench.service trainer --tfrecords DIR --target "
              "ADDRESS [...]", file=sys.stderr)
        return 2
    return _trainer_main(argv[1:])


OPTIONS: dict[str, Option] = {
    "split": Option("--split", "which shards to read"),
    "batch_size": Option("--batch-size", "images per batch", "N"),
    "n_steps": Option("--steps", "timed steps per run", "N"),
    "warmup": Option("--warmup", "untimed steps before each run", "N"),
    "repeats": Option("--repeats", "alternating local/service runs", "N"),
    "processing_mode": Option("--mode", "processing mode of the service"),
}
"""``bench service``'s options from :func:`bench_service`'s parameters; ``--tfrecords`` (made
if missing) and ``--image-size`` (the scale preset's) by hand."""


def _arguments(parser: argparse.ArgumentParser) -> None:
    tfrecords_argument(parser)
    parser.add_argument("--image-size", type=int, default=None, metavar="PX",
                        help="model input side (default: the scale preset's)")


def _run(args: argparse.Namespace, log: Callable[[str], None]) -> ServiceResult:
    from chexnet_utils.config import scale

    return bench_service(full_size_tfrecords(args.tfrecords),
                         image_size=args.image_size or scale().image_size, log=log,
                         **option_values(args, OPTIONS))


COMMAND = BenchCommand("one-core trainer: local decoding vs a tf.data service worker on the "
                       "other core", bench_service, OPTIONS, _run, _arguments)



if __name__ == "__main__":
    raise SystemExit(main())
