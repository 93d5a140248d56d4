"""How the gradients travel: parameter server vs ring-allreduce, measured and modelled.

In data-parallel training every worker computes gradients on its own mini-batch, and before
the weights can be updated the gradients must be **averaged across all workers**. How that
average is computed decides whether adding workers adds speed. This module measures the
two classic ways on Horovod workers (ipyparallel MPI engines, see
:class:`chexnet_utils.distributed.MPICluster`), fits a cost model to the measurements and
reads Horovod's timeline.

Parameter server (PS)
    Every worker sends its whole gradient to one server, the server averages and sends the
    result back. With ``N`` workers the server's link carries ``N x size`` in and ``N x size``
    out per step, so the time grows linearly with ``N``: the server becomes the bottleneck.
    :func:`parameter_server_times` implements it with collectives (gather to rank 0 with
    ``hvd.alltoall``, average on rank 0, ``hvd.broadcast`` back).

Ring-allreduce (Baidu, used by Horovod)
    No server. The ``N`` workers form a ring and the tensor is cut into ``N`` chunks. In the
    *reduce-scatter* phase each worker sends one chunk to its right neighbour and adds the
    chunk arriving from the left, ``N - 1`` times, after which each worker owns one fully
    summed chunk; in the *allgather* phase the summed chunks travel round the ring, ``N - 1``
    steps again. Each worker sends (and receives) ``2 (N - 1) / N x size`` bytes in total: a
    little less than twice the tensor, *whatever N is*. Every link is busy all the time.
    :func:`allreduce_times` times ``hvd.allreduce`` (on CPU, Horovod hands the reduction to
    MPI's ``MPI_Allreduce``, or Gloo's ring; on GPUs to NCCL).

Alpha-beta model
    Sending ``m`` bytes costs ``alpha + m * beta``: ``alpha`` is the latency of one message,
    ``beta`` the time per byte (1 / bandwidth). Then::

        ring:  t = 2 (N - 1) alpha + 2 (N - 1) / N * size * beta
        PS:    t = 2 alpha         + 2 N * size * beta        (server link bound)

    :func:`fit_alpha_beta` recovers ``alpha, beta`` from measured times by least squares,
    :func:`predict_ring` / :func:`predict_ps` extrapolate to many workers, and
    :func:`scaling_efficiency_prediction` turns that into the scaling efficiency
    ``compute / (compute + exposed communication)``.

Also here: tensor fusion and fp16 compression measured (:func:`allreduce_burst_times`,
``allreduce_times(..., compression="fp16")``); the same training step with Horovod or with
``tf.distribute.MultiWorkerMirroredStrategy``, switched by one flag
(:func:`throughput_on_engine`); Horovod timelines read and drawn (:func:`parse_timeline`,
:func:`plot_timeline`); the numpy walk-through of both algorithms
(:func:`simulate_ring_allreduce`); CheXNet's gradient sizes (:func:`chexnet_gradient_sizes`).

Everything whose name ends in ``_times`` or ``_on_engine`` runs **on every worker at once**
(``cluster.run(fn, ...)``): it calls ``hvd.init()`` and contains collectives, so running it
on only some workers would hang.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

KIB = 1024
MIB = 1024 * 1024

MAX_MESSAGE_BYTES: dict[str, int] = {"ci": 32 * MIB, "workstation": 128 * MIB,
                                     "gpu-node": 256 * MIB}
"""Largest tensor the size sweeps use per scale preset (``CHEXNET_SCALE``). Override with
``CHEXNET_COMM_MAX_MB``."""

REPORTED_HOROVOD_2018: dict[str, dict[str, float]] = {
    "Inception V3": {"gpus": 512, "efficiency": 0.90, "params_millions": 23.8},
    "ResNet-101": {"gpus": 512, "efficiency": 0.90, "params_millions": 44.5},
    "VGG-16": {"gpus": 512, "efficiency": 0.68, "params_millions": 138.0},
}
"""Scaling efficiencies *reported* (not measured here) by Sergeev & Del Balso, "Horovod: fast
and easy distributed deep learning in TensorFlow", arXiv:1802.05799 (2018): TensorFlow
benchmarks on 128 servers with 4 Pascal GPUs each (512 GPUs), 25 Gbit/s RoCE. The parameter
counts are the usual ones of the architectures (for context: VGG-16 sends by far the largest
gradient for its compute, and scales worst)."""


# ---------------------------------------------------------------------------------------
# Tensor sizes
# ---------------------------------------------------------------------------------------


def default_max_bytes(scale_name: str | None = None) -> int:
    """Largest tensor of the sweeps: ``CHEXNET_COMM_MAX_MB`` if set, else by scale preset."""
    env = os.environ.get("CHEXNET_COMM_MAX_MB")
    if env:
        return int(float(env) * MIB)
    from chexnet_utils.config import scale

    return MAX_MESSAGE_BYTES[scale(scale_name).name]


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


def _hvd() -> Any:
    """``horovod.tensorflow``, initialised (a no-op when it already is)."""
    import horovod.tensorflow as hvd

    hvd.init()
    return hvd


def _quiet_tensorflow() -> None:
    import logging

    import tensorflow as tf

    tf.get_logger().setLevel(logging.ERROR)
    tf.autograph.set_verbosity(0)


def _barrier(hvd: Any) -> None:
    """Every worker waits for every other (a tiny allreduce; its result is fetched)."""
    import tensorflow as tf

    hvd.allreduce(tf.constant(0.0), op=hvd.Sum, name="chexnet_comm_barrier").numpy()


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


def _compression(hvd: Any, name: str) -> Any:
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


def _time_calls(fn: Callable[[], Any], repeats: int, warmup: int,
                barrier: Callable[[], None]) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


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

    hvd = _hvd()
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

    hvd = _hvd()
    rank, n = hvd.rank(), hvd.size()
    comp = _compression(hvd, compression)
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
        if world is not None:
            out = np.empty_like(data)

            def call(data: np.ndarray = data, out: np.ndarray = out, world: Any = world) -> None:
                world.Allreduce(data, out)  # sum
                out /= n
        else:
            x = tf.constant(data)

            def call(x: Any = x) -> Any:
                return hvd.allreduce(x, op=hvd.Average, compression=comp).numpy()
        runs.append(_time_calls(call, repeats, warmup, lambda: _barrier(hvd)))
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

    hvd = _hvd()
    rank, n = hvd.rank(), hvd.size()
    runs: list[list[float]] = []
    diffs: list[float] = []
    for nbytes in sizes_bytes:
        data = _worker_data(max(1, int(nbytes) // 4), rank, seed)
        x = tf.constant(data)
        if backend == "mpi":
            def call(data: np.ndarray = data) -> np.ndarray:
                return ps_average(data, server_rank, "mpi")
        else:
            def call(x: Any = x) -> np.ndarray:
                return ps_average(x, server_rank, backend).numpy()
        runs.append(_time_calls(call, repeats, warmup, lambda: _barrier(hvd)))
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
    :mod:`chexnet_utils.training` does): the group is negotiated as one unit.

    Fusion settings are read from the environment at ``hvd.init()``, so compare them on
    separate clusters (``MPICluster(env={"HOROVOD_FUSION_THRESHOLD": "0"})``). Run on every
    worker. Returns the times and the Horovod settings seen by this process.
    """
    import tensorflow as tf

    hvd = _hvd()
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
    times = _time_calls(burst, repeats, warmup, lambda: _barrier(hvd))
    times = _slowest(hvd, [times])[0]
    return {"mode": mode, "rank": rank, "size": n, "n_tensors": len(tensor_elems),
            "total_bytes": 4 * int(sum(tensor_elems)), "times_s": times,
            "median_s": float(np.median(times)), "min_s": float(np.min(times)),
            "fusion_threshold": os.environ.get("HOROVOD_FUSION_THRESHOLD", "default"),
            "cycle_time_ms": os.environ.get("HOROVOD_CYCLE_TIME", "default")}


# ---------------------------------------------------------------------------------------
# Training steps: Horovod and tf.distribute.MultiWorkerMirroredStrategy
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepConfig:
    """One timed data-parallel training run on synthetic in-memory batches.

    The batch is made once per worker (random images, random labels) and reused, so no
    input pipeline runs: only compute and gradient communication are timed.
    """

    arch: str = "small"
    image_size: int = 64
    batch_size: int = 16
    """Per worker."""
    steps: int = 10
    """Timed steps per repeat."""
    warmup_steps: int = 3
    repeats: int = 1
    """Timed blocks of ``steps`` steps; ``img_per_s`` is their median."""
    learning_rate: float = 0.01
    seed: int = 0


def _synthetic_batch(c: StepConfig, rank: int) -> tuple[Any, Any]:
    import tensorflow as tf

    from chexnet_utils.labels import NUM_CLASSES

    rng = np.random.default_rng([c.seed, rank])
    x = rng.standard_normal((c.batch_size, c.image_size, c.image_size, 3), dtype=np.float32)
    y = (rng.random((c.batch_size, NUM_CLASSES)) < 0.2).astype(np.float32)
    return tf.constant(x), tf.constant(y)


def _weights_checksum(model: Any) -> float:
    return float(sum(np.abs(v.numpy()).astype(np.float64).sum()
                     for v in model.trainable_variables))


def _snapshot(model: Any) -> list[np.ndarray]:
    return [np.array(v.numpy(), dtype=np.float64) for v in model.trainable_variables]


def _update_norm(model: Any, before: list[np.ndarray]) -> float:
    """L2 norm of how far the weights moved since ``before`` (same on every worker, and the
    same for two back ends that average the same gradients)."""
    return float(np.sqrt(sum(((v.numpy() - b) ** 2).sum()
                             for v, b in zip(model.trainable_variables, before))))


def _step_config(cfg: StepConfig | Mapping[str, Any] | None, **overrides: Any) -> StepConfig:
    base = asdict(cfg) if isinstance(cfg, StepConfig) else dict(cfg or {})
    base.update({k: v for k, v in overrides.items() if v is not None})
    return StepConfig(**base)


def hvd_throughput_on_engine(cfg: StepConfig | Mapping[str, Any] | None = None,
                             reduction: str = "grouped", compression: str = "none",
                             timeline_path: str | None = None, timeline_steps: int = 3,
                             **overrides: Any) -> dict[str, Any]:
    """Images/s of Horovod data-parallel training steps. Run on every worker.

    The step is a ``tf.function``: forward, loss, ``tape.gradient``, average the gradients
    with Horovod, ``optimizer.apply_gradients`` (SGD). ``reduction="grouped"`` averages them
    in one ``hvd.grouped_allreduce``, ``"per_tensor"`` (as :mod:`chexnet_utils.training`)
    with one ``hvd.allreduce`` per gradient (like ``hvd.DistributedGradientTape``); optional
    ``compression="fp16"``. Rank 0's initial weights are broadcast first.

    With ``timeline_path`` and ``HOROVOD_TIMELINE=DYNAMIC`` in the workers' environment
    (``MPICluster(env={"HOROVOD_TIMELINE": "DYNAMIC"})``), ``timeline_steps`` more steps are
    run after the timed ones between ``hvd.start_timeline(path)`` and ``hvd.stop_timeline()``
    (rank 0 writes the file; recording is kept out of the timed steps).

    Returns rank, size, ``img_per_s`` of the whole job (median over ``repeats``), seconds,
    the per-step time, a weights checksum (equal on every worker if the gradients were
    really averaged) and ``update_norm``, how far the weights moved (the same for any back
    end that averages the same gradients).
    """
    import keras
    import tensorflow as tf

    from chexnet_utils.models import build_chexnet
    from chexnet_utils.training import broadcast_initial_state, init_world

    _quiet_tensorflow()
    c = _step_config(cfg, **overrides)
    rank, n = init_world(True)
    hvd = _hvd()
    comp = _compression(hvd, compression)
    keras.utils.set_random_seed(c.seed)
    model = build_chexnet(c.arch, c.image_size)
    opt = keras.optimizers.SGD(c.learning_rate)
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.BinaryCrossentropy()
    broadcast_initial_state(_OptimizerHolder(model, opt), True)
    initial = _snapshot(model)
    x, y = _synthetic_batch(c, rank)

    if reduction == "grouped":
        def reduce(grads: list[Any]) -> list[Any]:
            return list(hvd.grouped_allreduce(grads, op=hvd.Average, compression=comp))
    elif reduction == "per_tensor":
        def reduce(grads: list[Any]) -> list[Any]:
            return [hvd.allreduce(g, op=hvd.Average, compression=comp, name=f"grad_{i}")
                    for i, g in enumerate(grads)]
    else:
        raise ValueError(f"reduction must be 'grouped' or 'per_tensor', got {reduction!r}")

    @tf.function
    def step() -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = reduce(tape.gradient(loss, model.trainable_variables))
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def run_steps() -> None:
        for _ in range(c.steps):
            loss = step()
        loss.numpy()

    for _ in range(c.warmup_steps):
        step()
    runs = _timed_blocks(run_steps, c.repeats, lambda: _barrier(hvd))
    checks = {"weights_checksum": _weights_checksum(model),
              "update_norm": _update_norm(model, initial)}
    recorded = None
    if timeline_path:
        recorded = record_timeline(hvd, timeline_path, lambda: step().numpy(), timeline_steps)
    return {"backend": "horovod", "reduction": reduction, "compression": compression,
            "rank": rank, "size": n, **_throughput(runs, c, n),
            "params": int(model.count_params()), **checks, "timeline_path": recorded,
            "config": asdict(c)}


def _timed_blocks(fn: Callable[[], None], repeats: int, barrier: Callable[[], None]
                  ) -> list[float]:
    """Seconds of ``repeats`` calls of ``fn``, each between two barriers."""
    runs = []
    for _ in range(max(1, repeats)):
        barrier()
        t0 = time.perf_counter()
        fn()
        barrier()
        runs.append(time.perf_counter() - t0)
    return runs


def _throughput(runs: list[float], c: StepConfig, n: int) -> dict[str, Any]:
    rates = [c.steps * c.batch_size * n / r for r in runs]
    seconds = float(np.median(runs))
    return {"seconds": seconds, "step_s": seconds / c.steps,
            "img_per_s": float(np.median(rates)), "runs_img_per_s": rates}


class _OptimizerHolder:
    """What :func:`chexnet_utils.training.broadcast_initial_state` needs: ``.variables``
    and ``.optimizer.variables``."""

    def __init__(self, model: Any, optimizer: Any) -> None:
        self.variables = model.variables
        self.optimizer = optimizer


def record_timeline(hvd: Any, path: str, fn: Callable[[], Any], steps: int) -> str | None:
    """Run ``fn`` ``steps`` times with Horovod's timeline recording to ``path``."""
    mode = os.environ.get("HOROVOD_TIMELINE", "")
    if mode.upper() != "DYNAMIC":
        raise RuntimeError(
            "recording a timeline on demand needs HOROVOD_TIMELINE=DYNAMIC in the workers' "
            "environment (MPICluster(env={'HOROVOD_TIMELINE': 'DYNAMIC'})); with "
            "HOROVOD_TIMELINE=<file> Horovod records everything from hvd.init() on instead")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    _barrier(hvd)
    hvd.start_timeline(str(path), mark_cycles=False)
    for _ in range(steps):
        fn()
    _barrier(hvd)
    hvd.stop_timeline()
    _barrier(hvd)
    return str(path) if hvd.rank() == 0 else None


# -- MultiWorkerMirroredStrategy -------------------------------------------------------

_MWMS: dict[str, Any] = {}


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it).

    Run on every engine (``cluster.run(free_local_port)``) to build ``TF_CONFIG``; a tiny
    race remains (another process could take the port before TensorFlow binds it).
    """
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tf_config(ports: Sequence[int], rank: int, host: str = "127.0.0.1") -> dict[str, Any]:
    """The ``TF_CONFIG`` of worker ``rank`` in a cluster of ``len(ports)`` workers.

    ``{"cluster": {"worker": ["host:port0", "host:port1", ...]}, "task": {"type": "worker",
    "index": rank}}``: every worker gets the same list and its own index (here: its MPI
    rank, so TensorFlow's worker 0 is Horovod's rank 0).
    """
    return {"cluster": {"worker": [f"{host}:{int(p)}" for p in ports]},
            "task": {"type": "worker", "index": int(rank)}}


def _mpi_rank() -> int:
    from chexnet_utils.distributed import _mpi_rank as rank_from_launcher

    return rank_from_launcher()


def mwms_setup_on_engine(ports: Sequence[int], implementation: str = "ring") -> dict[str, Any]:
    """Create this worker's ``tf.distribute.MultiWorkerMirroredStrategy``. Run on every worker.

    Sets ``TF_CONFIG`` (:func:`tf_config`, the worker index is the MPI rank) and creates the
    strategy with CPU collectives of the given implementation (``"ring"``: gRPC ring
    all-reduce; ``"nccl"`` on GPUs; ``"auto"``). The workers wait for each other here.
    The strategy is kept in this process and reused by :func:`mwms_throughput_on_engine`.

    **Must run before any other TensorFlow work in the process** (no Horovod op, no
    tensor): TensorFlow configures its collective ops when its runtime starts, and refuses
    afterwards ("Collective ops must be configured at program startup"). So start the
    engines, call this first, and only then run anything else on them.

    TensorFlow's gRPC server binds its port on all interfaces (the ``TF_CONFIG`` host only
    tells the peers where to connect), unauthenticated, for the life of the process:
    firewall it on a machine reachable from an untrusted network.
    """
    import tensorflow as tf

    _quiet_tensorflow()
    key = ",".join(str(p) for p in ports)
    if _MWMS.get("key") == key:
        s = _MWMS["strategy"]
        return {"rank": _mpi_rank(), "replicas": s.num_replicas_in_sync, "reused": True}
    if _MWMS:
        raise RuntimeError("this process already has a MultiWorkerMirroredStrategy for other "
                           "ports; TensorFlow cannot create a second one (restart the engines)")
    rank = _mpi_rank()
    os.environ["TF_CONFIG"] = json.dumps(tf_config(ports, rank))
    impl = {"ring": tf.distribute.experimental.CommunicationImplementation.RING,
            "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
            "auto": tf.distribute.experimental.CommunicationImplementation.AUTO}[implementation]
    options = tf.distribute.experimental.CommunicationOptions(implementation=impl)
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    except RuntimeError as e:
        raise RuntimeError(
            f"{e}. MultiWorkerMirroredStrategy must be created before any other TensorFlow "
            "op runs in this process: call mwms_setup_on_engine first on freshly started "
            "engines") from e
    _MWMS.update(key=key, strategy=strategy)
    return {"rank": rank, "replicas": strategy.num_replicas_in_sync, "reused": False,
            "tf_config": json.loads(os.environ["TF_CONFIG"]),
            "implementation": implementation}


def mwms_throughput_on_engine(cfg: StepConfig | Mapping[str, Any] | None = None,
                              **overrides: Any) -> dict[str, Any]:
    """Images/s of the same training step as :func:`hvd_throughput_on_engine`, with
    TensorFlow's ``MultiWorkerMirroredStrategy`` doing the gradient averaging. Run on every
    worker, after :func:`mwms_setup_on_engine`.

    The model and optimizer are created in ``strategy.scope()`` (mirrored variables, the
    same initial values on every worker); the step runs in ``strategy.run``. Inside a
    strategy a Keras 3 loss object divides the loss by the number of replicas, and Keras'
    optimizer *sums* the gradients across workers with the strategy's collective
    all-reduce: together, the average (a hand-written loss must be divided by
    ``strategy.num_replicas_in_sync`` itself).
    """
    import keras
    import tensorflow as tf

    from chexnet_utils.models import build_chexnet

    if "strategy" not in _MWMS:
        raise RuntimeError("call mwms_setup_on_engine(ports) on every engine first")
    _quiet_tensorflow()
    strategy = _MWMS["strategy"]
    c = _step_config(cfg, **overrides)
    rank = _mpi_rank()
    n = strategy.num_replicas_in_sync
    keras.utils.set_random_seed(c.seed)
    with strategy.scope():
        model = build_chexnet(c.arch, c.image_size)
        opt = keras.optimizers.SGD(c.learning_rate)
        opt.build(model.trainable_variables)
    initial = _snapshot(model)
    loss_fn = keras.losses.BinaryCrossentropy(reduction="sum_over_batch_size")
    x, y = _synthetic_batch(c, rank)

    def replica_step() -> Any:
        with tf.GradientTape() as tape:
            # a Keras 3 loss object already divides by num_replicas_in_sync inside a
            # strategy: dividing again here would halve the update (the test checks this)
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))  # all-reduces (sum)
        return loss

    @tf.function
    def step() -> Any:
        return strategy.run(replica_step)

    def barrier() -> None:
        one = strategy.run(lambda: tf.constant(1.0))
        strategy.reduce(tf.distribute.ReduceOp.SUM, one, axis=None).numpy()

    def run_steps() -> None:
        for _ in range(c.steps):
            loss = step()
        strategy.experimental_local_results(loss)[0].numpy()

    for _ in range(c.warmup_steps):
        step()
    runs = _timed_blocks(run_steps, c.repeats, barrier)
    return {"backend": "mwms", "rank": rank, "size": n, **_throughput(runs, c, n),
            "params": int(model.count_params()),
            "weights_checksum": _weights_checksum(model),
            "update_norm": _update_norm(model, initial), "config": asdict(c)}


def throughput_on_engine(backend: str = "horovod",
                         cfg: StepConfig | Mapping[str, Any] | None = None,
                         **kwargs: Any) -> dict[str, Any]:
    """One flag toggles the data-parallel back end, as the AWS example does:
    ``backend="horovod"`` (:func:`hvd_throughput_on_engine`) or ``"mwms"``
    (:func:`mwms_throughput_on_engine`). Run on every worker."""
    if backend == "horovod":
        return hvd_throughput_on_engine(cfg, **kwargs)
    if backend == "mwms":
        return mwms_throughput_on_engine(cfg, **kwargs)
    raise ValueError(f"backend must be 'horovod' or 'mwms', got {backend!r}")


def allreduce_scan_on_engine(sizes_bytes: Sequence[int], repeats: int = 5
                             ) -> dict[str, Any]:
    """Placement facts plus an allreduce sweep: for comparing ``--bind-to`` / ``--map-by``.

    Returns this worker's CPU affinity (the cores it may run on, as ``mpiexec`` bound it),
    and :func:`allreduce_times` of ``sizes_bytes``. Run on every worker.
    """
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    res = allreduce_times(sizes_bytes, repeats=repeats)
    res["affinity"] = affinity
    return res


# ---------------------------------------------------------------------------------------
# Bandwidth and the alpha-beta cost model (pure functions)
# ---------------------------------------------------------------------------------------


def algbw(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: tensor size / time (what the user sees)."""
    return float(size_bytes) / float(seconds)


def busbw(algorithm: str, size_bytes: float, seconds: float, n: int,
          colocated_server: bool = False) -> float:
    """Bus bandwidth in bytes/s: the traffic on the busiest link / time, comparable with the
    hardware's link bandwidth whatever the number of workers (NCCL-tests' definition).

    ``ring``: ``algbw * 2 (N - 1) / N``: in reduce-scatter plus allgather each worker sends
    ``2 (N - 1)`` chunks of ``size / N``. ``ps``: the server's link carries ``N x size`` in
    (and as much out, in a second phase): ``busbw = N * size / time``; ``(N - 1) x size``
    when the server is one of the workers (``colocated_server``: its own tensor does not
    cross the link).
    """
    if algorithm == "ring":
        return algbw(size_bytes, seconds) * 2 * (n - 1) / n
    if algorithm == "ps":
        k = n - 1 if colocated_server else n
        return algbw(size_bytes, seconds) * k
    raise ValueError(f"algorithm must be 'ring' or 'ps', got {algorithm!r}")


def cost_coefficients(algorithm: str, n: int = 2, colocated_server: bool = False
                      ) -> tuple[float, float]:
    """``(a, b)`` of ``t = a * alpha + b * size * beta`` for one reduction of ``size`` bytes.

    * ``"linear"``: ``(1, 1)``: one message, ``t = alpha + beta * size``.
    * ``"ring"``: ``(2 (N - 1), 2 (N - 1) / N)``: ``2 (N - 1)`` sequential steps, each a
      message of ``size / N`` (reduce-scatter then allgather). ``(0, 0)`` for ``N = 1``.
    * ``"ps"``: ``(2, 2 N)``: two phases (gather, broadcast), each bound by the server's
      link carrying ``N x size`` (``2 (N - 1)`` with a ``colocated_server``).
    """
    if algorithm == "linear":
        return 1.0, 1.0
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if algorithm == "ring":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    if algorithm == "ps":
        return 2.0, 2.0 * (n - 1 if colocated_server else n)
    raise ValueError(f"algorithm must be 'linear', 'ring' or 'ps', got {algorithm!r}")


def fit_alpha_beta(sizes_bytes: Sequence[float], times_s: Sequence[float],
                   algorithm: str = "linear", n: int = 2, colocated_server: bool = False,
                   relative: bool = True) -> tuple[float, float]:
    """Least-squares ``(alpha, beta)`` of ``t = a * alpha + b * size * beta``.

    ``a, b`` come from :func:`cost_coefficients` (``algorithm``, ``n``), so the fitted
    ``alpha`` (s per message) and ``beta`` (s per byte) describe the *link*, not the
    algorithm, and the same pair predicts every algorithm at every ``N``.

    ``relative=True`` minimises relative errors (each row divided by its measured time):
    the sizes span five orders of magnitude and plain least squares would fit only the big
    tensors, leaving ``alpha`` to chance. Neither parameter may be negative: if the
    unconstrained solution has one below zero it is fixed at 0 and the other refitted.
    """
    s = np.asarray(sizes_bytes, dtype=np.float64).reshape(-1)
    t = np.asarray(times_s, dtype=np.float64).reshape(-1)
    if s.shape != t.shape or s.size < 2:
        raise ValueError("need at least two (size, time) pairs of equal length")
    if np.any(t <= 0) or not np.all(np.isfinite(t)):
        raise ValueError("times must be positive and finite")
    a, b = cost_coefficients(algorithm, n, colocated_server)
    if a == 0 and b == 0:
        raise ValueError("one worker does not communicate: nothing to fit")
    x = np.column_stack([np.full_like(s, a), b * s])
    w = 1.0 / t if relative else np.ones_like(t)
    xw, tw = x * w[:, None], t * w
    coef, *_ = np.linalg.lstsq(xw, tw, rcond=None)
    alpha, beta = float(coef[0]), float(coef[1])
    if alpha < 0 or beta < 0:
        cands = []
        for keep in (0, 1):
            col = xw[:, keep]
            v = max(0.0, float(col @ tw / (col @ col))) if col @ col > 0 else 0.0
            pair = (v, 0.0) if keep == 0 else (0.0, v)
            resid = tw - xw @ np.array(pair)
            cands.append((float(resid @ resid), pair))
        alpha, beta = min(cands)[1]
    return alpha, beta


def predict(algorithm: str, n: int, size_bytes: float, alpha: float, beta: float,
            colocated_server: bool = False, overhead_s: float = 0.0) -> float:
    """Predicted seconds of one reduction of ``size_bytes`` over ``n`` workers.

    ``overhead_s`` is a fixed software cost per reduction, paid once whatever ``N`` (e.g.
    Horovod's negotiation and cycle wait), on top of the ``alpha``/``beta`` terms of the
    wire. 0 for one worker (nothing to reduce).
    """
    a, b = cost_coefficients(algorithm, n, colocated_server)
    if algorithm != "linear" and n == 1:
        return 0.0
    return overhead_s + a * alpha + b * float(size_bytes) * beta


def predict_ring(n: int, size_bytes: float, alpha: float, beta: float,
                 overhead_s: float = 0.0) -> float:
    """Ring-allreduce: ``2 (N - 1) alpha + 2 (N - 1) / N * size * beta`` (0 for one worker).

    The bandwidth term tends to ``2 * size * beta`` as N grows: ring-allreduce of a large
    tensor costs about the same on 8 or 512 workers. The latency term grows with N: small
    tensors, many workers -> fuse tensors, or use tree / hierarchical algorithms.
    """
    return predict("ring", n, size_bytes, alpha, beta, overhead_s=overhead_s)


def predict_ps(n: int, size_bytes: float, alpha: float, beta: float,
               colocated_server: bool = False, overhead_s: float = 0.0) -> float:
    """Parameter server: ``2 alpha + 2 N * size * beta``: linear in N (one server link).

    (Sharding the parameters over ``k`` servers divides the bandwidth term by ``k``; with
    ``k = N`` servers that is what allreduce does.)
    """
    return predict("ps", n, size_bytes, alpha, beta, colocated_server, overhead_s)


def scaling_efficiency_prediction(n_workers: int, grad_bytes: float, step_compute_s: float,
                                  alpha: float, beta: float, algorithm: str = "ring",
                                  overlap: float = 0.0, n_messages: int = 1,
                                  overhead_s: float = 0.0) -> float:
    """Predicted scaling efficiency ``compute / (compute + exposed communication)``.

    ``grad_bytes`` are averaged every step in ``n_messages`` equal reductions, one after
    the other (1: fully fused; one per gradient tensor: no fusion, every tensor pays the
    ``2 (N - 1) alpha`` latency of its own ring). ``overhead_s`` is paid once per step
    (Horovod negotiates all the tensors that are ready in one cycle together, fused or
    not). ``overlap`` in [0, 1] is the fraction of the compute time that can hide
    communication (Horovod starts reducing the last layers' gradients while backprop still
    computes the first ones): ``exposed = max(0, comm - overlap * compute)``. One worker:
    1.0. Throughput on N workers is then ``N x efficiency x`` one worker's.

    Left out: the copies into and out of the fusion buffer, and the cache effects that
    make a big buffer slower per byte than small messages on one machine.
    """
    if n_workers < 1 or step_compute_s <= 0 or n_messages < 1:
        raise ValueError("need n_workers >= 1, step_compute_s > 0, n_messages >= 1")
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap must be in [0, 1], got {overlap}")
    if n_workers == 1:
        return 1.0
    comm = overhead_s + n_messages * predict(algorithm, n_workers, grad_bytes / n_messages,
                                             alpha, beta)
    exposed = max(0.0, comm - overlap * step_compute_s)
    return step_compute_s / (step_compute_s + exposed)


# ---------------------------------------------------------------------------------------
# The two algorithms step by step, in numpy (no communication: for understanding)
# ---------------------------------------------------------------------------------------


def simulate_ring_allreduce(arrays: Sequence[np.ndarray], average: bool = True
                            ) -> dict[str, Any]:
    """Ring-allreduce of one array per simulated worker, chunk by chunk, counting bytes.

    Worker ``i`` sends only to worker ``i + 1`` (mod N). Every array is cut into ``N``
    chunks. Reduce-scatter, ``N - 1`` steps: in step ``s`` worker ``i`` sends chunk
    ``(i - s) mod N`` and its right neighbour adds it to its own copy; afterwards worker
    ``i`` holds the complete sum of chunk ``(i + 1) mod N``. Allgather, ``N - 1`` steps: the
    complete chunks travel once round the ring, each receiver overwrites its copy.

    Returns ``result`` (every worker's final array: all equal to the sum, or the mean),
    ``sent_bytes`` per worker (``2 (N - 1) / N`` x the array's bytes) and ``steps``.
    """
    n = len(arrays)
    if n < 1:
        raise ValueError("need at least one array")
    work = [[c.copy() for c in np.array_split(np.asarray(a, dtype=np.float64), n)]
            for a in arrays]
    itemsize = np.asarray(arrays[0]).dtype.itemsize
    sent = [0] * n
    steps = 0
    for s in range(n - 1):  # reduce-scatter
        msgs = [((i + 1) % n, (i - s) % n, work[i][(i - s) % n].copy()) for i in range(n)]
        for i, (dst, c, chunk) in enumerate(msgs):
            work[dst][c] += chunk
            sent[i] += chunk.size * itemsize
        steps += 1
    for s in range(n - 1):  # allgather
        msgs = [((i + 1) % n, (i + 1 - s) % n, work[i][(i + 1 - s) % n].copy())
                for i in range(n)]
        for i, (dst, c, chunk) in enumerate(msgs):
            work[dst][c] = chunk
            sent[i] += chunk.size * itemsize
        steps += 1
    result = [np.concatenate(w) / (n if average else 1) for w in work]
    return {"result": result, "sent_bytes": sent, "steps": steps}


def simulate_parameter_server(arrays: Sequence[np.ndarray], server: int | None = None,
                              average: bool = True) -> dict[str, Any]:
    """Parameter-server reduction of one array per simulated worker, counting bytes.

    ``server=None``: a dedicated server process (the classic set-up): it receives ``N``
    arrays and sends ``N`` back. ``server=i``: worker ``i`` is also the server (as in
    :func:`parameter_server_times`): its own array does not travel, so ``N - 1`` each way.
    Returns ``result`` per worker, ``server_in_bytes``, ``server_out_bytes``,
    ``worker_sent_bytes`` (one array each, 0 for a co-located server) and ``steps`` (2).
    """
    n = len(arrays)
    if n < 1:
        raise ValueError("need at least one array")
    nbytes = np.asarray(arrays[0]).nbytes
    total = np.sum([np.asarray(a, dtype=np.float64) for a in arrays], axis=0)
    value = total / n if average else total
    remote = n if server is None else n - 1
    return {"result": [value.copy() for _ in range(n)],
            "server_in_bytes": remote * nbytes, "server_out_bytes": remote * nbytes,
            "worker_sent_bytes": [0 if i == server else nbytes for i in range(n)],
            "steps": 2}


# ---------------------------------------------------------------------------------------
# Horovod timeline
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimelineEvent:
    """One span (or instant) of a Horovod timeline.

    ``tensor``: the tensor's name (Horovod's ``process_name`` of the trace row). ``phase``:
    what happened (``NEGOTIATE_ALLREDUCE``: waiting until every worker has the tensor ready;
    ``ALLREDUCE``: the whole reduction; inside it ``MPI_ALLREDUCE`` / ``NCCL_ALLREDUCE`` /
    ``MEMCPY_IN_FUSION_BUFFER`` / ``MEMCPY_OUT_FUSION_BUFFER`` ...; ``READY``: the instant
    worker ``rank`` reported the tensor ready). ``start_us`` / ``duration_us``: microseconds
    since the timeline started. ``depth``: nesting level (0 = top-level phase).
    ``complete``: False for a span still open when the file ended (truncated timeline).
    """

    tensor: str
    phase: str
    start_us: float
    duration_us: float
    depth: int = 0
    rank: int | None = None
    complete: bool = True
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def end_us(self) -> float:
        return self.start_us + self.duration_us


def read_trace_records(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a Chrome-trace array, tolerating an unfinished file.

    Horovod writes ``[`` then one object after another while training runs and adds the
    closing ``]`` only when the timeline is stopped; a file read in the middle can also end
    inside an object. Objects are decoded one by one and reading stops at the first
    incomplete one.
    """
    decoder = json.JSONDecoder()
    start = text.find("[")
    if start < 0:
        return []
    pos, out = start + 1, []
    n = len(text)
    while pos < n:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n or text[pos] == "]":
            break
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        if isinstance(obj, dict):
            out.append(obj)
    return out


def parse_timeline(path: str | os.PathLike[str] | None = None, text: str | None = None
                   ) -> list[TimelineEvent]:
    """Events of a Horovod timeline file (Chrome trace JSON), sorted by start time.

    The file holds, per tensor (a trace "process", ``pid``, named by a metadata record),
    ``B``/``E`` records (begin/end of a phase, nested: ``ALLREDUCE`` contains
    ``MPI_ALLREDUCE``...) and ``X`` records (instants: in ``NEGOTIATE_*``, one per worker,
    named by its rank). Begin/end pairs are matched per tensor with a stack. Works on a file
    that is still being written (see :func:`read_trace_records`): spans left open are
    returned with ``complete=False``, ending at the last time stamp seen.
    """
    if text is None:
        if path is None:
            raise ValueError("give a path or the text")
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    records = read_trace_records(text)
    names: dict[Any, str] = {}
    stacks: dict[Any, list[tuple[str, float]]] = {}
    events: list[TimelineEvent] = []
    last_ts = 0.0
    for r in records:
        ph, pid = r.get("ph"), r.get("pid")
        if ph == "M":
            if r.get("name") == "process_name" and "name" in r.get("args", {}):
                names[pid] = str(r["args"]["name"])
            continue
        ts = float(r.get("ts", last_ts))
        last_ts = max(last_ts, ts)
        tensor = names.get(pid, f"tensor {pid}")
        stack = stacks.setdefault(pid, [])
        if ph == "B":
            stack.append((str(r.get("name", "?")), ts))
        elif ph == "E":
            if stack:
                phase, t0 = stack.pop()
                events.append(TimelineEvent(tensor, phase, t0, ts - t0, len(stack),
                                            args=dict(r.get("args", {}))))
        elif ph == "X":
            name = str(r.get("name", ""))
            rank = int(name) if name.isdigit() else None
            events.append(TimelineEvent(tensor, "READY" if rank is not None else name, ts,
                                        float(r.get("dur", 0)), len(stack), rank=rank))
        elif ph in ("i", "I"):
            events.append(TimelineEvent(tensor, str(r.get("name", "")), ts, 0.0, len(stack)))
    for pid, stack in stacks.items():
        tensor = names.get(pid, f"tensor {pid}")
        for depth, (phase, t0) in enumerate(stack):
            events.append(TimelineEvent(tensor, phase, t0, max(0.0, last_ts - t0), depth,
                                        complete=False))
    events.sort(key=lambda e: (e.start_us, e.depth))
    return events


def wait_for_timeline(path: str | os.PathLike[str], timeout: float = 10.0,
                      poll: float = 0.1, stable_s: float = 2.0) -> bool:
    """Wait until the timeline file is closed (ends with ``]``) or stops growing.

    Horovod's writer is a background thread on rank 0: ``hvd.stop_timeline()`` or
    ``hvd.shutdown()`` returns before the last records are on disk. Returns True when the
    file is complete; False when it has not grown for ``stable_s`` seconds without being
    closed, or after ``timeout`` (:func:`parse_timeline` reads it anyway).
    """
    p = Path(path)
    deadline = time.monotonic() + timeout
    last, stable_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        if p.exists():
            data = p.read_bytes()
            if data.rstrip().endswith(b"]"):
                return True
            if len(data) != last:
                last, stable_since = len(data), time.monotonic()
            elif last > 0 and time.monotonic() - stable_since > stable_s:
                return False
        time.sleep(poll)
    return False


def timeline_summary(events: Sequence[TimelineEvent]) -> dict[str, dict[str, float]]:
    """Per phase: how many spans, their total and mean duration in ms (instants skipped)."""
    out: dict[str, dict[str, float]] = {}
    for e in events:
        if e.phase == "READY":
            continue
        d = out.setdefault(e.phase, {"count": 0, "total_ms": 0.0})
        d["count"] += 1
        d["total_ms"] += e.duration_us / 1000
    for d in out.values():
        d["mean_ms"] = d["total_ms"] / d["count"] if d["count"] else 0.0
    return out


def short_tensor_name(name: str, width: int = 32) -> str:
    """A readable label for a Horovod tensor name.

    ``hvd.grouped_allreduce`` names each member ``HorovodGroupedAllreduce_<first and last
    gradient's op names>_<i>of<n>``: shown as ``group member i/n``; the barrier-like eager
    allreduce (``HorovodAllreduce``) as is; anything else cut to ``width`` characters.
    """
    import re

    m = re.search(r"_(\d+)of(\d+)$", name)
    if name.startswith("HorovodGrouped") and m:
        return f"group member {m.group(1)}/{m.group(2)}"
    return name if len(name) <= width else "..." + name[-(width - 3):]


def busy_time_us(events: Sequence[TimelineEvent], phases: Sequence[str]) -> float:
    """Microseconds during which at least one event of ``phases`` was in progress.

    Tensors are reduced concurrently (a fused buffer holds many), so durations must not be
    added up: this is the length of the union of their intervals. Divided by the recorded
    time, it is the share of the wall clock spent in that phase.
    """
    spans = sorted((e.start_us, e.end_us) for e in events if e.phase in set(phases))
    total, cur_start, cur_end = 0.0, None, None
    for start, end in spans:
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


_PHASE_COLORS = {
    "NEGOTIATE_ALLREDUCE": "#c7c7c7", "NEGOTIATE_BROADCAST": "#c7c7c7",
    "NEGOTIATE_ALLGATHER": "#c7c7c7", "NEGOTIATE_ALLTOALL": "#c7c7c7",
    "ALLREDUCE": "#9ecae1", "BROADCAST": "#fdd0a2", "ALLGATHER": "#c7e9c0",
    "ALLTOALL": "#dadaeb",
    "MPI_ALLREDUCE": "#08519c", "GLOO_ALLREDUCE": "#08519c", "NCCL_ALLREDUCE": "#08519c",
    "MEMCPY_IN_FUSION_BUFFER": "#e6550d", "MEMCPY_OUT_FUSION_BUFFER": "#a63603",
    "MPI_BCAST": "#d94801", "WAIT_FOR_DATA": "#bdbdbd", "WAIT_FOR_OTHER_TENSOR_DATA": "#969696",
    "QUEUE": "#756bb1",
}


def plot_timeline(events: Sequence[TimelineEvent], max_tensors: int = 30,
                  title: str = "Horovod timeline", ax: Any = None):  # noqa: ANN201
    """Gantt chart of a timeline: one row per tensor, one bar per phase.

    Top-level phases (negotiation, the whole allreduce) are drawn full height and pale;
    the phases nested inside (the MPI/NCCL reduction itself, copies into and out of the
    fusion buffer) as narrower dark bars on top; black ticks mark the moments each worker
    reported the tensor ready. Time in ms from the first event. At most ``max_tensors``
    rows (the first tensors to start). Returns the figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    spans = [e for e in events if e.phase != "READY"]
    if not events:
        raise ValueError("no events to draw")
    t_first = min(e.start_us for e in events)
    order: list[str] = []
    for e in sorted(events, key=lambda e: e.start_us):
        if e.tensor not in order:
            order.append(e.tensor)
    order = order[:max_tensors]
    row = {t: i for i, t in enumerate(order)}
    if ax is None:
        fig, ax = plt.subplots(figsize=(11, 0.28 * len(order) + 1.6))
    else:
        fig = ax.figure
    used: dict[str, str] = {}
    for e in spans:
        if e.tensor not in row:
            continue
        color = _PHASE_COLORS.get(e.phase, "#6baed6" if e.depth else "#deebf7")
        height = 0.8 if e.depth == 0 else 0.45
        ax.barh(row[e.tensor], max(e.duration_us, 1.0) / 1000,
                left=(e.start_us - t_first) / 1000, height=height, color=color,
                edgecolor="none" if e.complete else "red", linewidth=0.8)
        used.setdefault(e.phase, color)
    for e in events:
        if e.phase == "READY" and e.tensor in row:
            ax.plot([(e.start_us - t_first) / 1000] * 2,
                    [row[e.tensor] - 0.42, row[e.tensor] + 0.42], color="black", lw=0.8)
    ax.set_yticks(range(len(order)), [short_tensor_name(t) for t in order], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time since the first recorded event (ms)")
    ax.set_title(title)
    handles = [Patch(color=c, label=p) for p, c in used.items()]
    if any(e.phase == "READY" and e.tensor in row for e in events):
        handles.append(plt.Line2D([], [], color="black", lw=0.8, label="worker ready (READY)"))
    if any(not e.complete for e in spans):
        handles.append(Patch(facecolor="white", edgecolor="red", label="still open at the end"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------
# Gradient sizes of CheXNet
# ---------------------------------------------------------------------------------------


def gradient_sizes(arch: str, image_size: int = 224) -> dict[str, Any]:
    """Parameter counts of :func:`~chexnet_utils.models.build_chexnet` (``weights=None``).

    ``params``: all weights; ``trainable_params``: those that get a gradient (BatchNorm's
    moving mean/variance do not); ``grad_bytes = 4 x trainable_params`` (float32): what
    every worker must average every step; ``tensor_elems``: the size of each gradient
    tensor (how many separate allreduces without fusion). Builds the model (seconds).
    """
    from chexnet_utils.models import build_chexnet

    model = build_chexnet(arch, image_size, weights=None)
    elems = [int(np.prod(v.shape)) for v in model.trainable_variables]
    out = {"arch": arch, "params": int(model.count_params()),
           "trainable_params": int(sum(elems)), "grad_bytes": 4 * int(sum(elems)),
           "n_tensors": len(elems), "tensor_elems": elems}
    del model
    return out


def chexnet_gradient_sizes(archs: Sequence[str] = ("densenet121", "resnet50"),
                           cache: str | os.PathLike[str] | None = None
                           ) -> dict[str, dict[str, Any]]:
    """:func:`gradient_sizes` of each arch, cached in ``<work dir>/gradient_sizes.json``
    (building DenseNet-121 and ResNet-50 takes a few seconds; the counts never change)."""
    from chexnet_utils.config import work_dir

    path = Path(cache) if cache is not None else work_dir() / "gradient_sizes.json"
    known: dict[str, dict[str, Any]] = {}
    if path.exists():
        try:
            known = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            known = {}
    missing = [a for a in archs if a not in known]
    for arch in missing:
        known[arch] = gradient_sizes(arch)
    if missing:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(known), encoding="utf-8")
        os.replace(tmp, path)
    return {a: known[a] for a in archs}


# ---------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------


def plot_sweeps(sweeps: Sequence[Mapping[str, Any]], labels: Sequence[str] | None = None,
                title: str = "", key: str = "times_s"):  # noqa: ANN201
    """Two log-log panels for results of :func:`allreduce_times` /
    :func:`parameter_server_times`: time per reduction, and bus bandwidth (:func:`busbw`).
    ``key``: ``"times_s"`` (median of the repeats) or ``"min_s"`` (fastest)."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for i, sw in enumerate(sweeps):
        label = labels[i] if labels else f"{sw['algorithm']} ({sw['backend']})"
        s = np.asarray(sw["sizes_bytes"], dtype=float)
        t = np.asarray(sw[key], dtype=float)
        ax1.loglog(s, t * 1e3, "o-", ms=3, label=label)
        bw = [busbw(sw["algorithm"], si, ti, sw["size"], sw.get("colocated_server", False))
              for si, ti in zip(s, t)]
        ax2.loglog(s, np.asarray(bw) / 1e9, "o-", ms=3, label=label)
    for ax in (ax1, ax2):
        ax.set_xlabel("tensor size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_ylabel("time per reduction (ms)")
    ax1.set_title("time")
    ax2.set_ylabel("bus bandwidth (GB/s)")
    ax2.set_title("bus bandwidth = busiest link's bytes / time")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
