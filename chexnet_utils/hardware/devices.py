"""One process per accelerator: pin each Horovod process to its own GPU (or CPU share).

The source articles' rule: exactly one training process per GPU. Several processes on one
GPU fight over it and each reserves memory (a TensorFlow 1.13.1 bug started several per GPU).
The standard recipe pins process ``local_rank`` (its index among the processes on the same
machine) to GPU ``local_rank``. On a CPU-only machine the equivalent is a thread budget:
each of the ``local_size`` processes gets ``cores // local_size`` threads, so they do not
oversubscribe the cores.

Must be called before TensorFlow creates any tensor (devices cannot change afterwards).

How many workers a node gets (:func:`worker_plan`): one per
*visible* GPU when there are GPUs (``CUDA_VISIBLE_DEVICES`` decides which are visible, as it
does for CUDA itself; :func:`visible_gpus`), else one per usable core, up to the scale's
``max_workers``. Counting GPUs here needs no TensorFlow: NVML (``nvidia-ml-py``) or
``nvidia-smi -L`` lists them, so a notebook kernel can decide without touching a GPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chexnet_utils.platform.lazy import lazy_module

# TensorFlow: imported on first use (chexnet_utils.platform.lazy)
tf = lazy_module("tensorflow")


@dataclass(frozen=True)
class Placement:
    """What :func:`pin_process` decided for this process."""

    device: str
    """``'GPU:<i>'`` or ``'CPU'``."""
    threads: int | None
    """Intra-op thread budget on CPU, ``None`` on GPU (TensorFlow's default)."""
    local_rank: int
    local_size: int


def usable_cpus() -> tuple[int, ...]:
    """The cores this process may run on, sorted (``os.sched_getaffinity``: respects taskset /
    cgroup pinning, unlike ``os.cpu_count``); all of ``os.cpu_count()`` where the platform
    cannot say."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """How many cores this process may run on (:func:`usable_cpus`)."""
    return len(usable_cpus())


def cpu_thread_budget(local_size: int, cores: int | None = None) -> int:
    """Threads per process when ``local_size`` processes share ``cores`` cores (at least 1)."""
    if local_size < 1:
        raise ValueError(f"local_size must be >= 1, got {local_size}")
    return max(1, (cores or usable_cores()) // local_size)


def pin_process(local_rank: int, local_size: int, memory_growth: bool = True) -> Placement:
    """Pin this process to GPU ``local_rank``, or give it its share of the CPU cores.

    GPU path (runs only where TensorFlow sees GPUs; not exercised in CPU-only CI): makes
    exactly one GPU visible, so every later ``tf`` op lands there, and turns on memory growth
    so the process does not reserve the whole card. Raises ``RuntimeError`` if there are
    fewer GPUs than local processes (that would put two processes on one GPU).
    """
    if not 0 <= local_rank < local_size:
        raise ValueError(f"local_rank {local_rank} outside 0..{local_size - 1}")
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        if len(gpus) < local_size:
            raise RuntimeError(
                f"{local_size} processes on this node but only {len(gpus)} GPU(s) visible "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}):"
                f" start one process per GPU (mpirun -np {len(gpus)} per node; "
                f"devices.worker_plan counts them)")
        gpu = gpus[local_rank]
        tf.config.set_visible_devices(gpu, "GPU")
        if memory_growth:
            tf.config.experimental.set_memory_growth(gpu, True)
        return Placement(f"GPU:{local_rank}", None, local_rank, local_size)
    threads = cpu_thread_budget(local_size)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))
    except RuntimeError:
        pass  # TensorFlow already initialised its thread pools; keep what it has
    return Placement("CPU", threads, local_rank, local_size)


# ---------------------------------------------------------------------------------------
# Which GPUs this process may use, and how many workers a node gets
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuDevice:
    """One NVIDIA GPU as the driver lists it (``nvidia-smi -L`` order, NVML index)."""

    index: int
    name: str
    uuid: str
    """``GPU-xxxxxxxx-...`` (what ``CUDA_VISIBLE_DEVICES`` may name instead of the index)."""
    mig_uuids: tuple[str, ...] = ()
    """``MIG-...`` instances carved out of this GPU (A100/H100 MIG mode), if any."""


_SMI_GPU = re.compile(r"^GPU\s+(\d+):\s*(.*?)\s*\(UUID:\s*(GPU-[^)\s]+)\)")
_SMI_MIG = re.compile(r"^\s+MIG\b.*\(UUID:\s*(MIG-[^)\s]+)\)")


def parse_nvidia_smi_list(text: str) -> list[GpuDevice]:
    """GPUs in the output of ``nvidia-smi -L``::

        GPU 0: Tesla V100-SXM2-16GB (UUID: GPU-3f5f...)
          MIG 1g.5gb     Device  0: (UUID: MIG-...)      (MIG instances, if enabled)
    """
    gpus: list[GpuDevice] = []
    for line in text.splitlines():
        m = _SMI_GPU.match(line.strip())
        if m:
            gpus.append(GpuDevice(int(m.group(1)), m.group(2), m.group(3)))
            continue
        mig = _SMI_MIG.match(line)
        if mig and gpus:
            last = gpus[-1]
            gpus[-1] = GpuDevice(last.index, last.name, last.uuid,
                                 (*last.mig_uuids, mig.group(1)))
    return gpus


class NvmlUnavailable(RuntimeError):
    """NVML cannot be asked: ``nvidia-ml-py`` is not installed or the driver does not answer."""


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_inventory(nvml: Any | None = None) -> list[GpuDevice]:
    """Every GPU NVML lists (index, name, UUID), NVML shut down again afterwards.

    ``nvml`` replaces the ``pynvml`` module (tests pass a fake). Raises
    :class:`NvmlUnavailable` with the reason when the package is missing or ``nvmlInit``
    fails (no driver library: a CPU machine); errors while listing propagate.
    """
    if nvml is None:
        try:
            import pynvml  # nvidia-ml-py
        except ImportError:
            raise NvmlUnavailable("the nvidia-ml-py package is not installed") from None
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception as e:  # pynvml.NVMLError: no driver library, no device, ...
        raise NvmlUnavailable(str(e) or type(e).__name__) from e
    try:
        found = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = nvml.nvmlDeviceGetUUID(handle) if hasattr(nvml, "nvmlDeviceGetUUID") else ""
            found.append(GpuDevice(i, _text(nvml.nvmlDeviceGetName(handle)), _text(uuid)))
        return found
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def run_nvidia_smi(args: Sequence[str],
                   run: Callable[..., subprocess.CompletedProcess[str]] | None = None
                   ) -> str | None:
    """The standard output of ``nvidia-smi *args``, or ``None`` when there is no
    ``nvidia-smi``, it cannot be started, times out (30 s) or fails (no GPU / no driver).
    ``run`` replaces :func:`subprocess.run` (tests)."""
    if run is None:
        if shutil.which("nvidia-smi") is None:
            return None
        run = subprocess.run
    try:
        out = run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def physical_gpus(run: Callable[..., subprocess.CompletedProcess[str]] | None = None
                  ) -> list[GpuDevice]:
    """Every NVIDIA GPU the driver sees (ignoring ``CUDA_VISIBLE_DEVICES``): NVML first,
    else ``nvidia-smi -L``; ``[]`` when neither answers (no driver: a CPU machine).

    ``run`` replaces :func:`subprocess.run` (tests); passing it skips NVML.
    """
    if run is None:
        try:
            return nvml_inventory()
        except Exception:  # NvmlUnavailable, or NVML failed while listing
            pass
    text = run_nvidia_smi(["-L"], run)
    return parse_nvidia_smi_list(text) if text is not None else []


def visible_gpus(env: Mapping[str, str] | None = None,
                 physical: Sequence[GpuDevice] | None = None) -> list[GpuDevice]:
    """The GPUs a CUDA program started with ``env`` (default: this environment) can use,
    in the order it numbers them.

    ``CUDA_VISIBLE_DEVICES`` as CUDA reads it: unset, every GPU; empty (or blank), none; else
    a comma list of indices (``0,2``), GPU UUIDs or unique UUID prefixes (``GPU-3f5f``) or MIG
    UUIDs. The list ends at the first entry that names no GPU (``-1``, an index out of range,
    an unknown UUID): ``"-1"`` hides every GPU, ``"0,-1,1"`` leaves only GPU 0. An entry
    named twice counts once. ``physical`` defaults to :func:`physical_gpus`.
    """
    env = os.environ if env is None else env
    gpus = list(physical_gpus() if physical is None else physical)
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return gpus
    chosen: list[GpuDevice] = []
    for token in (t.strip() for t in spec.split(",")):
        gpu = _lookup_gpu(token, gpus)
        if gpu is None:
            break
        if gpu not in chosen:
            chosen.append(gpu)
    return chosen


def _lookup_gpu(token: str, gpus: Sequence[GpuDevice]) -> GpuDevice | None:
    if not token:
        return None
    if re.fullmatch(r"[+-]?\d+", token):
        i = int(token)
        return gpus[i] if 0 <= i < len(gpus) else None
    if token.startswith("MIG-"):
        owners = [g for g in gpus if any(m.startswith(token) for m in g.mig_uuids)]
        # each MIG instance is its own device; represent it by its parent's record
        return GpuDevice(owners[0].index, owners[0].name, token) if len(owners) == 1 else None
    matches = [g for g in gpus if g.uuid.startswith(token)]
    return matches[0] if len(matches) == 1 else None


@dataclass(frozen=True)
class WorkerPlan:
    """How many Horovod workers to start on this node, and on what (:func:`worker_plan`)."""

    n: int
    """Workers (MPI engines) to start."""
    device: str
    """``"GPU"``: one worker per GPU, pinned by local rank. ``"CPU"``: a share of the cores."""
    gpus: int
    """Visible GPUs."""
    cores: int
    """Usable cores of this process."""
    reason: str
    """One sentence saying why, for the notebook's output."""
    engine_env: dict[str, str] = field(default_factory=dict)
    """Variables the engines need on top of this environment (``{}`` unless GPUs must be
    hidden from CPU workers)."""


def worker_plan(max_workers: int, min_workers: int = 1, gpus: int | None = None,
                cores: int | None = None) -> WorkerPlan:
    """The node's worker count: one per visible GPU, else one per usable core.

    * At least ``min_workers`` GPUs visible: ``min(gpus, max_workers)`` GPU workers (one
      process per GPU; ``max_workers`` is the scale's ceiling).
    * No GPU: ``min(max_workers, max(min_workers, cores))`` CPU workers (what notebooks 04
      and 05 always did: a 2-core laptop at the ``ci`` scale gets 2).
    * Some GPUs, but fewer than ``min_workers`` (a one-GPU workstation and a notebook that
      needs two workers): CPU workers as above, with the GPUs hidden from them
      (``engine_env = {"CUDA_VISIBLE_DEVICES": ""}``): two processes pinned by local rank to
      one GPU would fail, and sharing one GPU is what the articles warn against.

    ``gpus`` defaults to ``len(visible_gpus())``, ``cores`` to :func:`usable_cores`.
    """
    if max_workers < 1 or min_workers < 1:
        raise ValueError(f"max_workers and min_workers must be >= 1, got {max_workers}, "
                         f"{min_workers}")
    gpus = len(visible_gpus()) if gpus is None else gpus
    cores = usable_cores() if cores is None else cores
    if gpus >= min_workers:
        n = max(min_workers, min(gpus, max_workers))
        return WorkerPlan(n, "GPU", gpus, cores,
                          f"{gpus} GPU(s) visible: {n} worker(s), one process per GPU "
                          f"pinned by local rank (scale limit {max_workers})")
    n = min(max_workers, max(min_workers, cores))
    if gpus == 0:
        return WorkerPlan(n, "CPU", 0, cores,
                          f"no GPU visible: {n} CPU worker(s) on {cores} core(s) "
                          f"(scale limit {max_workers})")
    return WorkerPlan(n, "CPU", gpus, cores,
                      f"{gpus} GPU(s) visible, fewer than the {min_workers} workers needed: "
                      f"{n} CPU worker(s) on {cores} core(s), GPUs hidden from them",
                      {"CUDA_VISIBLE_DEVICES": ""})
