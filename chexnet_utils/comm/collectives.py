"""Engine-side collectives: parameter server vs ring-allreduce, timed on MPI workers.

In data-parallel training every worker computes gradients on its own mini-batch, and before
the weights can be updated the gradients must be **averaged across all workers**. This
module times the two classic ways of doing it on Horovod workers (ipyparallel MPI engines,
see :class:`chexnet_utils.cluster.distributed.MPICluster`);
:mod:`chexnet_utils.comm.costmodel` models the measurements.

Parameter server (PS)
    Every worker sends its whole gradient to one server, the server averages and sends the
    result back. With ``N`` workers the server's link carries ``N x size`` in and ``N x size``
    out per step, so the time grows linearly with ``N``: the server becomes the bottleneck.
    :func:`parameter_server_times` implements it with collectives (gather to rank 0 with
    ``hvd.alltoall``, average on rank 0, ``hvd.broadcast`` back; :func:`ps_average`).

Ring-allreduce (Baidu, used by Horovod)
    No server. The ``N`` workers form a ring and the tensor is cut into ``N`` chunks. In the
    *reduce-scatter* phase each worker sends one chunk to its right neighbour and adds the
    chunk arriving from the left, ``N - 1`` times, after which each worker owns one fully
    summed chunk; in the *allgather* phase the summed chunks travel round the ring, ``N - 1``
    steps again. Each worker sends (and receives) ``2 (N - 1) / N x size`` bytes in total: a
    little less than twice the tensor, *whatever N is*. Every link is busy all the time.
    :func:`allreduce_times` times ``hvd.allreduce`` (on CPU, Horovod hands the reduction to
    MPI's ``MPI_Allreduce``, or Gloo's ring; on GPUs to NCCL).

Also here: tensor fusion and fp16 compression measured (:func:`allreduce_burst_times`,
``allreduce_times(..., compression="fp16")``), an allreduce sweep with the worker's CPU
affinity (:func:`allreduce_scan_on_engine`), the sweeps' tensor sizes
(:func:`message_sizes`, :func:`default_max_bytes`, :func:`format_bytes`) and the small
engine helpers the step timers share (:func:`init_horovod`, :func:`barrier`,
:func:`quiet_tensorflow`, :func:`horovod_compression`).

Everything whose name ends in ``_times`` or ``_on_engine`` runs **on every worker at once**
(``cluster.run(fn, ...)``): it calls ``hvd.init()`` and contains collectives, so running it
on only some workers would hang.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from chexnet_utils.config import SCALES, scale
from chexnet_utils.hardware.devices import usable_cpus
from chexnet_utils.platform.timing import barrier_windows

KIB = 1024
MIB = 1024 * 1024

MAX_MESSAGE_BYTES: dict[str, int] = {name: int(s.comm_max_mb * MIB) for name, s in SCALES.items()}
"""Largest tensor of the size sweeps per scale preset, in bytes: each preset's
:attr:`chexnet_utils.config.Scale.comm_max_mb` (the presets as written; the value in force,
``CHEXNET_COMM_MAX_MB`` applied, is :func:`default_max_bytes`)."""


# ---------------------------------------------------------------------------------------
# Tensor sizes
# ---------------------------------------------------------------------------------------


def default_max_bytes(scale_name: str | None = None) -> int:
    """Largest tensor of the sweeps: the scale preset's ``comm_max_mb`` MiB, or
    ``CHEXNET_COMM_MAX_MB`` if set (:data:`chexnet_utils.config.OVERRIDES`)."""
    return int(scale(scale_name).comm_max_mb * MIB)


def message_sizes(max_bytes: int | None = None, min_bytes: int = KIB, factor: int = 2
                  ) -> list[int]:
    """Tensor sizes in bytes for a sweep: ``min_bytes, min_bytes * factor, ...`` up to
    ``max_bytes`` (included even when it is not a power of ``factor``). Multiples of 4 bytes
    (float32 elements). Default top: :func:`default_max_bytes`."""
    top = default_max_bytes() if max_bytes is None else int(max_bytes)
    if min_bytes < 4 or top < min_bytes or factor < 2:
        raise ValueError(f"need 4 <= min_bytes <= max_bytes and factor >= 2, got "
                         f"{min_bytes}, {top}, {factor}")
    sizes, s = [], int(min_bytes)
    while s <= top:
        sizes.append(s - s % 4)
        s *= factor
    if sizes[-1] != top - top % 4:
        sizes.append(top - top % 4)
    return sizes


def format_bytes(n: float) -> str:
    """``1024 -> '1 KiB'``, ``33554432 -> '32 MiB'`` (binary units, as the sweeps use)."""
    for unit, div in (("GiB", 1024 ** 3), ("MiB", MIB), ("KiB", KIB)):
        if n >= div:
            v = n / div
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.3g} {unit}"
    return f"{n:.0f} B"


# ---------------------------------------------------------------------------------------
# Helpers that run on the engines
# ---------------------------------------------------------------------------------------


def init_horovod() -> Any:
    """``horovod.tensorflow``, initialised (a no-op when it already is)."""
    import horovod.tensorflow as hvd

    hvd.init()
    return hvd


def quiet_tensorflow() -> None:
    import tensorflow as tf

    tf.get_logger().setLevel(logging.ERROR)
    tf.autograph.set_verbosity(0)


def barrier(hvd: Any, name: str = "chexnet_comm_barrier") -> None:
    """Every worker waits for every other (a tiny allreduce named ``name``; its result is
    fetched)."""
    import tensorflow as tf

    hvd.allreduce(tf.constant(0.0), op=hvd.Sum, name=name).numpy()


def _worker_data(n_elems: int, rank: int, seed: int) -> np.ndarray:
    """Different float32 data on every worker (normal, reproducible per rank)."""
    rng = np.random.default_rng([seed, rank, n_elems])
    return rng.standard_normal(n_elems, dtype=np.float32)


def _slowest(hvd: Any, runs: list[list[float]]) -> list[list[float]]:
    """Per-repeat times of the slowest worker (the job waits for it): an allreduce(Max)."""
    import tensorflow as tf

    if not runs or not runs[0]:
        return runs
    arr = tf.constant(np.asarray(runs, dtype=np.float64))
    return hvd.allreduce(arr, op=hvd.Max, name="chexnet_comm_slowest").numpy().tolist()


def horovod_compression(hvd: Any, name: str) -> Any:
    try:
        return {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}[name]
    except KeyError:
        raise ValueError(f"compression must be 'none' or 'fp16', got {name!r}") from None


def _sweep_result(algorithm: str, backend: str, sizes: Sequence[int], runs: list[list[float]],
                  rank: int, size: int, **extra: Any) -> dict[str, Any]:
    return {"algorithm": algorithm, "backend": backend, "rank": rank, "size": size,
            "sizes_bytes": [int(s) for s in sizes],
            "times_s": [float(np.median(r)) for r in runs],
            "min_s": [float(np.min(r)) for r in runs], "runs_s": runs, **extra}


def _time_calls(fn: Callable[[], Any], repeats: int, warmup: int, hvd: Any) -> list[float]:
    """This worker's seconds of each of ``repeats`` calls of ``fn`` (after ``warmup``
    untimed ones), every call started at a barrier and timed until it returns."""
    return [w.seconds for w in barrier_windows(fn, lambda: barrier(hvd), 1, repeats, warmup,
                                               closing_barrier=False)]


def ps_average(x: Any, server_rank: int = 0, backend: str = "horovod") -> Any:
    """Average ``x`` over all workers the parameter-server way: everything goes through one
    process (``server_rank``).

    1. *gather*: every worker sends its whole tensor to the server. Horovod has no gather
       to one rank, but ``hvd.alltoall`` with ``splits = [0, .., len(x), .., 0]`` (everything
       to the server, nothing to anybody else) is exactly that;
    2. the server adds the ``N`` tensors and divides by ``N``;
    3. *broadcast*: the server sends the average back to every worker (``hvd.broadcast``).

    ``backend="mpi"`` does the same with mpi4py's ``comm.Gather`` / ``comm.Bcast`` on numpy
    arrays (no Horovod in the way). ``x`` is a 1-D float32 tensor (or numpy array for
    ``mpi``); the averaged tensor is returned on every worker. Run on every worker.
    """
    if backend == "mpi":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        arr = np.ascontiguousarray(x, dtype=np.float32)
        n, rank = comm.Get_size(), comm.Get_rank()
        buf = np.empty((n, arr.size), np.float32) if rank == server_rank else None
        comm.Gather(arr, buf, root=server_rank)
        out = buf.mean(axis=0, dtype=np.float32) if buf is not None else np.empty_like(arr)
        comm.Bcast(out, root=server_rank)
        return out
    if backend != "horovod":
        raise ValueError(f"backend must be 'horovod' or 'mpi', got {backend!r}")
    import tensorflow as tf

    hvd = init_horovod()
    n, rank = hvd.size(), hvd.rank()
    m = int(x.shape[0])
    splits = tf.constant([m if r == server_rank else 0 for r in range(n)], dtype=tf.int32)
    gathered, _received = hvd.alltoall(x, splits=splits, name="chexnet_ps_gather")
    if rank == server_rank:
        average = tf.reduce_sum(tf.reshape(gathered, [n, m]), axis=0) / n
    else:
        average = tf.zeros_like(x)  # overwritten by the broadcast
    return hvd.broadcast(average, root_rank=server_rank, name="chexnet_ps_broadcast")


def allreduce_times(sizes_bytes: Sequence[int], repeats: int = 5, warmup: int = 1,
                    compression: str = "none", backend: str = "horovod",
                    seed: int = 0) -> dict[str, Any]:
    """Time the ring-allreduce (average) of float32 tensors of each size. Run on every worker.

    ``backend="horovod"``: ``hvd.allreduce(x, op=hvd.Average, compression=...)`` - what
    training uses (on CPU, Horovod's background thread negotiates the tensor with the other
    workers, then calls ``MPI_Allreduce``; the measured time includes that overhead).
    ``backend="mpi"``: mpi4py's ``comm.Allreduce`` on numpy arrays: the same collective
    without Horovod, to see what Horovod adds. ``compression="fp16"`` halves the bytes on the
    wire (Horovod casts to float16 before, back to float32 after) and the result records
    ``max_abs_error`` / ``max_rel_error`` against the uncompressed average.

    Each repeat starts after a barrier and ends when the result is available; the time of a
    repeat is that of the slowest worker. Returns ``sizes_bytes``, ``times_s`` (median per
    size), ``min_s``, ``runs_s`` (every repeat), the world ``size`` and this ``rank``.
    """
    import tensorflow as tf

    hvd = init_horovod()
    rank, n = hvd.rank(), hvd.size()
    comp = horovod_compression(hvd, compression)
    if backend not in ("horovod", "mpi"):
        raise ValueError(f"backend must be 'horovod' or 'mpi', got {backend!r}")
    if compression != "none" and backend != "horovod":
        raise ValueError("compression is a Horovod feature: use backend='horovod'")
    world = None
    if backend == "mpi":
        from mpi4py import MPI

        world = MPI.COMM_WORLD
    runs: list[list[float]] = []
    errors: list[float] = []
    rel_errors: list[float] = []
    for nbytes in sizes_bytes:
        data = _worker_data(max(1, int(nbytes) // 4), rank, seed)
        call: Callable[[], Any]
        if world is not None:
            out = np.empty_like(data)

            def mpi_call(data: np.ndarray = data, out: np.ndarray = out,
                         world: Any = world) -> None:
                world.Allreduce(data, out)  # sum
                out /= n
            call = mpi_call
        else:
            x = tf.constant(data)

            def hvd_call(x: Any = x) -> Any:
                return hvd.allreduce(x, op=hvd.Average, compression=comp).numpy()
            call = hvd_call
        runs.append(_time_calls(call, repeats, warmup, hvd))
        if compression != "none":
            exact = hvd.allreduce(x, op=hvd.Average).numpy()
            err = np.abs(call() - exact)
            errors.append(float(err.max()))
            rel_errors.append(float(err.max() / max(np.abs(exact).max(), 1e-30)))
        del data
    extra: dict[str, Any] = {"compression": compression}
    if errors:
        extra.update(max_abs_error=errors, max_rel_error=rel_errors)
    return _sweep_result("ring", backend, sizes_bytes, _slowest(hvd, runs), rank, n, **extra)


def parameter_server_times(sizes_bytes: Sequence[int], repeats: int = 5, warmup: int = 1,
                           backend: str = "horovod", server_rank: int = 0,
                           seed: int = 0) -> dict[str, Any]:
    """Time the parameter-server average (:func:`ps_average`) of each size. Run on every worker.

    Same protocol as :func:`allreduce_times` (barrier, slowest worker, median of
    ``repeats``). One worker doubles as the server, so the server's link carries
    ``(N - 1) x size`` in and out (``colocated_server=True`` in the result; pass it to
    :func:`fit_alpha_beta`). The result also holds ``max_abs_diff_vs_allreduce``: the
    largest difference between the PS average and ``hvd.allreduce(op=Average)`` per size
    (the correctness check of the implementation: ~1e-7, float rounding).
    """
    import tensorflow as tf

    hvd = init_horovod()
    rank, n = hvd.rank(), hvd.size()
    runs: list[list[float]] = []
    diffs: list[float] = []
    for nbytes in sizes_bytes:
        data = _worker_data(max(1, int(nbytes) // 4), rank, seed)
        x = tf.constant(data)
        call: Callable[[], np.ndarray]
        if backend == "mpi":
            def mpi_call(data: np.ndarray = data) -> np.ndarray:
                return ps_average(data, server_rank, "mpi")
            call = mpi_call
        else:
            def hvd_call(x: Any = x) -> np.ndarray:
                return ps_average(x, server_rank, backend).numpy()
            call = hvd_call
        runs.append(_time_calls(call, repeats, warmup, hvd))
        ring = hvd.allreduce(x, op=hvd.Average).numpy()
        diffs.append(float(np.abs(np.asarray(call()) - ring).max()))
        del data, x
    return _sweep_result("ps", backend, sizes_bytes, _slowest(hvd, runs), rank, n,
                         server_rank=server_rank, colocated_server=True,
                         max_abs_diff_vs_allreduce=diffs)


def allreduce_burst_times(tensor_elems: Sequence[int], repeats: int = 5, warmup: int = 2,
                          mode: str = "per_tensor", seed: int = 0) -> dict[str, Any]:
    """Time a *burst* of allreduces, one per tensor, as a backward pass produces them.

    A model's gradient is not one tensor but one per variable (DenseNet-121: 364 tensors from
    a few hundred bytes to 4 MB). ``mode="per_tensor"`` submits one ``hvd.allreduce`` per
    tensor inside one ``tf.function`` (as ``hvd.DistributedGradientTape`` does), so they are
    all in flight together and Horovod's **tensor fusion** may pack the ready ones into one
    buffer of up to ``HOROVOD_FUSION_THRESHOLD`` bytes and reduce them in one go (one latency
    instead of hundreds). ``mode="grouped"`` uses ``hvd.grouped_allreduce`` (what
    :mod:`chexnet_utils.training.dataparallel` does): the group is negotiated as one unit.

    Fusion settings are read from the environment at ``hvd.init()``, so compare them on
    separate clusters (``MPICluster(env={"HOROVOD_FUSION_THRESHOLD": "0"})``). Run on every
    worker. Returns the times and the Horovod settings seen by this process.
    """
    import tensorflow as tf

    hvd = init_horovod()
    rank, n = hvd.rank(), hvd.size()
    tensors = [tf.constant(_worker_data(int(e), rank, seed + i))
               for i, e in enumerate(tensor_elems)]
    if mode == "per_tensor":
        @tf.function
        def burst() -> list[Any]:
            return [hvd.allreduce(t, op=hvd.Average, name=f"burst_{i}")
                    for i, t in enumerate(tensors)]
    elif mode == "grouped":
        @tf.function
        def burst() -> list[Any]:
            return hvd.grouped_allreduce(tensors, op=hvd.Average, name="burst_group")
    else:
        raise ValueError(f"mode must be 'per_tensor' or 'grouped', got {mode!r}")
    times = _time_calls(burst, repeats, warmup, hvd)
    times = _slowest(hvd, [times])[0]
    return {"mode": mode, "rank": rank, "size": n, "n_tensors": len(tensor_elems),
            "total_bytes": 4 * int(sum(tensor_elems)), "times_s": times,
            "median_s": float(np.median(times)), "min_s": float(np.min(times)),
            "fusion_threshold": os.environ.get("HOROVOD_FUSION_THRESHOLD", "default"),
            "cycle_time_ms": os.environ.get("HOROVOD_CYCLE_TIME", "default")}



def allreduce_scan_on_engine(sizes_bytes: Sequence[int], repeats: int = 5
                             ) -> dict[str, Any]:
    """Placement facts plus an allreduce sweep: for comparing ``--bind-to`` / ``--map-by``.

    Returns this worker's CPU affinity (the cores it may run on, as ``mpiexec`` bound it),
    and :func:`allreduce_times` of ``sizes_bytes``. Run on every worker.
    """
    affinity = list(usable_cpus())
    res = allreduce_times(sizes_bytes, repeats=repeats)
    res["affinity"] = affinity
    return res

