"""Images/s on 1..N Horovod workers and the scaling efficiency, as the articles measured it.

The Dell articles report CheXNet training throughput on 1, 2, 3, 4 and 8 V100 GPUs: with the
"old" input pipeline the curve is flat (more GPUs, same images/s), with the "new" one it is
nearly linear. :func:`bench_scaling` measures the same curve on ipyparallel MPI engines:
for each worker count it starts a cluster (one engine per worker, bound to its own core by
default, so "1 worker" means one core's worth of compute), runs the same timed training
steps with each pipeline, and stops the cluster.

``efficiency(N) = rate(N) / (N * rate(1))``: 1.0 is perfect linear scaling.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StepBenchConfig:
    """What one timed run trains (the same on every worker)."""

    tfrecords: str
    pipeline: str = "new"
    arch: str = "small"
    image_size: int = 128
    batch_size: int = 16
    """Per worker (the global batch grows with the number of workers, as in the articles)."""
    warmup_steps: int = 20
    """Untimed steps first. Long enough that a pipeline slower than the step has used up
    the decoded images it buffered before the clock starts (the old approach's
    ``prefetch(batch_size)`` holds ``batch_size`` whole batches)."""
    steps: int = 10
    seed: int = 0
    shuffle_buffer: int = 32
    """Record shuffle buffer of both pipelines. Small on purpose: the old approach shuffles
    *decoded* images, and a large buffer would let it start the timed window with hundreds
    of images decoded in advance, which is stock, not throughput."""


def throughput_on_engine(cfg: StepBenchConfig | dict[str, Any]) -> dict[str, Any]:
    """Run on every Horovod worker: ``steps`` timed data-parallel training steps.

    Builds the model, averages gradients with Horovod and broadcasts rank 0's initial
    state, exactly as :func:`chexnet_utils.training.train` does with ``distributed=True``,
    but without validation or checkpoints so that only the training step is timed. The
    clock starts and stops at a barrier (an allreduce), so every worker reports the same
    interval. Returns this worker's rank, the world size and the images/s of the whole job.
    """
    import keras
    import numpy as np

    from chexnet_utils.labels import NUM_CLASSES
    from chexnet_utils.models import WeightedBCE, build_chexnet
    from chexnet_utils.pipelines import build_pipeline
    from chexnet_utils.tfrecords import list_shards
    from chexnet_utils.training import _broadcast_initial_state, _gradient_reducer, _world

    c = StepBenchConfig(**cfg) if isinstance(cfg, dict) else cfg
    rank, size = _world(True)
    import horovod.tensorflow as hvd
    import tensorflow as tf

    keras.utils.set_random_seed(c.seed)
    model = build_chexnet(c.arch, c.image_size)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=WeightedBCE(np.full(NUM_CLASSES, 0.5), np.full(NUM_CLASSES, 0.5)),
                  jit_compile=False)
    model.gradient_reducer = _gradient_reducer(True)
    model.optimizer.build(model.trainable_variables)
    _broadcast_initial_state(model, True)
    ds = build_pipeline(c.pipeline, list_shards(c.tfrecords, "train"), c.batch_size,
                        c.image_size, training=True, num_workers=size, worker_index=rank,
                        seed=c.seed, shuffle_buffer=c.shuffle_buffer)
    it = iter(ds)

    def barrier() -> None:
        hvd.allreduce(tf.constant(0.0), name="bench_barrier", op=hvd.Sum).numpy()

    for _ in range(c.warmup_steps):
        x, y = next(it)
        model.train_on_batch(x, y)
    barrier()
    t0 = time.perf_counter()
    for _ in range(c.steps):
        x, y = next(it)
        model.train_on_batch(x, y)
    barrier()
    seconds = time.perf_counter() - t0
    images = c.steps * c.batch_size * size
    return {"rank": rank, "size": size, "seconds": seconds, "img_per_s": images / seconds,
            "pipeline": c.pipeline}


def efficiency(rates: dict[int, float]) -> dict[int, float]:
    """``rate(N) / (N * rate(1))`` for every N in ``rates`` (needs N = 1)."""
    if 1 not in rates:
        raise ValueError("efficiency needs the 1-worker rate")
    return {n: r / (n * rates[1]) for n, r in rates.items()}


def bench_scaling(tfrecords: Path | str, workers: Sequence[int] = (1, 2),
                  pipelines: Sequence[str] = ("old", "new"), arch: str = "small",
                  image_size: int = 128, batch_size: int = 16, steps: int = 10,
                  warmup_steps: int = 20, repeats: int = 1, bind_to: str | None = "core",
                  map_by: str | None = None,
                  log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Images/s per worker count and pipeline, and the scaling efficiency.

    For each worker count N a fresh :class:`~chexnet_utils.distributed.MPICluster` of N
    engines is started (``bind_to="core"``: one core per worker), every pipeline is timed
    ``repeats`` times in alternating order, and the cluster is stopped. Returns
    ``{"img_per_s": {pipeline: {N: mean}}, "efficiency": {pipeline: {N: eff}}, ...}`` plus
    every run and the cluster start/stop times.
    """
    from chexnet_utils.devices import usable_cores
    from chexnet_utils.distributed import MPICluster

    say = log or (lambda msg: None)
    runs: dict[str, dict[int, list[float]]] = {p: {} for p in pipelines}
    cluster_times: dict[int, dict[str, float]] = {}
    for n in workers:
        one_thread = {"OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1",
                      "TF_NUM_INTEROP_THREADS": "1"} if bind_to == "core" else {}
        with MPICluster(n=n, bind_to=bind_to, map_by=map_by, env=one_thread) as cluster:
            for r in range(repeats):
                order = list(pipelines) if r % 2 == 0 else list(pipelines)[::-1]
                for p in order:
                    cfg = asdict(StepBenchConfig(str(tfrecords), p, arch, image_size,
                                                 batch_size, warmup_steps, steps))
                    res = cluster.run(throughput_on_engine, cfg, stream_rank0=False)
                    rate = res[0]["img_per_s"]
                    runs[p].setdefault(n, []).append(rate)
                    say(f"{n} worker(s), {p} pipeline: {rate:.1f} img/s")
        cluster_times[n] = {"start_s": cluster.start_seconds or 0.0,
                            "stop_s": cluster.stop_seconds or 0.0}
    means = {p: {n: sum(v) / len(v) for n, v in runs[p].items()} for p in pipelines}
    return {
        "workers": list(workers), "pipelines": list(pipelines), "arch": arch,
        "image_size": image_size, "batch_size_per_worker": batch_size, "steps": steps,
        "repeats": repeats, "bind_to": bind_to, "cores": usable_cores(),
        "tfrecords": str(tfrecords),
        "img_per_s": {p: {str(n): r for n, r in means[p].items()} for p in pipelines},
        "efficiency": {p: {str(n): e for n, e in efficiency(means[p]).items()}
                       for p in pipelines} if 1 in workers else {},
        "runs": {p: {str(n): v for n, v in runs[p].items()} for p in pipelines},
        "cluster_seconds": {str(n): t for n, t in cluster_times.items()},
    }


def format_scaling(r: dict[str, Any]) -> str:
    """Readable table of :func:`bench_scaling` results."""
    lines = [f"{r['arch']} at {r['image_size']} px, batch {r['batch_size_per_worker']}/worker, "
             f"{r['steps']} timed steps, bind-to {r['bind_to']}, {r['cores']} cores"]
    lines.append(f"{'workers':>8}  " + "  ".join(f"{p + ' img/s':>12}  {'eff.':>5}"
                                                  for p in r["pipelines"]))
    for n in r["workers"]:
        cells = []
        for p in r["pipelines"]:
            eff = r["efficiency"].get(p, {}).get(str(n), float("nan"))
            cells.append(f"{r['img_per_s'][p][str(n)]:12.1f}  {eff:5.2f}")
        lines.append(f"{n:>8}  " + "  ".join(cells))
    return "\n".join(lines)
