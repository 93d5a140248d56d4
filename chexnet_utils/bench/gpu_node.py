"""The GPU-node report: CheXNet images/s on 1..N GPUs, speed-up and efficiency, next to
published reference points; and GPU utilisation with the old vs the new pipeline.

``python -m chexnet_utils bench gpu-node --gpus 1,2,4,8`` runs :func:`bench_gpu_node`: for
each GPU count ``k`` it starts ``k`` MPI engines (one process per GPU, pinned by local rank,
bound to the cores of its GPU's socket: :mod:`chexnet_utils.hardware.gpu_topology`), trains
DenseNet-121 at 224 px with the new pipeline for a number of timed steps
(:func:`gpu_throughput_on_engine`: mixed precision and XLA as
:mod:`chexnet_utils.model.accelerator` decides, batches copied to the GPU ahead of time), and
reports the job's images/s, speed-up and efficiency per GPU count as a :class:`GpuNodeResult`
(``print(result)``: the table, then :data:`REFERENCES`). This is the measurement behind the
Dell articles' figure (images/s on 1, 2, 3, 4 and 8 V100s). Without a GPU it raises
:class:`NoGPUError` before doing anything.

:func:`utilisation_old_vs_new` trains on one GPU with each pipeline while
:class:`~chexnet_utils.hardware.gpu_monitor.UtilisationSampler` records the GPU's utilisation: the
articles' "utilisation jumps between 0 % and 90 %", and what the new pipeline makes of it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chexnet_utils.bench.engine_steps import StepConfig
from chexnet_utils.bench.registry import BenchCommand, full_size_tfrecords, tfrecords_argument
from chexnet_utils.bench.scaling import efficiency, prepare_data_parallel_model
from chexnet_utils.comm.collectives import barrier
from chexnet_utils.input.pipelines import Pipeline
from chexnet_utils.model.architectures import FULL_SIZE_ARCHITECTURES, Architecture
from chexnet_utils.platform.lazy import lazy_module
from chexnet_utils.platform.options import Option, option_values
from chexnet_utils.platform.timing import barrier_windows

# Horovod, Keras: imported on first use (chexnet_utils.platform.lazy)
hvd = lazy_module("horovod.tensorflow")
keras = lazy_module("keras")

ARTICLE_GPU_COUNTS = (1, 2, 3, 4, 8)
"""The GPU counts of the Dell articles' figure (two PowerEdge C4140 nodes, 4 V100 each)."""

REFERENCES: tuple[dict[str, str], ...] = (
    {"what": "CheXNet (DenseNet-121) on 1, 2, 3, 4, 8 V100, old vs new input pipeline",
     "value": "shape only: old pipeline flat, new pipeline nearly linear; bare metal about "
              "8 % faster than Kubernetes at 8 GPUs (no images/s published)",
     "machine": "2 x Dell PowerEdge C4140, 4 x V100 each, EDR InfiniBand",
     "source": "Dell EMC HPC & AI Innovation Lab blog posts on CheXNet training, Oct 2019"},
    {"what": "ResNet-50 v1.5 training, TensorFlow, 1 -> 8 V100 16 GB",
     "value": "FP32+XLA 412 -> 3170 img/s (batch 128/GPU, speed-up 7.69x); mixed precision+XLA "
              "1270 -> 9510 img/s (batch 256/GPU, 7.48x)",
     "machine": "NVIDIA DGX-1 (8 x V100 16 GB), NGC TensorFlow 20.06-tf1 container",
     "source": "NVIDIA DeepLearningExamples, TensorFlow/Classification/ConvNets/resnet50v1.5/"
               "README.md, 'Training performance: NVIDIA DGX-1 (8x V100 16G)'"},
    {"what": "Horovod scaling efficiency on 512 GPUs",
     "value": "90 % for Inception V3 and ResNet-101, 68 % for VGG-16",
     "machine": "128 servers x 4 Pascal GPUs, 25 Gbit/s RoCE",
     "source": "Horovod documentation, docs/benchmarks.rst (Horovod: Sergeev & Del Balso, "
               "arXiv:1802.05799, 2018)"},
)
"""Reference points printed beside a measurement: each is a published figure with its source
and machine, never a number measured here. (No published V100 training rate of DenseNet-121
is cited: measure yours with notebook 03 or this report.)"""


class NoGPUError(RuntimeError):
    """No NVIDIA GPU is visible to this process (the message says why)."""


def no_gpu_reason() -> str:
    """Why no GPU is visible: ``CUDA_VISIBLE_DEVICES`` hides them, or no driver answered."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    return ("CUDA_VISIBLE_DEVICES hides them" if cvd is not None and cvd.strip() in ("", "-1")
            else "no NVIDIA driver answered (NVML / nvidia-smi)")


def no_gpu_message(reason: str = "") -> str:
    """``no NVIDIA GPU visible: <reason>; ...`` for the CLI and the notebooks."""
    why = reason or no_gpu_reason()
    return (f"no NVIDIA GPU visible: {why}. The gpu-node report trains on GPUs only; on this "
            "machine use `python -m chexnet_utils bench scaling` (CPU workers, optionally with "
            "an emulated accelerator)")


def gpu_counts(visible: int, requested: Sequence[int] | None = None) -> list[int]:
    """The GPU counts to measure: ``requested`` (checked against ``visible``) or the
    articles' 1, 2, 3, 4, 8 up to ``visible``, plus ``visible`` itself."""
    if visible < 1:
        raise NoGPUError(no_gpu_message())
    if requested is None:
        counts = [k for k in ARTICLE_GPU_COUNTS if k <= visible]
        return counts + ([visible] if visible not in counts else [])
    counts = sorted(set(int(k) for k in requested))
    if not counts or counts[0] < 1:
        raise ValueError(f"GPU counts must be >= 1, got {list(requested)}")
    if counts[-1] > visible:
        raise ValueError(f"asked for {counts[-1]} GPUs but {visible} are visible "
                         "(CUDA_VISIBLE_DEVICES="
                         f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})")
    if counts[0] != 1:
        raise ValueError("the GPU counts must include 1: speed-up and efficiency are "
                         "relative to one GPU")
    return counts


def gpu_throughput_on_engine(cfg: StepConfig | dict[str, Any]) -> dict[str, Any]:
    """Run on every Horovod worker: ``steps`` timed data-parallel training steps on its GPU,
    fed by ``cfg.pipeline`` over ``cfg.tfrecords`` (a
    :class:`~chexnet_utils.bench.engine_steps.StepConfig`; ``batch_size`` is per GPU).

    Like :func:`chexnet_utils.bench.scaling.throughput_on_engine` (same barrier-to-barrier clock,
    same gradient averaging and broadcast), with the GPU settings: the model built and
    compiled with :func:`~chexnet_utils.model.accelerator.resolve_switches`' mixed precision and
    XLA, and the new pipeline's batches copied to the GPU ahead of time. Returns the rank,
    world size, the job's images/s, the switches and the timed window (``time.time()``).
    """
    c = StepConfig.of(cfg)
    if c.rank_cpus:
        from chexnet_utils.hardware.gpu_topology import bind_this_process

        local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
        bind_this_process(c.rank_cpus[local])

    from chexnet_utils.data.tfrecords import list_shards
    from chexnet_utils.input.pipelines import build_pipeline, training_feed
    from chexnet_utils.model.accelerator import build_model, resolve_switches
    from chexnet_utils.training.dataparallel import init_world

    rank, size = init_world(True)
    sw = resolve_switches(c.mixed_precision, c.xla, distributed=True)
    keras.utils.set_random_seed(c.seed)
    model = build_model(c.arch, c.image_size, mixed_precision=sw.mixed_precision)
    prepare_data_parallel_model(model, size, jit_compile=sw.xla)
    shuffle = {} if c.shuffle_buffer is None else {"shuffle_buffer": c.shuffle_buffer}
    assert c.tfrecords is not None, "a pipeline-fed timer needs cfg.tfrecords"
    ds = build_pipeline(c.pipeline, list_shards(c.tfrecords, "train"), c.batch_size,
                        c.image_size, training=True, num_workers=size, worker_index=rank,
                        seed=c.seed, **shuffle)
    it = iter(training_feed(c.pipeline, ds, sw.device_feed))  # as train() feeds it

    seconds, wall0 = barrier_windows(lambda: model.train_on_batch(*next(it)),
                                     lambda: barrier(hvd, "gpu_bench_barrier"), c.steps,
                                     warmup_steps=c.warmup_steps)[0]
    return {"rank": rank, "size": size, "seconds": seconds,
            "img_per_s": c.steps * c.batch_size * size / seconds, "pipeline": c.pipeline,
            "mixed_precision": sw.mixed_precision, "xla": sw.xla,
            "device_feed": sw.device_feed, "why": sw.why,
            "window": [wall0, wall0 + seconds]}


RunOnGpus = Callable[[int, StepConfig], Mapping[str, Any]]
"""``run(k, cfg)`` trains on ``k`` GPUs and returns rank 0's result (tests pass a fake)."""


def cluster_runner(binding_args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                   timeout: float | None = 3600) -> RunOnGpus:
    """The real :data:`RunOnGpus`: a fresh :class:`~chexnet_utils.cluster.distributed.MPICluster`
    of ``k`` engines per count, started with ``binding_args`` (``mpirun`` mapping/binding)."""
    from chexnet_utils.cluster.distributed import MPICluster

    def run(k: int, cfg: StepConfig) -> Mapping[str, Any]:
        with MPICluster(n=k, mpi_args=list(binding_args), env=dict(env or {})) as cluster:
            return cluster.run(gpu_throughput_on_engine, asdict(cfg), timeout=timeout,
                               stream_rank0=False)[0]

    return run


def _binding_for(k: int, topology: str | None, visible: Sequence[int]) -> tuple[
        tuple[str, ...], tuple[tuple[int, ...], ...], str]:
    from chexnet_utils.hardware.gpu_topology import binding_plan, parse_topology

    if not topology:
        return (), (), "no `nvidia-smi topo -m` output: mpirun's default placement"
    plan = binding_plan(parse_topology(topology), k, visible=visible)
    return plan.mpirun_args, plan.rank_cpus if plan.self_bind else (), plan.explanation


@dataclass(frozen=True)
class GpuNodeResult:
    """:func:`bench_gpu_node`'s report: CheXNet training images/s on each GPU count of this
    node, with speed-up and efficiency relative to one GPU, beside published reference
    points. ``str(result)`` is the articles' figure as a table; :meth:`as_dict` the
    ``--json`` file."""

    gpus: list[int]
    """The GPU counts measured, in order (always including 1)."""
    gpu_names: list[str]
    """Names of the visible GPUs."""
    arch: Architecture
    """Model architecture trained."""
    image_size: int
    """Image side in pixels."""
    batch_size_per_gpu: int
    """Images per step on each GPU."""
    pipeline: Pipeline
    """The input pipeline that fed the GPUs."""
    steps: int
    """Timed steps per GPU count."""
    warmup_steps: int
    """Untimed steps before the clock starts."""
    runs: dict[int, dict[str, Any]]
    """Per GPU count, rank 0's result of :func:`gpu_throughput_on_engine` (``img_per_s`` of
    the whole job, ``seconds``, ``mixed_precision``, ``xla``, ...) plus the ``mpirun_args``
    and the ``binding`` explanation its engines were started with."""
    references: list[dict[str, str]] = field(
        default_factory=lambda: [dict(r) for r in REFERENCES])
    """The published reference points printed beside the measurement (:data:`REFERENCES`)."""

    @property
    def img_per_s(self) -> dict[int, float]:
        """Images/s of the whole job per GPU count."""
        return {k: float(self.runs[k]["img_per_s"]) for k in self.gpus}

    @property
    def speedup(self) -> dict[int, float]:
        """``rate(k) / rate(1)`` per GPU count."""
        rates = self.img_per_s
        return {k: r / rates[1] for k, r in rates.items()}

    @property
    def efficiency(self) -> dict[int, float]:
        """``rate(k) / (k * rate(1))`` per GPU count (1.0: linear scaling)."""
        return efficiency(self.img_per_s)

    @property
    def mixed_precision(self) -> bool | None:
        """Whether the first count's run trained in mixed precision (``None``: not
        reported)."""
        return self.runs[self.gpus[0]].get("mixed_precision")

    @property
    def xla(self) -> bool | None:
        """Whether the first count's run compiled with XLA (``None``: not reported)."""
        return self.runs[self.gpus[0]].get("xla")

    def as_dict(self) -> dict[str, Any]:
        """The ``--json`` layout: the parameters, ``mixed_precision``, ``xla``, then
        ``img_per_s``, ``speedup``, ``efficiency`` and ``runs`` per GPU count (int keys here,
        strings once written as JSON) and the ``references``."""
        return {
            "gpus": list(self.gpus), "gpu_names": list(self.gpu_names), "arch": self.arch,
            "image_size": self.image_size, "batch_size_per_gpu": self.batch_size_per_gpu,
            "pipeline": self.pipeline, "steps": self.steps, "warmup_steps": self.warmup_steps,
            "mixed_precision": self.mixed_precision, "xla": self.xla,
            "img_per_s": self.img_per_s, "speedup": self.speedup, "efficiency": self.efficiency,
            "runs": {k: dict(r) for k, r in self.runs.items()},
            "references": [dict(r) for r in self.references],
        }

    def __str__(self) -> str:
        """The articles' figure as a table (GPUs, images/s, speed-up, efficiency), then the
        reference points, each labelled with its source and machine."""
        names = sorted(set(self.gpu_names)) or ["?"]
        onoff = {True: "on", False: "off", None: "?"}
        lines = [f"CheXNet {self.arch} at {self.image_size} px, batch {self.batch_size_per_gpu} "
                 f"per GPU, {self.pipeline} pipeline, mixed precision "
                 f"{onoff[self.mixed_precision]}, XLA {onoff[self.xla]}; measured on this node "
                 f"({', '.join(names)})",
                 f"{'GPUs':>5} {'images/s':>10} {'speed-up':>9} {'efficiency':>11}"]
        rates, speedup, eff = self.img_per_s, self.speedup, self.efficiency
        for k in self.gpus:
            lines.append(f"{k:>5} {rates[k]:>10.1f} {speedup[k]:>8.2f}x {eff[k]:>10.0%}")
        lines.append("reference points (published, not measured here):")
        for ref in self.references:
            lines.append(f"  - {ref['what']}: {ref['value']}\n"
                         f"    machine: {ref['machine']}\n    source: {ref['source']}")
        return "\n".join(lines)


def bench_gpu_node(tfrecords: Path | str, gpus: Sequence[int] | None = None, *,
                   arch: Architecture = "densenet121", image_size: int = 224,
                   batch_size: int | None = None, steps: int = 50, warmup_steps: int = 20,
                   pipeline: Pipeline = "new", mixed_precision: bool | None = None,
                   xla: bool | None = None, visible: Sequence[Any] | None = None,
                   topology: str | None = None, run: RunOnGpus | None = None,
                   log: Callable[[str], None] | None = None) -> GpuNodeResult:
    """Images/s, speed-up and efficiency of CheXNet training on each GPU count
    (a :class:`GpuNodeResult`: ``result.efficiency[4]``, ``print(result)``).

    ``visible`` defaults to :func:`chexnet_utils.hardware.devices.visible_gpus` (raises
    :class:`NoGPUError` when empty), ``gpus`` to :func:`gpu_counts`, ``batch_size`` to the
    ``gpu-node`` scale's per-GPU batch, ``topology`` to ``nvidia-smi topo -m`` (each count's
    engines are bound to their GPUs' sockets), ``run`` to :func:`cluster_runner`.
    ``xla=True`` also sets ``HOROVOD_ENABLE_XLA_OPS=1`` for the engines.
    """
    from chexnet_utils import config
    from chexnet_utils.hardware import devices
    from chexnet_utils.hardware.gpu_topology import read_topology

    found = list(devices.visible_gpus() if visible is None else visible)
    counts = gpu_counts(len(found), gpus)
    if batch_size is None:
        batch_size = config.scale("gpu-node").batch_size
    say = log or (lambda msg: None)
    if topology is None and run is None:
        topology = read_topology()
    physical = [getattr(g, "index", i) for i, g in enumerate(found)]
    runs: dict[int, dict[str, Any]] = {}
    for k in counts:
        args, rank_cpus, explanation = _binding_for(k, topology, physical)
        cfg = StepConfig(arch, image_size, batch_size, steps, warmup_steps,
                         tfrecords=str(tfrecords), pipeline=pipeline,
                         mixed_precision=mixed_precision, xla=xla, rank_cpus=rank_cpus)
        runner = run or cluster_runner(args, {"HOROVOD_ENABLE_XLA_OPS": "1"} if xla else None)
        runs[k] = {**runner(k, cfg), "mpirun_args": list(args), "binding": explanation}
        say(f"{k} GPU(s): {float(runs[k]['img_per_s']):.1f} img/s")
    return GpuNodeResult(gpus=counts, gpu_names=[getattr(g, "name", str(g)) for g in found],
                         arch=arch, image_size=image_size, batch_size_per_gpu=batch_size,
                         pipeline=pipeline, steps=steps, warmup_steps=warmup_steps, runs=runs)


ARCHS: tuple[str, ...] = FULL_SIZE_ARCHITECTURES
"""The archs notebook 04's GPU cell scales side by side: the article found ResNet-50 scaled
out better than DenseNet-121 (notebook 03 §1.1: bytes per FLOP alone predict the opposite)."""


def format_arch_comparison(tables: Mapping[str, GpuNodeResult]) -> str:
    """One row per GPU count, images/s and efficiency of each arch side by side, from
    :func:`bench_gpu_node` results keyed by arch (all over the same GPU counts)."""
    archs = list(tables)
    counts = [k for k in tables[archs[0]].gpus if all(k in t.gpus for t in tables.values())]
    rates = {a: t.img_per_s for a, t in tables.items()}
    eff = {a: t.efficiency for a, t in tables.items()}
    head = f"{'GPUs':>5}" + "".join(f" {a + ' img/s':>18} {'eff.':>6}" for a in archs)
    lines = [head]
    for k in counts:
        lines.append(f"{k:>5}" + "".join(f" {rates[a][k]:>18.1f} {eff[a][k]:>6.0%}"
                                         for a in archs))
    return "\n".join(lines)


def utilisation_old_vs_new(tfrecords: Path | str, *, arch: Architecture = "densenet121",
                           image_size: int = 224, batch_size: int = 32, steps: int = 100,
                           warmup_steps: int = 10, interval: float = 0.1,
                           pipelines: Sequence[Pipeline] = ("old", "new"),
                           nvml: Any | None = None, run: RunOnGpus | None = None
                           ) -> dict[str, Any]:
    """Train on one GPU with each pipeline while NVML samples the GPU's utilisation.

    Returns ``{pipeline: {"samples": [...], "summary": {...}, "img_per_s": ...,
    "window": [start, end]}}`` with times in seconds since that pipeline's sampling started
    (``window``: the timed steps). Raises :class:`NoGPUError` (the
    :func:`~chexnet_utils.hardware.gpu_monitor.nvml_status` sentence) without a GPU.
    """
    from chexnet_utils.hardware.gpu_monitor import (
        UtilisationSampler,
        as_dicts,
        nvml_status,
        summarise,
    )

    status = nvml_status(nvml)
    if not status.available:
        raise NoGPUError(status.reason)
    runner = run or cluster_runner()
    out: dict[str, Any] = {}
    for p in pipelines:
        cfg = StepConfig(arch, image_size, batch_size, steps, warmup_steps,
                         tfrecords=str(tfrecords), pipeline=p)
        sampler = UtilisationSampler(interval, nvml=nvml, clock=time.time)
        with sampler:
            res = dict(runner(1, cfg))
        window = [w - sampler.t0 for w in res.get("window", [sampler.t0, sampler.t0])]
        out[p] = {"samples": as_dicts(sampler.samples), "summary": summarise(sampler.samples),
                  "img_per_s": float(res["img_per_s"]), "window": window}
    return out


OPTIONS: dict[str, Option] = {
    "gpus": Option("--gpus", "comma list of GPU counts, with 1 (default: 1,2,3,4,8 up to the "
                             "visible GPUs, and their number)", "LIST"),
    "arch": Option("--arch", "the model"),
    "image_size": Option("--image-size", "model input side", "PX"),
    "batch_size": Option("--batch-size", "per GPU (default: the gpu-node scale's)", "N"),
    "steps": Option("--steps", "timed steps per GPU count", "N"),
    "warmup_steps": Option("--warmup", "untimed steps first", "N"),
    "pipeline": Option("--pipeline", "the input pipeline"),
}
"""``bench gpu-node``'s options from :func:`bench_gpu_node`'s parameters; ``--tfrecords``,
``--mixed-precision`` and ``--xla`` (auto, on, off) by hand."""


def _arguments(parser: argparse.ArgumentParser) -> None:
    tfrecords_argument(parser)
    for switch, what in (("--mixed-precision", "mixed_float16 (auto: on with a GPU)"),
                         ("--xla", "jit_compile (auto: on only with HOROVOD_ENABLE_XLA_OPS=1 "
                                   "under Horovod; on sets it for the engines)")):
        parser.add_argument(switch, default="auto", choices=("auto", "on", "off"), help=what)


def _run(args: argparse.Namespace, log: Callable[[str], None]) -> GpuNodeResult | int:
    from chexnet_utils.hardware import devices
    from chexnet_utils.model.accelerator import parse_switch

    visible = devices.visible_gpus()
    plan = devices.worker_plan(max(1, len(visible)), gpus=len(visible))
    if plan.device != "GPU":
        print(no_gpu_message(), file=sys.stderr)
        return 3
    return bench_gpu_node(
        full_size_tfrecords(args.tfrecords),
        mixed_precision=parse_switch(args.mixed_precision, "--mixed-precision"),
        xla=parse_switch(args.xla, "--xla"), visible=visible, log=log,
        **option_values(args, OPTIONS))


COMMAND = BenchCommand("CheXNet images/s, speed-up and efficiency on 1..N GPUs beside "
                       "published reference points (exit 3 without a GPU)", bench_gpu_node,
                       OPTIONS, _run, _arguments)
