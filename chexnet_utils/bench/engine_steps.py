"""Timed data-parallel training steps on MPI workers: Horovod or MultiWorkerMirroredStrategy.

The same training step (synthetic in-memory batch, forward, loss, gradients, average, SGD
update) timed with Horovod averaging the gradients (:func:`hvd_throughput_on_engine`) or
with ``tf.distribute.MultiWorkerMirroredStrategy`` (:func:`mwms_setup_on_engine`, then
:func:`mwms_throughput_on_engine`), switched by one flag
(:func:`backend_throughput_on_engine`). What
to run is a :class:`StepConfig`. Everything ending in ``_on_engine`` runs on every worker at
once (``cluster.run(fn, ...)``). Not to be confused with
:func:`chexnet_utils.bench.scaling.throughput_on_engine` (the Horovod step of
:func:`chexnet_utils.training.train`, timed for the 1..N worker scaling curve).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from chexnet_utils.cluster.distributed import mpi_rank
from chexnet_utils.comm.collectives import (
    barrier,
    horovod_compression,
    init_horovod,
    quiet_tensorflow,
)
from chexnet_utils.comm.timeline import record_timeline
from chexnet_utils.input.pipelines import Pipeline
from chexnet_utils.model.architectures import Architecture
from chexnet_utils.platform.lazy import lazy_module
from chexnet_utils.platform.timing import barrier_windows
from chexnet_utils.training.horovod_keras import weights_sha256

# Keras, TensorFlow: imported on first use (chexnet_utils.platform.lazy)
keras = lazy_module("keras")
tf = lazy_module("tensorflow")


@dataclass(frozen=True)
class StepConfig:
    """What one timed data-parallel training run on the engines looks like: the same on
    every worker, passed to the ``*_on_engine`` step timers as itself or as ``asdict(cfg)``.

    One class for every engine step timer: :func:`hvd_throughput_on_engine` and
    :func:`mwms_throughput_on_engine` (synthetic in-memory batch: ``tfrecords`` unused),
    :func:`chexnet_utils.bench.scaling.throughput_on_engine` (batches from the ``pipeline`` over
    ``tfrecords``, model on the CPU or an emulated accelerator) and
    :func:`chexnet_utils.bench.gpu_node.gpu_throughput_on_engine` (the same on a GPU, with
    ``mixed_precision``, ``xla`` and ``rank_cpus``). Each timer reads the fields it needs;
    the defaults are the synthetic-batch timers' (the scaling and GPU reports pass their
    own sizes).
    """

    arch: Architecture = "small"
    image_size: int = 64
    batch_size: int = 16
    """Per worker (the global batch grows with the number of workers, as in the articles)."""
    steps: int = 10
    """Timed steps per repeat."""
    warmup_steps: int = 3
    """Untimed steps first: tracing, compilation, filling the pipeline's buffers."""
    repeats: int = 1
    """Timed blocks of ``steps`` steps; ``img_per_s`` is their median (synthetic-batch
    timers)."""
    learning_rate: float = 0.01
    """SGD learning rate of the synthetic-batch timers."""
    seed: int = 0
    tfrecords: str | None = None
    """Converted folder whose train shards feed the step (pipeline-fed timers); ``None``:
    a synthetic in-memory batch, made once per worker (random images and labels) and
    reused, so only compute and gradient communication are timed."""
    pipeline: Pipeline = "new"
    """``"old"`` or ``"new"`` input pipeline (pipeline-fed timers)."""
    shuffle_buffer: int | None = None
    """Record shuffle buffer of the pipeline; ``None``: the timer's default."""
    accelerator_ms: float = 0.0
    """0: the model trains on this worker's CPU. > 0: emulated accelerator, each step waits
    this long instead of computing, then averages gradient-sized tensors across workers
    (:func:`chexnet_utils.bench.scaling.throughput_on_engine`)."""
    mixed_precision: bool | None = None
    """GPU timer: mixed_float16 (``None``: as :mod:`chexnet_utils.model.accelerator` decides)."""
    xla: bool | None = None
    """GPU timer: jit_compile (``None``: as :mod:`chexnet_utils.model.accelerator` decides)."""
    rank_cpus: tuple[tuple[int, ...], ...] = ()
    """GPU timer: when set, local rank *i* binds itself to ``rank_cpus[i]`` first
    (:attr:`~chexnet_utils.hardware.gpu_topology.BindingPlan.self_bind`)."""

    @classmethod
    def of(cls, cfg: StepConfig | Mapping[str, Any] | None = None,
           **overrides: Any) -> StepConfig:
        """``cfg`` (a :class:`StepConfig`, a dict such as ``asdict(cfg)`` - engines receive
        dicts - or ``None`` for the defaults) with the ``overrides`` that are not ``None``."""
        base = asdict(cfg) if isinstance(cfg, StepConfig) else dict(cfg or {})
        base.update({k: v for k, v in overrides.items() if v is not None})
        if isinstance(base.get("rank_cpus"), list):  # asdict + JSON turn tuples into lists
            base["rank_cpus"] = tuple(tuple(c) for c in base["rank_cpus"])
        return cls(**base)


def _synthetic_batch(c: StepConfig, rank: int) -> tuple[Any, Any]:
    from chexnet_utils.data.labels import NUM_CLASSES

    rng = np.random.default_rng([c.seed, rank])
    x = rng.standard_normal((c.batch_size, c.image_size, c.image_size, 3), dtype=np.float32)
    y = (rng.random((c.batch_size, NUM_CLASSES)) < 0.2).astype(np.float32)
    return tf.constant(x), tf.constant(y)


def _snapshot(model: Any) -> list[np.ndarray]:
    return [np.array(v.numpy(), dtype=np.float64) for v in model.trainable_variables]


def _update_norm(model: Any, before: list[np.ndarray]) -> float:
    """L2 norm of how far the weights moved since ``before`` (same on every worker, and the
    same for two back ends that average the same gradients)."""
    return float(np.sqrt(sum(((v.numpy() - b) ** 2).sum()
                             for v, b in zip(model.trainable_variables, before, strict=True))))


def hvd_throughput_on_engine(cfg: StepConfig | Mapping[str, Any] | None = None,
                             reduction: str = "grouped", compression: str = "none",
                             timeline_path: str | None = None, timeline_steps: int = 3,
                             **overrides: Any) -> dict[str, Any]:
    """Images/s of Horovod data-parallel training steps. Run on every worker.

    The step is a ``tf.function``: forward, loss, ``tape.gradient``, average the gradients
    with Horovod, ``optimizer.apply_gradients`` (SGD). ``reduction="grouped"`` averages them
    in one ``hvd.grouped_allreduce``, ``"per_tensor"``
    (as :mod:`chexnet_utils.training.dataparallel`) with one ``hvd.allreduce`` per gradient
    (like ``hvd.DistributedGradientTape``); optional ``compression="fp16"``. Rank 0's initial
    weights are broadcast first.

    With ``timeline_path`` and ``HOROVOD_TIMELINE=DYNAMIC`` in the workers' environment
    (``MPICluster(env={"HOROVOD_TIMELINE": "DYNAMIC"})``), ``timeline_steps`` more steps are
    run after the timed ones between ``hvd.start_timeline(path)`` and ``hvd.stop_timeline()``
    (rank 0 writes the file; recording is kept out of the timed steps).

    Returns rank, size, ``img_per_s`` of the whole job (median over ``repeats``), seconds,
    the per-step time, a weights checksum (equal on every worker if the gradients were
    really averaged) and ``update_norm``, how far the weights moved (the same for any back
    end that averages the same gradients).
    """
    from chexnet_utils.model.models import build_chexnet
    from chexnet_utils.training.dataparallel import broadcast_initial_state, init_world

    quiet_tensorflow()
    c = StepConfig.of(cfg, **overrides)
    rank, n = init_world(True)
    hvd = init_horovod()
    comp = horovod_compression(hvd, compression)
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
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    runs = _timed_runs(step, lambda: barrier(hvd), c, finish=lambda loss: loss.numpy())
    trained = [v.numpy() for v in model.trainable_variables]
    checks = {"weights_checksum": weights_sha256(trained),
              "update_norm": _update_norm(model, initial)}
    recorded = None
    if timeline_path:
        recorded = record_timeline(hvd, timeline_path, lambda: step().numpy(), timeline_steps)
    return {"backend": "horovod", "reduction": reduction, "compression": compression,
            "rank": rank, "size": n, **_throughput(runs, c, n),
            "params": int(model.count_params()), **checks, "timeline_path": recorded,
            "config": asdict(c)}


def _timed_runs(step: Callable[[], Any], sync: Callable[[], None], c: StepConfig,
                finish: Callable[[Any], Any]) -> list[float]:
    """Seconds of each of ``c.repeats`` (at least one) windows of ``c.steps`` steps after
    ``c.warmup_steps`` untimed ones, barrier to barrier
    (:func:`~chexnet_utils.platform.timing.barrier_windows`; ``finish`` waits for the last
    step's result)."""
    return [w.seconds for w in barrier_windows(step, sync, c.steps, max(1, c.repeats),
                                               c.warmup_steps, finish=finish)]


def _throughput(runs: list[float], c: StepConfig, n: int) -> dict[str, Any]:
    rates = [c.steps * c.batch_size * n / r for r in runs]
    seconds = float(np.median(runs))
    return {"seconds": seconds, "step_s": seconds / c.steps,
            "img_per_s": float(np.median(rates)), "runs_img_per_s": rates}


class _OptimizerHolder:
    """What :func:`chexnet_utils.training.dataparallel.broadcast_initial_state` needs:
    ``.variables`` and ``.optimizer.variables``."""

    def __init__(self, model: Any, optimizer: Any) -> None:
        self.variables = model.variables
        self.optimizer = optimizer



# -- MultiWorkerMirroredStrategy -------------------------------------------------------

_MWMS: dict[str, Any] = {}


def tf_config(ports: Sequence[int], rank: int, host: str = "127.0.0.1") -> dict[str, Any]:
    """The ``TF_CONFIG`` of worker ``rank`` in a cluster of ``len(ports)`` workers.

    ``{"cluster": {"worker": ["host:port0", "host:port1", ...]}, "task": {"type": "worker",
    "index": rank}}``: every worker gets the same list and its own index (here: its MPI
    rank, so TensorFlow's worker 0 is Horovod's rank 0).
    """
    return {"cluster": {"worker": [f"{host}:{int(p)}" for p in ports]},
            "task": {"type": "worker", "index": int(rank)}}


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
    tells the peers where to connect), unauthenticated, for the life of the process. So
    :func:`chexnet_utils.platform.exposure.require_private_network` is asked first, before
    TensorFlow is imported: a :class:`~chexnet_utils.platform.exposure.SharedHostError` where other
    accounts could reach the server; its answer is the result's ``"exposure"``.
    """
    from chexnet_utils.platform.exposure import require_private_network

    exposure = require_private_network("MultiWorkerMirroredStrategy server")

    quiet_tensorflow()
    key = ",".join(str(p) for p in ports)
    if _MWMS.get("key") == key:
        s = _MWMS["strategy"]
        return {"rank": mpi_rank(), "replicas": s.num_replicas_in_sync, "reused": True,
                "exposure": exposure}
    if _MWMS:
        raise RuntimeError("this process already has a MultiWorkerMirroredStrategy for other "
                           "ports; TensorFlow cannot create a second one (restart the engines)")
    rank = mpi_rank()
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
    adopt_mwms_strategy(strategy, ports)
    return {"rank": rank, "replicas": strategy.num_replicas_in_sync, "reused": False,
            "tf_config": json.loads(os.environ["TF_CONFIG"]),
            "implementation": implementation, "exposure": exposure}


def adopt_mwms_strategy(strategy: Any, ports: Sequence[int]) -> None:
    """Keep a ``MultiWorkerMirroredStrategy`` made in a notebook cell (notebook 06 writes the
    set-up out) as this process's, for :func:`mwms_throughput_on_engine`; as
    :func:`mwms_setup_on_engine` would have kept its own. Run on a worker."""
    key = ",".join(str(p) for p in ports)
    if _MWMS and _MWMS.get("key") != key:
        raise RuntimeError("this process already has a MultiWorkerMirroredStrategy for other "
                           "ports; TensorFlow cannot create a second one (restart the engines)")
    _MWMS.update(key=key, strategy=strategy)


def mwms_strategy() -> Any:
    """This process's ``MultiWorkerMirroredStrategy``, made by :func:`mwms_setup_on_engine`
    (TensorFlow allows one per process). Run on a worker."""
    if "strategy" not in _MWMS:
        raise RuntimeError("call mwms_setup_on_engine(ports) on every engine first")
    return _MWMS["strategy"]


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
    from chexnet_utils.model.models import build_chexnet

    if "strategy" not in _MWMS:
        raise RuntimeError("call mwms_setup_on_engine(ports) on every engine first")
    quiet_tensorflow()
    strategy = _MWMS["strategy"]
    c = StepConfig.of(cfg, **overrides)
    rank = mpi_rank()
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
        # all-reduces (sum)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def step() -> Any:
        return strategy.run(replica_step)

    def strategy_barrier() -> None:
        one = strategy.run(lambda: tf.constant(1.0))
        strategy.reduce(tf.distribute.ReduceOp.SUM, one, axis=None).numpy()

    runs = _timed_runs(step, strategy_barrier, c,
                       finish=lambda loss: strategy.experimental_local_results(loss)[0].numpy())
    return {"backend": "mwms", "rank": rank, "size": n, **_throughput(runs, c, n),
            "params": int(model.count_params()),
            "weights_checksum": weights_sha256([v.numpy() for v in model.trainable_variables]),
            "update_norm": _update_norm(model, initial), "config": asdict(c)}


def backend_throughput_on_engine(backend: str = "horovod",
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

