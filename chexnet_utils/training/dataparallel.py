"""The data-parallel seams of training: what turns one Keras worker into one of N (Horovod).

:func:`chexnet_utils.training.train` with ``distributed=True``, the engine step timers of
:mod:`chexnet_utils.bench.engine_steps` and :mod:`chexnet_utils.bench.scaling`, and the GPU node
checks of :mod:`chexnet_utils.bench.gpu_node` all use these, so that every measured step is the
step that training takes. Which of the six Horovod changes each one is:

* :func:`init_world` - ``hvd.init()`` and one device (or thread budget) per process
  (changes 1 and 2); ``(0, 1)`` when not distributed;
* :func:`scaled_learning_rate` - the learning rate raised with the number of workers
  (change 3; ``linear`` with a warm-up, as Horovod's examples and docs do; ``sqrt`` as an option);
* :func:`gradient_averager` - the ``grads -> grads`` allreduce plugged into the model's
  ``train_step`` (change 4; the variants are in :mod:`chexnet_utils.training.horovod_keras`);
* :func:`broadcast_initial_state` - rank 0's model and optimizer variables to all (change 5);
* :func:`allreduce_mean` - numbers (epoch metrics) averaged across workers;
* the fingerprint that proves the workers agree, equal on every rank of a healthy job, is
  :func:`chexnet_utils.training.horovod_keras.weights_sha256`.

:class:`Recipe` puts changes 3 and 4 and the optimizer together: one worker's compile
(Adam at the learning rate for the world size, the gradient averager, the optimizer built so
that change 5 has its variables to broadcast). :func:`chexnet_utils.training.train` compiles
with ``Recipe.of(cfg)``, the pipeline-fed benchmarks (:mod:`chexnet_utils.bench.scaling`,
:mod:`chexnet_utils.bench.gpu_node`) with the recipe of a default
:class:`~chexnet_utils.training.TrainConfig`, so "the benchmark times the step that
training takes" holds by construction (``tests/tf/test_recipe.py`` compares the two).

Horovod and TensorFlow are imported inside the functions: importing this module is cheap, and
with ``distributed=False`` nothing of Horovod is touched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from chexnet_utils.platform.lazy import lazy_module

if TYPE_CHECKING:
    import keras

# Horovod, Keras, TensorFlow: imported on first use (chexnet_utils.platform.lazy)
hvd = lazy_module("horovod.tensorflow")
if not TYPE_CHECKING:
    keras = lazy_module("keras")
tf = lazy_module("tensorflow")

__all__ = [
    "LR_SCALINGS",
    "Allreduce",
    "LrScaling",
    "Recipe",
    "allreduce_mean",
    "broadcast_initial_state",
    "gradient_averager",
    "init_world",
    "scaled_learning_rate",
]


def init_world(distributed: bool = False) -> tuple[int, int]:
    """``(rank, size)`` of this process in the training job: ``(0, 1)`` when not distributed.

    Distributed: ``hvd.init()`` (steps 1 and 2 of the conversion: a no-op when already
    initialised), then pin this process to GPU ``hvd.local_rank()`` or, on CPU, give it
    ``cores // local_size`` threads (:func:`chexnet_utils.hardware.devices.pin_process`).
    """
    if not distributed:
        return 0, 1

    from chexnet_utils.hardware.devices import pin_process

    hvd.init()
    pin_process(hvd.local_rank(), hvd.local_size())
    return hvd.rank(), hvd.size()


def gradient_averager(distributed: bool = False, mode: str = "per_tensor"
                      ) -> Callable[[list[Any]], list[Any]] | None:
    """The ``grads -> grads`` function of the model's ``train_step`` (``None``: identity).

    Distributed: every worker's gradients are averaged (ring-allreduce over MPI/Gloo on CPU,
    NCCL on GPUs). ``mode="per_tensor"`` (default): one ``hvd.allreduce`` per gradient, so
    communication overlaps the backward pass; ``"grouped"``: one ``hvd.grouped_allreduce``
    after it (see :mod:`chexnet_utils.training.horovod_keras`).
    """
    if not distributed:
        return None
    from chexnet_utils.training.horovod_keras import AVERAGERS

    if mode not in AVERAGERS:
        raise ValueError(f"mode must be one of {', '.join(AVERAGERS)}, got {mode!r}")
    return AVERAGERS[mode]


def broadcast_initial_state(model: keras.Model, distributed: bool = False) -> None:
    """Make every worker start from rank 0's variables (model and optimizer). Called once,
    after the optimizer is built and before the first step. No-op when not distributed.

    Horovod's ``broadcast_variables`` assigns into ``tf.Variable`` objects, so the Keras 3
    variables are passed by their backing ``.value``.
    """
    if not distributed:
        return

    variables = [v.value for v in [*model.variables, *model.optimizer.variables]]
    hvd.broadcast_variables(variables, root_rank=0)


def allreduce_mean(values: dict[str, float]) -> dict[str, float]:
    """Average numbers across Horovod workers (same keys on every worker)."""
    keys = sorted(values)
    if not keys:
        return {}
    stacked = tf.constant([float(values[k]) for k in keys], dtype=tf.float64)
    averaged = hvd.allreduce(stacked, op=hvd.Average, name="chexnet_epoch_metrics")
    return dict(zip(keys, (float(v) for v in averaged.numpy()), strict=True))


Allreduce = Literal["per_tensor", "grouped"]
"""How the gradients are averaged (:func:`gradient_averager`)."""

LrScaling = Literal["linear", "sqrt"]
LR_SCALINGS: tuple[str, ...] = get_args(LrScaling)


def scaled_learning_rate(lr: float, size: int, scaling: str | None = "linear") -> float:
    """The learning rate for ``size`` workers, each with the single-worker batch.

    ``"linear"`` (the default): ``lr * size``, reached by a warm-up. It is what Horovod does
    with Adam too: ``examples/tensorflow2/tensorflow2_keras_mnist.py`` (v0.28.1) uses
    ``Adam(0.001 * hvd.size())`` with ``LearningRateWarmupCallback(warmup_epochs=3)``, and
    ``docs/keras.rst`` says to scale the learning rate by the number of workers. The rule
    comes from Goyal et al. 2017 ("Accurate, Large Minibatch SGD", arXiv:1706.02677 §2.1-2.2),
    derived and shown empirically for SGD on ImageNet up to a minibatch of about 8k, with a
    5-epoch gradual warm-up. ``"sqrt"``: ``lr * sqrt(size)``, a research result for
    adaptive optimizers (Malladi et al., "On the SDEs and Scaling Rules for Adaptive Gradient
    Algorithms", NeurIPS 2022), offered as an alternative, not a default. ``None``: unchanged.
    """
    if scaling is None:
        return lr
    if scaling == "linear":
        return lr * size
    if scaling == "sqrt":
        return lr * math.sqrt(size)
    raise ValueError(f"learning-rate scaling must be one of {', '.join(LR_SCALINGS)} or None, "
                     f"got {scaling!r}")


@dataclass(frozen=True)
class Recipe:
    """How every worker of a data-parallel job compiles its model: Adam at the learning rate
    for the world size (change 3), the gradient averager in ``train_step`` (change 4), the
    optimizer built so that its variables exist for rank 0's broadcast (change 5). The
    defaults are :class:`~chexnet_utils.training.TrainConfig`'s (it takes them from here)."""

    learning_rate: float = 1e-3
    """Adam's learning rate for one worker (CheXNet: 1e-3, Rajpurkar et al. 2017, section 2.2)."""
    scale_lr: bool = True
    """Distributed: raise it with the number of workers (``lr_scaling``)."""
    lr_scaling: LrScaling = "linear"
    """``"linear"`` or ``"sqrt"`` (:func:`scaled_learning_rate`)."""
    allreduce: Allreduce = "per_tensor"
    """``"per_tensor"`` or ``"grouped"`` (:func:`gradient_averager`)."""
    distributed: bool = False
    """One Horovod worker of many (else: one process, no averaging, no scaling)."""

    @classmethod
    def of(cls, cfg: Any) -> Recipe:
        """The recipe of a config that has these fields (a ``TrainConfig``)."""
        return cls(learning_rate=float(cfg.learning_rate), scale_lr=bool(cfg.scale_lr),
                   lr_scaling=cfg.lr_scaling, allreduce=cfg.allreduce,
                   distributed=bool(cfg.distributed))

    def worker_learning_rate(self, size: int) -> float:
        """The learning rate each of ``size`` workers steps with (after any warm-up)."""
        scaling = self.lr_scaling if self.scale_lr and self.distributed else None
        return scaled_learning_rate(self.learning_rate, size, scaling)

    def optimizer(self, size: int) -> Any:
        """A fresh ``keras.optimizers.Adam`` at :meth:`worker_learning_rate`."""
        return keras.optimizers.Adam(self.worker_learning_rate(size))

    def compile(self, model: keras.Model, loss: Any, size: int, *,
                metrics: Sequence[Any] = (), jit_compile: bool = False) -> None:
        """``model.compile`` with :meth:`optimizer`, then :meth:`attach`."""
        model.compile(optimizer=self.optimizer(size), loss=loss, metrics=list(metrics),
                      jit_compile=jit_compile)
        self.attach(model)

    def attach(self, model: keras.Model) -> None:
        """The averaging and a built optimizer on a compiled model (one just compiled, or one
        loaded from a checkpoint with its optimizer state)."""
        model.gradient_reducer = gradient_averager(self.distributed, self.allreduce)
        if not model.optimizer.built:  # (Keras' LossScaleOptimizer.build is not idempotent)
            model.optimizer.build(model.trainable_variables)
