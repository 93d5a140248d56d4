"""One process per accelerator: pin each Horovod process to its own GPU (or CPU share).

The source articles' rule: exactly one training process per GPU. Several processes on one
GPU fight over it and each reserves memory (a TensorFlow 1.13.1 bug started several per GPU).
The standard recipe pins process ``local_rank`` (its index among the processes on the same
machine) to GPU ``local_rank``. On a CPU-only machine the equivalent is a thread budget:
each of the ``local_size`` processes gets ``cores // local_size`` threads, so they do not
oversubscribe the cores.

Must be called before TensorFlow creates any tensor (devices cannot change afterwards).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """What :func:`pin_process` decided for this process."""

    device: str
    """``'GPU:<i>'`` or ``'CPU'``."""
    threads: int | None
    """Intra-op thread budget on CPU, ``None`` on GPU (TensorFlow's default)."""
    local_rank: int
    local_size: int


def usable_cores() -> int:
    """Cores this process may run on (respects taskset / cgroup affinity)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


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
    import tensorflow as tf

    if not 0 <= local_rank < local_size:
        raise ValueError(f"local_rank {local_rank} outside 0..{local_size - 1}")
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        if len(gpus) < local_size:
            raise RuntimeError(
                f"{local_size} processes on this node but only {len(gpus)} GPU(s): start one "
                f"process per GPU (mpirun -np {len(gpus)} per node)")
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
