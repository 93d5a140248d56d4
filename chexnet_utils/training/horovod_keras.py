"""Horovod with Keras 3: the patterns that average gradients, the one that silently does not,
and the check that catches workers drifting apart.

Measured with Horovod 0.28.1 on Keras 3 (TensorFlow backend), 2 ranks
(tests/mpi/test_horovod_keras.py):

(a) **a training step with ``hvd.DistributedGradientTape``** works when the tape is asked for
    the gradients of the *backing* ``tf.Variable`` of each Keras 3 variable,
    ``[v.value for v in model.trainable_variables]``: Horovod keys the gradients by
    ``tf.Variable.ref()``, which Keras 3 variables do not have. Notebook 04 writes it in
    ``%%px`` cells (section 2.0) and ``scripts/train_horovod_minimal.py`` uses it;
(b) **one allreduce per gradient** (:func:`per_tensor_average`, and (a), which does the same)
    lets communication overlap the backward pass: inside a ``tf.function`` each allreduce is
    its own op that TensorFlow starts as soon as *that* gradient exists, so the last layer's
    gradients can be averaged while earlier layers are still being differentiated. One
    ``grouped_allreduce`` (:func:`grouped_average`) takes every gradient as input, so it
    starts only after the whole backward pass. A Horovod timeline shows the difference:
    :func:`enqueue_spread` measures how long after the first gradient the last one reached
    Horovod, per step (about the backward pass for per-tensor, zero for grouped);
(c) ``hvd.keras.DistributedOptimizer`` (Horovod's documented Keras recipe) **runs without an
    error but does not average on Keras 3**: it wraps the optimizer's ``get_gradients`` /
    ``_compute_gradients``, which Keras 2's ``fit`` called and Keras 3's ``train_step`` never
    calls (it uses a ``GradientTape`` and ``apply_gradients``). Every rank then trains on its
    own gradients and the copies drift apart (:func:`keras_optimizer_digests` proves it).
    The same script works on Keras 2 (``tf-keras`` with ``TF_USE_LEGACY_KERAS=1``);
(d) the project's own ``train_step`` (:class:`chexnet_utils.model.models.ChexNet`) with a
    ``gradient_reducer`` seam: :func:`chexnet_utils.training.train` fills it with (b); the
    alternative filling, one grouped allreduce, is the "(d)" row of notebook 04.

Whatever the pattern, :class:`~chexnet_utils.training.callbacks.RankAgreement` compares a cheap
digest of the trainable weights across ranks after the first steps and at every epoch end and
raises :class:`RanksDiverged` naming the likely cause, instead of letting the job train on
silently different copies.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

DIVERGENCE_CAUSES = (
    "an optimizer that does not average gradients (hvd.keras.DistributedOptimizer with "
    "Keras 3's model.fit does not: use hvd.DistributedGradientTape in train_step or "
    "allreduce the gradients yourself), a decision taken on one rank's own numbers (a "
    "learning-rate change or early stop from unaveraged validation metrics), or initial "
    "weights that were not broadcast from rank 0")


class RanksDiverged(RuntimeError):
    """The workers of a data-parallel job no longer hold the same trainable weights."""


def random_batch(rng: np.random.Generator, n: int, image_size: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``n`` synthetic images (uniform, float32 RGB) and 14 labels each (positive with
    probability 0.3), drawn from ``rng``: the data of one rank in the checks below."""
    x = rng.random((n, image_size, image_size, 3), dtype=np.float32)
    y = (rng.random((n, 14)) < 0.3).astype(np.float32)
    return x, y


# ---- averaging the gradients -----------------------------------------------------------------

def per_tensor_average(grads: Sequence[Any]) -> list[Any]:
    """Pattern (b): one ``hvd.allreduce`` per gradient (Horovod fuses small ones itself).

    Inside a ``tf.function`` each allreduce starts as soon as its own gradient is computed,
    overlapping the rest of the backward pass.
    """
    import horovod.tensorflow as hvd

    return [hvd.allreduce(g, op=hvd.Average, name=f"grad_{i}") for i, g in enumerate(grads)]


def grouped_average(grads: Sequence[Any]) -> list[Any]:
    """One ``hvd.grouped_allreduce`` over all gradients: starts after the whole backward pass."""
    import horovod.tensorflow as hvd

    return list(hvd.grouped_allreduce(list(grads), op=hvd.Average))


AVERAGERS: dict[str, Callable[[Sequence[Any]], list[Any]]] = {
    "per_tensor": per_tensor_average, "grouped": grouped_average}


def broadcast_model(model: Any) -> None:
    """Rank 0's model and optimizer variables to every rank (Keras 3: their ``.value``)."""
    import horovod.tensorflow as hvd

    variables = list(model.variables)
    if getattr(model, "optimizer", None) is not None and model.optimizer.built:
        variables += list(model.optimizer.variables)
    hvd.broadcast_variables([v.value for v in variables], root_rank=0)


# ---- are the ranks still the same model? -------------------------------------------------------

def weights_sha256(weights: Sequence[Any]) -> str:
    """The fingerprint of a model's weights: sha256 of their bytes, in order.

    Of ``model.trainable_weights`` it is equal on all workers of a healthy Horovod job, bit
    for bit: same initial values (broadcast), same averaged gradients, same optimizer; what
    ``metrics.json`` records per rank and what the rank-agreement check compares. BatchNorm's
    moving mean and variance are *not* trainable: each worker updates them from its own
    batches, so ``model.weights`` differ slightly between workers (rank 0's are the ones
    saved; ``hvd.SyncBatchNormalization`` would average them too).
    """
    h = hashlib.sha256()
    for w in weights:
        h.update(np.ascontiguousarray(np.asarray(w)).tobytes())
    return h.hexdigest()


def ranks_that_differ(fingerprints: Sequence[str]) -> list[int]:
    """Ranks whose fingerprint (:func:`weights_sha256`) differs from rank 0's; ``[]`` if
    none."""
    return [r for r in range(1, len(fingerprints)) if fingerprints[r] != fingerprints[0]]


def check_ranks_agree(weights: Sequence[Any], where: str) -> None:
    """Gather every rank's :func:`weights_sha256` (and
    whether its weights are finite) and raise :class:`RanksDiverged` on every rank if any
    differs from rank 0's (all ranks raise together: no rank is left waiting in a
    collective). ``where`` says when ("after step 2", "at the end of epoch 3")."""
    import horovod.tensorflow as hvd

    mine = (weights_sha256(weights), all(np.isfinite(np.asarray(w)).all() for w in weights))
    gathered = hvd.allgather_object(mine, name="chexnet_rank_fingerprint")
    if not all(finite for _, finite in gathered):
        raise FloatingPointError(
            f"the weights are no longer finite (NaN or inf) {where}: training diverged "
            "(a learning rate too high for this many workers? try a longer warm-up or "
            "lr_scaling='sqrt')")
    bad = ranks_that_differ([sha for sha, _ in gathered])
    if bad:
        raise RanksDiverged(
            f"the workers hold different weights {where}: rank(s) {bad} differ from rank 0. "
            f"Likely cause: {DIVERGENCE_CAUSES}.")


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
    import horovod.tensorflow as hvd
    import keras

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
    import horovod.tensorflow as hvd
    import horovod.tensorflow.keras as hvd_keras
    import keras

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
    from collections import Counter

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
    import time

    import horovod.tensorflow as hvd
    import keras

    from chexnet_utils.comm.timeline import parse_timeline, record_timeline, wait_for_timeline
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
    from ipyparallel import error

    from chexnet_utils.cluster.distributed import remote_errors

    remote = (remote_errors(exc) if isinstance(exc, error.RemoteError)
              else [(type(exc).__name__, str(exc))])
    for ename, evalue in remote:
        if ename == name:
            return f"{ename}: {evalue}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else repr(exc)


# ---- notebook 04's exercise 7 -----------------------------------------------------------------

def _trial_model(seed: int, image_size: int, optimizer: Any) -> tuple[Any, Any]:
    """The small CheXNet built from ``seed``, and ``optimizer`` built for its weights."""
    import keras

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
    from chexnet_utils.cluster.distributed import MPICluster

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
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

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
