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
    :func:`chexnet_utils.training.experiments.enqueue_spread` measures how long after the
    first gradient the last one reached Horovod, per step (about the backward pass for
    per-tensor, zero for grouped);
(c) ``hvd.keras.DistributedOptimizer`` (Horovod's documented Keras recipe) **runs without an
    error but does not average on Keras 3**: it wraps the optimizer's ``get_gradients`` /
    ``_compute_gradients``, which Keras 2's ``fit`` called and Keras 3's ``train_step`` never
    calls (it uses a ``GradientTape`` and ``apply_gradients``). Every rank then trains on its
    own gradients and the copies drift apart
    (:func:`chexnet_utils.training.experiments.keras_optimizer_digests` proves it).
    The same script works on Keras 2 (``tf-keras`` with ``TF_USE_LEGACY_KERAS=1``);
(d) the project's own ``train_step`` (:class:`chexnet_utils.model.models.ChexNet`) with a
    ``gradient_reducer`` seam: :func:`chexnet_utils.training.train` fills it with (b); the
    alternative filling, one grouped allreduce, is the "(d)" row of notebook 04.

Whatever the pattern, :class:`~chexnet_utils.training.callbacks.RankAgreement` compares a cheap
digest of the trainable weights across ranks after the first steps and at every epoch end and
raises :class:`RanksDiverged` naming the likely cause, instead of letting the job train on
silently different copies.

This module is the seam the training code stands on (``loop``, ``callbacks``,
``dataparallel``); notebook 04's experiments that prove (a)-(d) on its engines, and the
exercise trials, are in :mod:`chexnet_utils.training.experiments`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from chexnet_utils.platform.lazy import lazy_module

# Horovod: imported on first use (chexnet_utils.platform.lazy)
hvd = lazy_module("horovod.tensorflow")

DIVERGENCE_CAUSES = (
    "an optimizer that does not average gradients (hvd.keras.DistributedOptimizer with "
    "Keras 3's model.fit does not: use hvd.DistributedGradientTape in train_step or "
    "allreduce the gradients yourself), a decision taken on one rank's own numbers (a "
    "learning-rate change or early stop from unaveraged validation metrics), or initial "
    "weights that were not broadcast from rank 0")


class RanksDiverged(RuntimeError):
    """The workers of a data-parallel job no longer hold the same trainable weights."""


# ---- averaging the gradients -----------------------------------------------------------------

def per_tensor_average(grads: Sequence[Any]) -> list[Any]:
    """Pattern (b): one ``hvd.allreduce`` per gradient (Horovod fuses small ones itself).

    Inside a ``tf.function`` each allreduce starts as soon as its own gradient is computed,
    overlapping the rest of the backward pass.
    """
    return [hvd.allreduce(g, op=hvd.Average, name=f"grad_{i}") for i, g in enumerate(grads)]


def grouped_average(grads: Sequence[Any]) -> list[Any]:
    """One ``hvd.grouped_allreduce`` over all gradients: starts after the whole backward pass."""
    return list(hvd.grouped_allreduce(list(grads), op=hvd.Average))


AVERAGERS: dict[str, Callable[[Sequence[Any]], list[Any]]] = {
    "per_tensor": per_tensor_average, "grouped": grouped_average}


def broadcast_model(model: Any) -> None:
    """Rank 0's model and optimizer variables to every rank (Keras 3: their ``.value``)."""
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
