"""Images/s on 1..N Horovod workers and the scaling efficiency, as the articles measured it.

The Dell articles report CheXNet training throughput on 1, 2, 3, 4 and 8 V100 GPUs: with the
"old" input pipeline the curve is flat (more GPUs, same images/s), with the "new" one it is
nearly linear. :func:`bench_scaling` measures the same curve on ipyparallel MPI engines:
for each worker count it starts a cluster (one engine per worker, bound to its own core by
default, so "1 worker" means one core's worth of compute), runs the same timed training
steps with each pipeline, and stops the cluster.

``efficiency(N) = rate(N) / (N * rate(1))``: 1.0 is perfect linear scaling. The result is a
:class:`ScalingResult` (``result.efficiency["new"][2]``; ``print(result)`` shows the table,
``result.as_dict()`` is the ``--json`` file).

Two kinds of worker are measured:

* **CPU model** (default): the model really trains on the worker's core, which it shares with
  that worker's input pipeline. Decoding then costs about as much as the model step, so the
  old pipeline's waste shows as a *lower* efficiency, not a flat line.
* **Emulated accelerator** (``accelerator_ms``): the step is a wait of ``accelerator_ms``
  (a device computing while the CPU is free, as in notebook 02) followed by a real Horovod
  average of gradient-sized tensors. The core only feeds the "device", which is the
  articles' situation (V100s fed by the CPUs): with the old pipeline every worker decodes
  every image, so the job's images/s stay flat (efficiency ~1/N); with the new one they
  grow with N.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from chexnet_utils.bench.engine_steps import StepConfig
from chexnet_utils.bench.registry import BenchCommand, full_size_tfrecords, tfrecords_argument
from chexnet_utils.comm.collectives import barrier
from chexnet_utils.input.pipelines import Pipeline
from chexnet_utils.model.architectures import Architecture
from chexnet_utils.platform.lazy import lazy_module
from chexnet_utils.platform.options import Option, option_values
from chexnet_utils.platform.timing import barrier_windows, mean_std
from chexnet_utils.training.dataparallel import Recipe

if TYPE_CHECKING:
    from chexnet_utils.cluster.distributed import MPICluster

# Horovod, Keras, TensorFlow: imported on first use (chexnet_utils.platform.lazy)
hvd = lazy_module("horovod.tensorflow")
keras = lazy_module("keras")
tf = lazy_module("tensorflow")


SHUFFLE_BUFFER = 32
"""Record shuffle buffer of both pipelines when the :class:`StepConfig` leaves it ``None``.
Small on purpose: the old approach shuffles *decoded* images, and a large buffer would let it
start the timed window with hundreds of images decoded in advance, which is stock, not
throughput. (Likewise :func:`bench_scaling`'s 20 warm-up steps: long enough that a pipeline
slower than the step has used up the decoded images it buffered before the clock starts; the
old approach's ``prefetch(batch_size)`` holds ``batch_size`` whole batches.)"""


BENCH_RECIPE = Recipe(distributed=True)
"""How the pipeline-fed benchmarks compile (here and :mod:`chexnet_utils.bench.gpu_node`): the
recipe of a default ``TrainConfig(distributed=True)``, so they time the step ``train`` takes
(``tests/tf/test_recipe.py``)."""


def prepare_data_parallel_model(model: Any, size: int, jit_compile: bool = False) -> None:
    """Compile ``model`` by :data:`BENCH_RECIPE` (train()'s defaults, distributed: Adam at the
    learning rate for ``size`` workers, the same gradient averager), with the weighted BCE
    (flat weights: they change no timing), and broadcast rank 0's initial state, as
    :func:`chexnet_utils.training.train` does with ``distributed=True``."""
    from chexnet_utils.data.labels import NUM_CLASSES
    from chexnet_utils.model.models import WeightedBCE
    from chexnet_utils.training.dataparallel import broadcast_initial_state

    BENCH_RECIPE.compile(model, WeightedBCE(np.full(NUM_CLASSES, 0.5), np.full(NUM_CLASSES, 0.5)),
                         size, jit_compile=jit_compile)
    broadcast_initial_state(model, True)


def throughput_on_engine(cfg: StepConfig | dict[str, Any]) -> dict[str, Any]:
    """Run on every Horovod worker: ``steps`` timed data-parallel training steps, fed by
    ``cfg.pipeline`` over ``cfg.tfrecords`` (see
    :class:`~chexnet_utils.bench.engine_steps.StepConfig`).

    Builds the model, averages gradients with Horovod and broadcasts rank 0's initial
    state, exactly as :func:`chexnet_utils.training.train` does with ``distributed=True``,
    but without validation or checkpoints so that only the training step is timed. The
    clock starts and stops at a barrier (an allreduce), so every worker reports the same
    interval. Returns this worker's rank, the world size and the images/s of the whole job.
    """
    from chexnet_utils.data.tfrecords import list_shards
    from chexnet_utils.input.pipelines import build_pipeline
    from chexnet_utils.model.models import build_chexnet
    from chexnet_utils.training.dataparallel import init_world

    c = StepConfig.of(cfg)
    rank, size = init_world(True)

    keras.utils.set_random_seed(c.seed)
    model = build_chexnet(c.arch, c.image_size)
    prepare_data_parallel_model(model, size)
    assert c.tfrecords is not None, "a pipeline-fed timer needs cfg.tfrecords"
    ds = build_pipeline(c.pipeline, list_shards(c.tfrecords, "train"), c.batch_size,
                        c.image_size, training=True, num_workers=size, worker_index=rank,
                        seed=c.seed, shuffle_buffer=SHUFFLE_BUFFER if c.shuffle_buffer is None
                        else c.shuffle_buffer)
    it = iter(ds)

    batches = 0
    averaged: list[Any] = []
    if c.accelerator_ms > 0:
        # gradient-sized tensors holding this worker's rank: their average (size - 1) / 2
        # shows the allreduce really ran across all workers
        fake_grads = [tf.fill(tf.shape(v), float(rank)) for v in model.trainable_variables]

        def step() -> None:
            nonlocal batches, averaged
            next(it)  # the batch the device would train on
            batches += 1
            time.sleep(c.accelerator_ms / 1000.0)  # the device computes; the CPU is free
            averaged = hvd.grouped_allreduce(fake_grads, op=hvd.Average, name="emulated_grads")
    else:
        def step() -> None:
            nonlocal batches
            x, y = next(it)
            batches += 1
            model.train_on_batch(x, y)

    seconds = barrier_windows(step, lambda: barrier(hvd, "bench_barrier"), c.steps,
                              warmup_steps=c.warmup_steps)[0].seconds
    images = c.steps * c.batch_size * size
    out = {"rank": rank, "size": size, "seconds": seconds, "img_per_s": images / seconds,
           "pipeline": c.pipeline, "accelerator_ms": c.accelerator_ms, "batches": batches}
    if averaged:
        out["emulated_average"] = float(tf.reshape(averaged[0], [-1])[0].numpy())
    return out


ENV_PREFIXES = ("OMPI_MCA_", "HOROVOD_", "OMP_", "TF_NUM_")
"""Engine variables that change what a scaling run measures (recorded with the result)."""


def effective_engine_env(cluster: MPICluster) -> dict[str, str]:
    """The settings ``cluster``'s engines really run with (this process's environment plus
    :meth:`~chexnet_utils.cluster.distributed.MPICluster.env_overrides`: thread budget, MPI
    yielding and the caller's ``env``), restricted to :data:`ENV_PREFIXES`. Recorded with every
    :func:`bench_scaling` result, so two results that differ in e.g. MPI spinning say so."""
    merged = {**os.environ, **cluster.env_overrides()}
    return {k: v for k, v in sorted(merged.items()) if k.startswith(ENV_PREFIXES)}


def efficiency(rates: dict[int, float]) -> dict[int, float]:
    """``rate(N) / (N * rate(1))`` for every N in ``rates`` (needs N = 1)."""
    if 1 not in rates:
        raise ValueError("efficiency needs the 1-worker rate")
    return {n: r / (n * rates[1]) for n, r in rates.items()}


@dataclass(frozen=True)
class ScalingBlock:
    """Images/s and scaling efficiency of one kind of worker (the model on the CPU, or the
    emulated accelerator), per pipeline and worker count, from every timed run."""

    runs: dict[str, dict[int, list[float]]]
    """Images/s of the whole job in each run: ``runs[pipeline][workers]``, one value per
    repeat, in the order they ran."""
    accelerator_ms: float = 0.0
    """Milliseconds of the emulated accelerator's step; 0: the model really trains on the
    worker's core."""

    @property
    def img_per_s(self) -> dict[str, dict[int, float]]:
        """Mean images/s over the repeats: ``img_per_s[pipeline][workers]``."""
        return {p: {n: mean_std(v)[0] for n, v in per_n.items()}
                for p, per_n in self.runs.items()}

    @property
    def efficiency(self) -> dict[str, dict[int, float]]:
        """``rate(N) / (N * rate(1))`` of the mean images/s: ``efficiency[pipeline][workers]``
        (empty without a 1-worker run)."""
        return {p: efficiency(rates) for p, rates in self.img_per_s.items() if 1 in rates}

    def as_dict(self) -> dict[str, Any]:
        """``img_per_s``, ``efficiency`` and ``runs`` (and ``accelerator_ms`` first when the
        accelerator is emulated), as :func:`bench_scaling`'s JSON holds them."""
        d: dict[str, Any] = {"accelerator_ms": self.accelerator_ms} if self.accelerator_ms \
            else {}
        return {**d, "img_per_s": self.img_per_s, "efficiency": self.efficiency,
                "runs": {p: {n: list(v) for n, v in per_n.items()}
                         for p, per_n in self.runs.items()}}


@dataclass(frozen=True)
class ClusterSeconds:
    """How long one worker count's :class:`~chexnet_utils.cluster.distributed.MPICluster`
    took to start and to stop (not part of any timed window)."""

    start_s: float
    """Seconds :meth:`~chexnet_utils.cluster.distributed.MPICluster.start` took (controller
    and engines up and connected: its ``start_seconds``)."""
    stop_s: float
    """Seconds :meth:`~chexnet_utils.cluster.distributed.MPICluster.stop` took (engines and
    controller stopped, every process they started gone: its ``stop_seconds``)."""


@dataclass(frozen=True)
class ScalingResult:
    """:func:`bench_scaling`'s measurement: its parameters, the model on the CPU
    (:attr:`cpu`, also reachable as :attr:`img_per_s`, :attr:`efficiency`, :attr:`runs`),
    the emulated accelerator if asked for, and what each worker count's engines ran with.
    ``str(result)`` is the readable table; :meth:`as_dict` the ``--json`` file."""

    workers: list[int]
    """The worker counts measured, in order (one cluster each)."""
    pipelines: list[Pipeline]
    """The input pipelines timed (``"old"``, ``"new"``)."""
    arch: Architecture
    """Model architecture trained."""
    image_size: int
    """Image side in pixels."""
    batch_size_per_worker: int
    """Images per step on each worker."""
    steps: int
    """Timed steps per run."""
    warmup_steps: int
    """Untimed steps before each run's clock starts."""
    repeats: int
    """Runs per pipeline, worker count and kind of worker (alternating pipeline order)."""
    bind_to: str | None
    """``mpiexec --bind-to`` of the engines (``"core"``: one core and one thread each)."""
    cores: int
    """Cores usable by this process (:func:`~chexnet_utils.hardware.devices.usable_cores`)."""
    env: dict[str, str]
    """Engine environment variables the caller added."""
    tfrecords: str
    """Folder of the TFRecord shards read."""
    cpu: ScalingBlock
    """The model trained on the worker's core (``accelerator_ms`` 0)."""
    engine_env: dict[int, dict[str, str]]
    """Per worker count, the engines' settings that change what is measured
    (:func:`effective_engine_env`)."""
    cluster_seconds: dict[int, ClusterSeconds]
    """Per worker count, its cluster's start and stop times."""
    emulated: ScalingBlock | None = None
    """The emulated accelerator (``accelerator_ms`` > 0), or ``None`` when not asked for."""

    @property
    def img_per_s(self) -> dict[str, dict[int, float]]:
        """The model on the CPU: mean images/s, ``img_per_s[pipeline][workers]``."""
        return self.cpu.img_per_s

    @property
    def efficiency(self) -> dict[str, dict[int, float]]:
        """The model on the CPU: scaling efficiency, ``efficiency[pipeline][workers]``."""
        return self.cpu.efficiency

    @property
    def runs(self) -> dict[str, dict[int, list[float]]]:
        """The model on the CPU: images/s of every run, ``runs[pipeline][workers]``."""
        return self.cpu.runs

    def as_dict(self) -> dict[str, Any]:
        """The ``--json`` layout: the parameters, the CPU model's ``img_per_s``,
        ``efficiency`` and ``runs`` at the top level, ``engine_env``, ``cluster_seconds`` and
        ``emulated`` (with its ``accelerator_ms``) when measured. Worker counts are int keys
        here (strings once written as JSON)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)
             if f.name not in ("cpu", "engine_env", "cluster_seconds", "emulated")}
        d = {**d, "env": dict(self.env), **self.cpu.as_dict(),
             "engine_env": {n: dict(e) for n, e in self.engine_env.items()},
             "cluster_seconds": {n: asdict(t) for n, t in self.cluster_seconds.items()}}
        if self.emulated is not None:
            d["emulated"] = self.emulated.as_dict()
        return d

    def merged(self, other: ScalingResult) -> ScalingResult:
        """This measurement and ``other``, more worker counts with the same settings, as one
        result: what :func:`bench_scaling` returns for both lists of worker counts (it times
        each worker count on a cluster of its own in any case). Notebook 04 times 1 worker and
        N workers in two cells, so that no cell keeps a learner waiting a minute."""
        same = ("pipelines", "arch", "image_size", "batch_size_per_worker", "steps",
                "warmup_steps", "repeats", "bind_to", "env", "tfrecords")
        differ = [f for f in same if getattr(self, f) != getattr(other, f)]
        if (self.emulated is None) != (other.emulated is None) or (
                self.emulated and other.emulated
                and self.emulated.accelerator_ms != other.emulated.accelerator_ms):
            differ.append("emulated")
        if differ:
            raise ValueError(f"cannot merge measurements taken with other settings: {differ}")
        twice = sorted(set(self.workers) & set(other.workers))
        if twice:
            raise ValueError(f"both measured worker counts {twice}")

        def block(a: ScalingBlock, b: ScalingBlock) -> ScalingBlock:
            return ScalingBlock({p: {**a.runs[p], **b.runs[p]} for p in a.runs},
                                accelerator_ms=a.accelerator_ms)

        return replace(self, workers=[*self.workers, *other.workers],
                       cpu=block(self.cpu, other.cpu),
                       engine_env={**self.engine_env, **other.engine_env},
                       cluster_seconds={**self.cluster_seconds, **other.cluster_seconds},
                       emulated=block(self.emulated, other.emulated)
                       if self.emulated and other.emulated else None)

    def _table(self, block: ScalingBlock) -> list[str]:
        """One block's lines: a row per worker count, images/s and efficiency per
        pipeline."""
        lines = [f"{'workers':>8}  " + "  ".join(f"{p + ' img/s':>12}  {'eff.':>5}"
                                                 for p in self.pipelines)]
        rates, eff = block.img_per_s, block.efficiency
        for n in self.workers:
            cells = [f"{rates[p][n]:12.1f}  {eff.get(p, {}).get(n, float('nan')):5.2f}"
                     for p in self.pipelines]
            lines.append(f"{n:>8}  " + "  ".join(cells))
        return lines

    def __str__(self) -> str:
        """Readable table: images/s and efficiency per worker count and pipeline, for the
        model on the CPU and the emulated accelerator."""
        lines = [f"{self.arch} at {self.image_size} px, batch {self.batch_size_per_worker}/"
                 f"worker, {self.steps} timed steps, bind-to {self.bind_to}, {self.cores} cores",
                 "model on the CPU (one core per worker):"]
        lines += self._table(self.cpu)
        if self.emulated is not None:
            lines += [f"emulated accelerator ({self.emulated.accelerator_ms:g} ms per step; the "
                      "core only feeds it):"]
            lines += self._table(self.emulated)
        return "\n".join(lines)


def bench_scaling(tfrecords: Path | str, workers: Sequence[int] = (1, 2),
                  pipelines: Sequence[Pipeline] = ("old", "new"), arch: Architecture = "small",
                  image_size: int = 128, batch_size: int = 16, steps: int = 10,
                  warmup_steps: int = 20, repeats: int = 1, bind_to: str | None = "core",
                  map_by: str | None = None, env: Mapping[str, str] | None = None,
                  accelerator_ms: float | None = None,
                  log: Callable[[str], None] | None = None) -> ScalingResult:
    """Images/s per worker count and pipeline, and the scaling efficiency.

    For each worker count N a fresh :class:`~chexnet_utils.cluster.distributed.MPICluster` of N
    engines is started (``bind_to="core"``: one core per worker, one thread each), every
    pipeline is timed ``repeats`` times in alternating order, and the cluster is stopped.
    ``env`` adds engine environment variables (e.g. ``OMPI_MCA_mpi_yield_when_idle`` or
    ``HOROVOD_CYCLE_TIME``). With ``accelerator_ms`` every pipeline is also timed with an
    emulated accelerator (see the module docstring) on the same cluster.

    Returns a :class:`ScalingResult`: every run, images/s and efficiency per pipeline and
    worker count of the CPU model (``result.efficiency["new"][2]``), the same in
    ``result.emulated`` when ``accelerator_ms`` is given, and the cluster start/stop times.
    """
    from chexnet_utils.cluster.distributed import MPICluster
    from chexnet_utils.hardware.devices import usable_cores

    if not workers or min(workers) < 1:
        raise ValueError(f"workers must be positive worker counts, got {list(workers)}")
    if accelerator_ms is not None and accelerator_ms <= 0:
        raise ValueError(f"accelerator_ms must be > 0, got {accelerator_ms}")
    if steps < 1 or warmup_steps < 0:
        raise ValueError(f"need steps >= 1 and warmup_steps >= 0, got {steps}, {warmup_steps}")
    say = log or (lambda msg: None)
    modes = [0.0] + ([float(accelerator_ms)] if accelerator_ms else [])
    runs: dict[float, dict[str, dict[int, list[float]]]] = {
        m: {p: {} for p in pipelines} for m in modes}
    cluster_times: dict[int, ClusterSeconds] = {}
    engine_envs: dict[int, dict[str, str]] = {}
    for n in workers:
        one_thread = {"OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1",
                      "TF_NUM_INTEROP_THREADS": "1"} if bind_to == "core" else {}
        with MPICluster(n=n, bind_to=bind_to, map_by=map_by,
                        env={**one_thread, **(env or {})}) as cluster:
            engine_envs[n] = effective_engine_env(cluster)
            say(f"{n} MPI engine(s) up in {cluster.start_seconds or 0.0:.1f} s; timing")
            for m in modes:
                for r in range(repeats):
                    order = list(pipelines) if r % 2 == 0 else list(pipelines)[::-1]
                    for p in order:
                        cfg = asdict(StepConfig(arch, image_size, batch_size, steps,
                                                warmup_steps, tfrecords=str(tfrecords),
                                                pipeline=p, accelerator_ms=m))
                        res = cluster.run(throughput_on_engine, cfg, stream_rank0=False)
                        rate = res[0]["img_per_s"]
                        runs[m][p].setdefault(n, []).append(rate)
                        kind = f"emulated {m:g} ms accelerator" if m else "CPU model"
                        say(f"{n} worker(s), {p} pipeline, {kind}: {rate:.1f} img/s")
        cluster_times[n] = ClusterSeconds(start_s=cluster.start_seconds or 0.0,
                                          stop_s=cluster.stop_seconds or 0.0)

    return ScalingResult(
        workers=list(workers), pipelines=list(pipelines), arch=arch, image_size=image_size,
        batch_size_per_worker=batch_size, steps=steps, warmup_steps=warmup_steps,
        repeats=repeats, bind_to=bind_to, cores=usable_cores(), env=dict(env or {}),
        tfrecords=str(tfrecords), cpu=ScalingBlock(runs[0.0]), engine_env=engine_envs,
        cluster_seconds=cluster_times,
        emulated=ScalingBlock(runs[modes[-1]], accelerator_ms=modes[-1]) if accelerator_ms
        else None)


OPTIONS: dict[str, Option] = {
    "workers": Option("--workers", "comma list of worker counts", "LIST"),
    "pipelines": Option("--pipelines", "comma list of the pipelines to time: old, new", "LIST"),
    "arch": Option("--arch", "the model each worker trains"),
    "image_size": Option("--image-size", "model input side", "PX"),
    "batch_size": Option("--batch-size", "images per batch per worker", "N"),
    "steps": Option("--steps", "timed steps per run", "N"),
    "warmup_steps": Option("--warmup", "untimed steps before each run (enough for the old "
                                       "pipeline's prefetched batches to run out)", "N"),
    "repeats": Option("--repeats", "runs per setting", "N"),
    "bind_to": Option("--bind-to", "mpiexec --bind-to (none = unbound)"),
    "map_by": Option("--map-by", "mpiexec --map-by, e.g. socket"),
    "accelerator_ms": Option("--emulate-accelerator", "also time an emulated accelerator taking "
                                                      "MS per step (the CPU only feeds it), "
                                                      "e.g. 20", "MS"),
}
"""``bench scaling``'s options from :func:`bench_scaling`'s parameters; ``--tfrecords`` (made
if missing) and ``--env`` (``KEY=VALUE``, repeatable) by hand."""


def env_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` -> dict; a clear error for anything else."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not key.replace("_", "").isalnum():
            raise SystemExit(f"--env expects KEY=VALUE, got {pair!r}")
        env[key] = value
    return env


def _arguments(parser: argparse.ArgumentParser) -> None:
    tfrecords_argument(parser)
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="engine environment variable, repeatable (e.g. "
                             "OMPI_MCA_mpi_yield_when_idle=0 to let MPI spin)")


def _run(args: argparse.Namespace, log: Callable[[str], None]) -> ScalingResult:
    return bench_scaling(full_size_tfrecords(args.tfrecords), env=env_pairs(args.env), log=log,
                         **option_values(args, OPTIONS))


COMMAND = BenchCommand("Horovod images/s on 1..N MPI engines, old vs new", bench_scaling,
                       OPTIONS, _run, _arguments)
