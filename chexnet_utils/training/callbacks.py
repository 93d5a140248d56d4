"""The Keras callbacks of :func:`chexnet_utils.training.train`, in the order it adds them.

This module imports Keras (``train`` imports it when it runs, so ``import
chexnet_utils.training`` stays free of TensorFlow):

``Broadcast``
    Data-parallel change 5: rank 0's variables to all at the start of training.
``EpochTimer``
    Wall time of each epoch's training steps (before validation and checkpoints).
``RankAgreement``
    Distributed: stops the job when the workers' weights drifted apart
    (:func:`~chexnet_utils.training.horovod_keras.check_ranks_agree`).
``MetricAverage``
    Distributed: each epoch's training metrics averaged across workers.
``Warmup``
    Distributed: the learning rate raised linearly to its scaled value (Goyal et al.).
``Validation``
    The whole val split predicted at every epoch end: ``val_loss`` and the exact
    ``val_mean_auroc`` (averaged across workers when distributed).
``PlateauLR``
    ``ReduceLROnPlateau`` whose counters survive a resume.
``Checkpointer``
    Best and last checkpoints and ``state.json`` (:mod:`chexnet_utils.training.checkpoints`).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from chexnet_utils.model.auroc import mean_auroc, per_class_auroc
from chexnet_utils.platform.atomic import json_safe
from chexnet_utils.training.checkpoints import (
    BEST_NAME,
    LAST_NAME,
    discard_uncommitted,
    write_checkpoint,
)
from chexnet_utils.training.dataparallel import allreduce_mean, broadcast_initial_state
from chexnet_utils.training.horovod_keras import check_ranks_agree
from chexnet_utils.training.splits import loss_value, predict_split

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["Broadcast", "Checkpointer", "EpochTimer", "MetricAverage", "PlateauLR",
           "RankAgreement", "Validation", "Warmup"]


class EpochTimer(keras.callbacks.Callback):
    """Wall time of each epoch's training steps (first after ``Broadcast``, so it stops
    before validation and checkpointing)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[int, float]] = []
        self._t0 = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._t0 = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        seconds = time.perf_counter() - self._t0
        self.records.append((epoch, seconds))
        if logs is not None:
            logs["epoch_s"] = seconds


class Validation(keras.callbacks.Callback):
    """Predict the whole val split at epoch end; add ``val_loss`` and ``val_mean_auroc``
    (exact, ``auroc.per_class_auroc``) to the logs, keep the per-class AUROC of every
    epoch."""

    def __init__(self, dataset: tf.data.Dataset, loss_fn: Any,
                 distributed: bool = False) -> None:
        super().__init__()
        self.dataset = dataset
        self.loss_fn = loss_fn
        self.distributed = distributed
        self.per_class: dict[int, dict[str, float]] = {}

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        y_true, y_score = predict_split(self.model, self.dataset)
        per_class = per_class_auroc(y_true, y_score)
        loss = loss_value(self.loss_fn, y_true, y_score)
        if self.distributed:
            # Each rank predicts with its own BatchNorm moving statistics, so its numbers
            # differ a little; every decision taken on them (learning-rate plateau, best
            # epoch) must see the same numbers on every rank: average them first.
            averaged = allreduce_mean({**per_class, "__loss__": loss})
            loss = averaged.pop("__loss__")
            per_class = {name: averaged[name] for name in per_class}
        self.per_class[epoch] = per_class
        if logs is not None:
            logs["val_loss"] = loss
            logs["val_mean_auroc"] = mean_auroc(per_class)


class PlateauLR(keras.callbacks.ReduceLROnPlateau):
    """``ReduceLROnPlateau`` whose counters survive a resume (``initial_state``)."""

    def __init__(self, *args: Any, initial_state: dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initial_state = initial_state

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        super().on_train_begin(logs)
        if self.initial_state:
            best = self.initial_state.get("best")
            self.best = None if best is None else float(best)
            self.wait = int(self.initial_state.get("wait", 0))
            self.cooldown_counter = int(self.initial_state.get("cooldown_counter", 0))

    def state(self) -> dict[str, Any]:
        best = None if self.best is None else float(self.best)
        return {"best": best, "wait": int(self.wait),
                "cooldown_counter": int(self.cooldown_counter)}


class Checkpointer(keras.callbacks.Callback):
    """At every epoch end: track the best ``val_mean_auroc``; on rank 0 write
    ``best.weights.h5`` when it improved, then ``last.keras`` and ``state.json``, as one
    consistent set (:func:`~chexnet_utils.training.checkpoints.write_checkpoint`)."""

    def __init__(self, ckpt_dir: Path, write: bool, state: dict[str, Any],
                 plateau: PlateauLR, monitor: str | None) -> None:
        super().__init__()
        self.ckpt_dir = ckpt_dir
        self.write = write
        self.state = state
        self.plateau = plateau
        self.monitor = monitor
        if write:  # temporary files of a set a crash kept from being committed
            discard_uncommitted(ckpt_dir)

    def _improved(self, score: float | None) -> bool:
        """First epoch; a finite score above the best; or no finite score so far (a val
        split too small to have any class with positives and negatives: keep the
        latest epoch rather than the first)."""
        best = self.state.get("best_score")
        if best is None or not math.isfinite(best) or self.state.get("best_epoch") is None:
            return True
        return score is not None and math.isfinite(score) and score > best

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        logs = dict(logs or {})
        score = logs.get(self.monitor) if self.monitor else None
        improved = True if self.monitor is None else self._improved(score)
        if improved:
            self.state["best_epoch"] = epoch + 1
            self.state["best_score"] = None if score is None else float(score)
        self.state["epoch"] = epoch + 1
        self.state["plateau"] = self.plateau.state()
        self.state["optimizer_iterations"] = int(self.model.optimizer.iterations.numpy())
        self.state["learning_rate"] = float(
            np.asarray(self.model.optimizer.learning_rate))
        self.state.setdefault("history", []).append(
            {"epoch": epoch + 1, **{k: json_safe(v) for k, v in logs.items()}})
        if not self.write:
            return
        writers = {BEST_NAME: self.model.save_weights} if improved else {}
        write_checkpoint(self.ckpt_dir, self.state, {**writers, LAST_NAME: self.model.save})


class Broadcast(keras.callbacks.Callback):
    """Calls :func:`broadcast_initial_state` once at the start of training."""

    def __init__(self, distributed: bool) -> None:
        super().__init__()
        self.distributed = distributed

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        broadcast_initial_state(self.model, self.distributed)


class MetricAverage(keras.callbacks.Callback):
    """Distributed: replace each worker's epoch training metrics (on its own shard) by
    the average over all workers, before anything logs or acts on them."""

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is None:
            return
        numeric = {k: float(v) for k, v in logs.items()
                   if k != "epoch_s" and isinstance(v, (int, float, np.floating))}
        logs.update(allreduce_mean(numeric))


class Warmup(keras.callbacks.Callback):
    """Linear learning-rate warm-up from ``start_lr`` to ``target_lr`` over ``steps``
    optimizer steps (Goyal et al. 2017), driven by the optimizer's step counter so that
    a resumed run continues where it was."""

    def __init__(self, start_lr: float, target_lr: float, steps: int) -> None:
        super().__init__()
        self.start_lr, self.target_lr, self.steps = start_lr, target_lr, max(1, steps)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        step = int(self.model.optimizer.iterations.numpy())
        if step <= self.steps:
            frac = min(1.0, step / self.steps)
            self.model.optimizer.learning_rate.assign(
                self.start_lr + (self.target_lr - self.start_lr) * frac)


class RankAgreement(keras.callbacks.Callback):
    """Stops a Horovod job whose workers drifted apart: :func:`check_ranks_agree` after
    ``after_steps`` steps of the first epoch and at every epoch end (first in the list of
    callbacks that change state)."""

    def __init__(self, after_steps: int = 2) -> None:
        super().__init__()
        self.after_steps = after_steps
        self.checked_early = False
        self.checks = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if not self.checked_early and batch + 1 >= self.after_steps:
            self.checked_early = True
            self.checks += 1
            check_ranks_agree(self.model.trainable_weights, f"after step {batch + 1}")

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.checks += 1
        check_ranks_agree(self.model.trainable_weights, f"at the end of epoch {epoch + 1}")
