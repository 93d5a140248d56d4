"""Notebook 04's experiments on Horovod with Keras 3, run on its engines, and the trials its
exercises are judged by.

Each proves one claim of :mod:`chexnet_utils.training.horovod_keras` on real ranks:

- :func:`pattern_digests`: an averaging pattern keeps the ranks identical (rows (b) and (d));
- :func:`keras_optimizer_digests`: Horovod's documented Keras recipe does *not* average on
  Keras 3 (row (c)), and the rank-agreement check catches it;
- :func:`enqueue_spread` / :func:`allreduce_enqueue_spread`: one allreduce per gradient
  overlaps the backward pass, one grouped allreduce does not (a Horovod timeline);
- :func:`join_trial` / :func:`join_problem`: a learner's uneven-shards loop (``hvd.join``,
  then a broadcast) run on every engine and judged (notebook 04's exercise); the fit
  conversion's trial data comes from :func:`random_batch` (``notebook/exercises``).

The training code never imports this module; the seam it stands on stays in
``horovod_keras``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from chexnet_utils.cluster.distributed import MPICluster, remote_errors
from chexnet_utils.comm.timeline import parse_timeline, record_timeline, wait_for_timeline
from chexnet_utils.platform.lazy import lazy_module
from chexnet_utils.training.horovod_keras import (
    AVERAGERS,
    broadcast_model,
    check_ranks_agree,
    weights_sha256,
)

# Horovod, Keras, TensorFlow, ipyparallel: imported on first use (chexnet_utils.platform.lazy)
hvd = lazy_module("horovod.tensorflow")
hvd_keras = lazy_module("horovod.tensorflow.keras")
keras = lazy_module("keras")
tf = lazy_module("tensorflow")
ipp_error = lazy_module("ipyparallel.error")


def random_batch(rng: np.random.Generator, n: int, image_size: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``n`` synthetic images (uniform, float32 RGB) and 14 labels each (positive with
    probability 0.3), drawn from ``rng``: the data of one rank in the checks below."""
    x = rng.random((n, image_size, image_size, 3), dtype=np.float32)
    y = (rng.random((n, 14)) < 0.3).astype(np.float32)
    return x, y


# ---- proving a pattern on N ranks ------------------------------------------------------------

def pattern_digests(pattern: str, steps: int = 3, image_size: int = 32,
                    batch_size: int = 8) -> tuple[str, str]:
    """Run on every engine: does ``pattern`` keep the ranks identical?

    Different initial weights per rank (a rank-dependent seed), made equal by the broadcast;
    different data per rank; ``steps`` steps of ``model.fit`` on the project's own
    ``train_step`` with the gradients averaged by ``pattern``: ``"per_tensor"`` (b, the
    project's default) or ``"grouped"`` (d). Returns the sha256 of the trainable weights
    before and after ``fit``: equal across ranks before (broadcast) and after (averaging),
    different from each other (training happened).
    """
    from chexnet_utils.model.models import build_chexnet

    if pattern not in AVERAGERS:
        raise ValueError(f"pattern must be one of {', '.join(AVERAGERS)}, got {pattern!r}")
    hvd.init()
    keras.utils.set_random_seed(hvd.rank())  # different on purpose: the broadcast fixes it
    model = build_chexnet("small", image_size)
    model.gradient_reducer = AVERAGERS[pattern]
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="binary_crossentropy")
    model.optimizer.build(model.trainable_variables)
    broadcast_model(model)
    start = weights_sha256(model.trainable_weights)
    rng = np.random.default_rng(7 + hvd.rank())
    n = batch_size * steps
    x, y = random_batch(rng, n, image_size)
    model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0, shuffle=False)
    return start, weights_sha256(model.trainable_weights)


# ---- (c) the documented Keras recipe on Keras 3 --------------------------------------------

def keras_optimizer_digests(steps: int = 4, batch_size: int = 8, image_size: int = 32,
                            seed: int = 0, check: bool = False) -> dict[str, Any]:
    """Run Horovod's documented Keras recipe on this rank, Keras 3, and report.

    Same initial weights on every rank (same seed, then broadcast from rank 0), a different
    batch per rank, ``hvd.keras.DistributedOptimizer(SGD)``, ``model.compile`` +
    ``model.fit``. If the optimizer averaged, all ranks would end identical. Returns this
    rank's ``{"rank", "start", "end"}`` digests (sha256 of the trainable weights before and
    after ``fit``), to be compared across ranks; with ``check`` the ranks are compared after
    step 2 (:func:`check_ranks_agree`, as training's ``RankAgreement`` callback does) and
    :class:`RanksDiverged` is raised instead.
    """
    from chexnet_utils.model.models import build_chexnet

    hvd.init()
    keras.utils.set_random_seed(seed)
    model = build_chexnet("small", image_size)
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.05))
    model.compile(optimizer=opt, loss="binary_crossentropy")
    broadcast_model(model)
    start = weights_sha256(model.trainable_weights)
    rng = np.random.default_rng(1000 + hvd.rank())  # each rank its own data
    x, y = random_batch(rng, steps * batch_size, image_size)

    def agree_after(batch: int, logs: Any) -> None:  # as training's RankAgreement, step 2
        if batch + 1 == 2:
            check_ranks_agree(model.trainable_weights, f"after step {batch + 1}")

    callbacks = [keras.callbacks.LambdaCallback(on_train_batch_end=agree_after)] if check else []
    model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0, shuffle=False,
              callbacks=callbacks)
    return {"rank": hvd.rank(), "start": start, "end": weights_sha256(model.trainable_weights)}


# ---- (b) does communication overlap the backward pass? -------------------------------------

def enqueue_spread(events: Sequence[Any], n_tensors: int) -> list[float]:
    """Per training step, milliseconds from the first gradient to the last one reaching
    Horovod (start of ``NEGOTIATE_ALLREDUCE`` in a timeline from
    :func:`chexnet_utils.comm.timeline.parse_timeline`).

    ``n_tensors`` is the number of gradients per step. Step ``k`` is the ``k``-th
    negotiation of each gradient tensor (tensors seen a different number of times, such as
    a barrier, are left out). With one allreduce per gradient the spread is about the
    backward pass (the first gradients can be averaged while it runs); with one grouped
    allreduce it is zero (nothing reaches Horovod before the backward pass ends).
    """
    if n_tensors < 1:
        raise ValueError(f"n_tensors must be >= 1, got {n_tensors}")
    per_tensor: dict[str, list[float]] = {}
    for e in events:
        if e.phase.startswith("NEGOTIATE") and e.depth == 0:
            per_tensor.setdefault(e.tensor, []).append(e.start_us)
    if not per_tensor:
        return []
    steps, _ = Counter(len(v) for v in per_tensor.values()).most_common(1)[0]
    grads = [sorted(v) for v in per_tensor.values() if len(v) == steps]
    if len(grads) != n_tensors:
        raise ValueError(f"expected {n_tensors} gradient tensors negotiated {steps} times each, "
                         f"found {len(grads)}")
    return [(max(g[k] for g in grads) - min(g[k] for g in grads)) / 1000.0
            for k in range(steps)]


def allreduce_enqueue_spread(mode: str, path: str, steps: int = 4, image_size: int = 64,
                             batch_size: int = 8, arch: str = "small") -> dict[str, Any] | None:
    """Run on every engine: train ``steps`` steps of ``arch`` with the gradients averaged
    per ``mode`` (``"per_tensor"`` or ``"grouped"``) while Horovod records a timeline at
    ``path``; rank 0 returns ``{"mode", "n_tensors", "spread_ms", "step_ms", "timeline"}``
    (:func:`enqueue_spread` per step), the other ranks ``None``.

    Needs ``HOROVOD_TIMELINE=DYNAMIC`` in the engines' environment
    (``MPICluster(env={"HOROVOD_TIMELINE": "DYNAMIC"})``).
    """
    from chexnet_utils.model.models import build_chexnet

    if mode not in AVERAGERS:
        raise ValueError(f"mode must be one of {', '.join(AVERAGERS)}, got {mode!r}")
    hvd.init()
    keras.utils.set_random_seed(0)
    model = build_chexnet(arch, image_size)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="binary_crossentropy")
    model.gradient_reducer = AVERAGERS[mode]
    rng = np.random.default_rng(hvd.rank())
    x, y = random_batch(rng, batch_size, image_size)
    for _ in range(2):  # trace the step and fill Horovod's caches first
        model.train_on_batch(x, y)
    t0 = time.perf_counter()
    recorded = record_timeline(hvd, path, lambda: model.train_on_batch(x, y), steps)
    step_ms = (time.perf_counter() - t0) * 1000.0 / steps
    if recorded is None:
        return None
    wait_for_timeline(recorded)
    n = len(model.trainable_weights)
    return {"mode": mode, "n_tensors": n, "spread_ms": enqueue_spread(parse_timeline(recorded), n),
            "step_ms": step_ms, "timeline": recorded}


def error_line(exc: BaseException, name: str) -> str:
    """``"<name>: <message>"`` of the engine error named ``name`` (e.g. ``"RanksDiverged"``)
    among those ipyparallel passes on in ``exc`` (a ``RemoteError``, or a ``CompositeError``
    of one per engine: :func:`chexnet_utils.cluster.distributed.remote_errors`); else the
    first line of ``exc``."""
    remote = (remote_errors(exc) if isinstance(exc, ipp_error.RemoteError)
              else [(type(exc).__name__, str(exc))])
    for ename, evalue in remote:
        if ename == name:
            return f"{ename}: {evalue}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else repr(exc)


# ---- notebook 04's exercise 7 -----------------------------------------------------------------

def _trial_model(seed: int, image_size: int, optimizer: Any) -> tuple[Any, Any]:
    """The small CheXNet built from ``seed``, and ``optimizer`` built for its weights."""
    from chexnet_utils.model.models import build_chexnet

    keras.utils.set_random_seed(seed)
    model = build_chexnet("small", image_size)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def run_on_engines(fn: Callable[..., Any], *args: Any, n_workers: int = 2,
                   run: Callable[..., list[Any]] | None = None, timeout: float = 300
                   ) -> list[Any]:
    """``fn(*args)`` on every engine of a fresh ``n_workers``-engine MPI cluster, torn down
    afterwards (or through ``run``, a running cluster's ``cluster.run``): the results in
    rank order. A job that hangs (a rank waiting for a collective the others never join)
    fails with :class:`~chexnet_utils.cluster.distributed.EngineFailure` after ``timeout`` s, and
    the fresh cluster's teardown ends its engines."""
    if run is not None:
        return run(fn, *args, timeout=timeout)
    with MPICluster(n=n_workers) as cluster:
        return cluster.run(fn, *args, timeout=timeout)


# ---- notebook 04's uneven-shards exercise ------------------------------------------------------

def join_trial(train_all: Callable[[Any, Any, Any], Any], batches_by_rank: Sequence[int] = (4, 2),
               image_size: int = 32, batch_size: int = 8) -> dict[str, Any]:
    """Run on every engine: a learner's ``train_all(step, batches, model)`` on uneven shards.

    Rank ``r`` gets ``batches_by_rank[r % len(...)]`` batches of its own data, the same
    broadcast start and a Horovod step (:func:`hvd.DistributedGradientTape`) with Adam, the
    course's optimizer (``model.optimizer``: a state per weight, so ranks that joined early
    differ in it too). Returns how many of its batches the step ran (``ran``, of ``batches``),
    the sha256 of the trainable weights after ``train_all`` (``end``) and after one more
    step every rank takes together (``after``: equal only if the optimizer states are); a
    rank left waiting in a collective never returns (the caller's timeout reports the hang)."""
    hvd.init()
    model, optimizer = _trial_model(0, image_size, keras.optimizers.Adam(0.01))
    model.compile(optimizer=optimizer, auto_scale_loss=False)   # model.optimizer, as after fit
    hvd.broadcast_variables([v.value for v in model.variables + optimizer.variables], 0)
    loss_fn = keras.losses.BinaryCrossentropy()

    @tf.function
    def hvd_step(images: Any, labels: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, [v.value for v in model.trainable_variables])
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    ran = [0]

    def step(images: Any, labels: Any) -> Any:
        ran[0] += 1
        return hvd_step(images, labels)

    rng = np.random.default_rng(21 + hvd.rank())
    n = int(batches_by_rank[hvd.rank() % len(batches_by_rank)])
    batches = [tuple(tf.constant(a) for a in random_batch(rng, batch_size, image_size))
               for _ in range(n)]
    error = None
    try:
        train_all(step, batches, model)
    except Exception as e:  # the learner's code: report, do not crash the engine
        error = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e) else ''}"
    end = weights_sha256(model.trainable_weights)
    if error is None:    # the next epoch's first step, every rank on its first batch
        hvd_step(*batches[0])
    return {"rank": hvd.rank(), "batches": n, "ran": ran[0], "error": error, "end": end,
            "after": weights_sha256(model.trainable_weights)}


def join_problem(ranks: Sequence[dict[str, Any]]) -> str | None:
    """What is wrong with a ``train_all`` judged from every rank's :func:`join_trial` report
    (``None``: nothing): batches skipped, or ranks that ended with different weights."""
    errors = [f"rank {r['rank']}: {r['error']}" for r in ranks if r.get("error")]
    if errors:
        return f"{errors[0]} (hvd.join() returns a tensor: int(...) makes it a rank)."
    short = [r["rank"] for r in ranks if r["ran"] != r["batches"]]
    if short:
        return (f"ranks {short} did not train on all their batches: run every batch of "
                "your shard, then hvd.join().")
    if len({r["end"] for r in ranks}) > 1:
        return ("no rank hung, but the ranks ended different: those that joined early missed "
                "the last updates; broadcast the variables from the rank hvd.join() returns.")
    if len({r.get("after", r["end"]) for r in ranks}) > 1:
        return ("the weights agree, but one more step made them differ: Adam's state "
                "(iterations, m, v) stayed apart; broadcast model.optimizer.variables too.")
    return None
