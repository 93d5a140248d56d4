"""GPU speed switches: mixed precision, XLA and the device feed, on by default where the
process has a GPU.

Mixed precision (``mixed_float16``)
    Layers compute in float16 and keep their weights in float32. A V100's tensor cores
    multiply float16 matrices several times faster than float32 ones, and activations take
    half the memory and bandwidth. Two things keep it numerically safe: Keras wraps the
    optimizer in a ``LossScaleOptimizer`` (the loss is multiplied before the backward pass so
    small float16 gradients do not underflow to zero, and divided again before the update),
    and the **last layer runs in float32**: float16 has 11 significant bits, so a float16
    sigmoid rounds every probability above about 0.9998 to exactly 1 (and spaces the ones
    below by 0.0005), and the log in the cross-entropy loses the confident mistakes it
    should punish hardest. :func:`~chexnet_utils.model.models.build_chexnet`
    keeps the ``Dense(14, sigmoid)`` head in float32. On a CPU float16 is slower, not faster: off.
XLA (``jit_compile=True``)
    Compiles the whole training step into fused GPU kernels (fewer launches, fewer round trips
    through memory). On a CPU-only machine Keras' own ``"auto"`` leaves it off, and so do we.
    Under Horovod the step contains ``HorovodAllreduce`` ops, which XLA compiles only where
    Horovod registered its XLA lowering: GPU builds, on the GPU, with
    ``HOROVOD_ENABLE_XLA_OPS=1`` set before Horovod loads (Horovod v0.28.1 ``docs/xla.rst``,
    ``horovod/tensorflow/xla_mpi_ops.cc``; horovod/horovod#2590). Anywhere else the compile
    fails on every rank ("Detected unsupported operations when trying to compile graph
    DistributedGradientTape_Allreduce... HorovodAllreduce", measured on this CPU build with
    and without the variable), so under Horovod XLA is **off on purpose** unless both hold,
    even when asked for, and ``why`` says so.
Device feed (``prefetch_to_device``)
    The pipeline's last stage copies the next batches into GPU memory while the GPU trains
    (:func:`chexnet_utils.input.pipelines.to_accelerator`). Forced on without a GPU it
    prefetches to ``/cpu:0``: the same ``tf.data`` stage, so a CPU run exercises the code a
    GPU node runs.

Each switch is decided once per process by :func:`resolve_switches`, in this order: the
function argument (``True`` / ``False``; ``None`` = no opinion), the environment variable
(``CHEXNET_MIXED_PRECISION``, ``CHEXNET_XLA``, ``CHEXNET_DEVICE_FEED``: ``1``/``on``,
``0``/``off``, ``auto``), then the default (on with a GPU, off without). Forcing all three
on a CPU runs what a GPU node runs (``make gpu-smoke CPU=1``; docs/gpu.md).

A hand-written ``train_step`` must do what Keras' own does under mixed precision: multiply
the loss by ``optimizer.scale_loss`` inside the tape and differentiate the scaled loss, because
the ``LossScaleOptimizer`` that ``compile`` puts around a ``mixed_float16`` model's optimizer
divides every gradient by the loss scale (2**15 at first) before the update (Keras 3.15
``keras/src/backend/tensorflow/trainer.py`` ``train_step``;
``keras/src/optimizers/loss_scale_optimizer.py``). Without it the steps are 2**15 times too
small with SGD. On a plain optimizer ``scale_loss`` returns the loss unchanged.

Op determinism, the switch the other way (speed traded for bit-identical results), is
TensorFlow's own ``tf.config.experimental.enable_op_determinism()``; TensorFlow exports no
switch back, which :func:`disable_op_determinism` is (notebook 03 turns determinism on to
compare two trainings bit for bit, then off before it measures speed).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chexnet_utils.platform.lazy import lazy_module

if TYPE_CHECKING:
    import keras

# Keras, TensorFlow: imported on first use (chexnet_utils.platform.lazy)
if not TYPE_CHECKING:
    keras = lazy_module("keras")
tf = lazy_module("tensorflow")

ENV_MIXED_PRECISION = "CHEXNET_MIXED_PRECISION"
ENV_XLA = "CHEXNET_XLA"
ENV_DEVICE_FEED = "CHEXNET_DEVICE_FEED"
ENV_HOROVOD_XLA_OPS = "HOROVOD_ENABLE_XLA_OPS"
MIXED_POLICY = "mixed_float16"

_ON = ("1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")


def parse_switch(value: str | bool | None, name: str = "switch") -> bool | None:
    """``True``/``False`` for on/off words, ``None`` for ``auto`` / empty / ``None``."""
    if value is None or isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in ("", "auto"):
        return None
    if word in _ON:
        return True
    if word in _OFF:
        return False
    raise ValueError(f"{name} must be on/off/auto (or 1/0), got {value!r}")


def process_gpus() -> list[Any]:
    """GPUs TensorFlow will use in this process (after
    :func:`~chexnet_utils.hardware.devices.pin_process`: the one pinned GPU)."""
    return list(tf.config.get_visible_devices("GPU"))


@dataclass(frozen=True)
class Switches:
    """What :func:`resolve_switches` decided, and why (one phrase per switch)."""

    mixed_precision: bool
    xla: bool
    device_feed: bool = False
    """Batches prefetched to the device (``/gpu:0``; ``/cpu:0`` when forced on without a GPU)."""
    why: dict[str, str] = field(default_factory=dict)

    @property
    def policy(self) -> str:
        """Keras dtype policy name: ``mixed_float16`` or ``float32``."""
        return MIXED_POLICY if self.mixed_precision else "float32"


def resolve_switches(mixed_precision: bool | str | None = None, xla: bool | str | None = None,
                     device_feed: bool | str | None = None, *, has_gpu: bool | None = None,
                     distributed: bool = False,
                     env: Mapping[str, str] | None = None) -> Switches:
    """Decide mixed precision, XLA and the device feed for this process (module docstring).

    ``has_gpu`` defaults to whether TensorFlow sees a GPU here (:func:`process_gpus`);
    ``distributed``: the training step contains Horovod allreduces, so XLA is on only where
    it can compile them (:func:`horovod_xla_blocker`), whatever was asked.
    """
    env = os.environ if env is None else env
    if has_gpu is None:
        has_gpu = bool(process_gpus())
    device = "a GPU" if has_gpu else "no GPU"
    why: dict[str, str] = {}

    def decide(name: str, value: bool | str | None, env_name: str) -> bool:
        """The caller's value, else the environment's, else on with a GPU; reason in ``why``."""
        chosen = parse_switch(value, name)
        if chosen is not None:
            why[name] = "set by the caller"
            return chosen
        chosen = parse_switch(env.get(env_name), env_name)
        if chosen is not None:
            why[name] = f"{env_name}={env[env_name]}"
            return chosen
        why[name] = f"default with {device}"
        return has_gpu

    mp = decide("mixed_precision", mixed_precision, ENV_MIXED_PRECISION)
    jit = decide("xla", xla, ENV_XLA)
    feed = decide("device_feed", device_feed, ENV_DEVICE_FEED)
    blocker = horovod_xla_blocker(has_gpu, env) if distributed and jit else None
    if blocker:
        jit = False
        why["xla"] = f"off although {why['xla']}: {blocker}"
    return Switches(mp, jit, feed, why)


def horovod_xla_blocker(has_gpu: bool, env: Mapping[str, str]) -> str | None:
    """Why XLA cannot compile a step with Horovod's allreduce here (``None``: it can).

    Horovod v0.28.1 lowers ``HorovodAllreduce`` to XLA only in GPU builds, for the GPU
    (``horovod/tensorflow/xla_mpi_ops.cc``), and registers the lowering only when
    ``HOROVOD_ENABLE_XLA_OPS=1`` is set before it loads (``docs/xla.rst``).
    """
    if not has_gpu:
        return ("XLA cannot compile Horovod's allreduce on a CPU (Horovod registers its XLA "
                "ops for GPUs only: docs/xla.rst, xla_mpi_ops.cc)")
    if env.get(ENV_HOROVOD_XLA_OPS) != "1":
        return (f"XLA compiles Horovod's allreduce only with {ENV_HOROVOD_XLA_OPS}=1 set "
                "before Horovod loads (docs/xla.rst; horovod/horovod#2590)")
    return None


@contextlib.contextmanager
def policy_scope(mixed_precision: bool) -> Iterator[None]:
    """Keras' global dtype policy set to ``mixed_float16`` (or ``float32``) inside the block,
    restored afterwards: layers built (or models loaded) inside take that policy."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(MIXED_POLICY if mixed_precision else "float32")
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def build_model(arch: str, image_size: int, weights: str | None = None,
                mixed_precision: bool = False, **kwargs: Any) -> keras.Model:
    """:func:`chexnet_utils.model.models.build_chexnet` under the chosen precision.

    With ``mixed_precision``, every layer computes in float16 except the sigmoid head, which
    :func:`~chexnet_utils.model.models.build_chexnet` keeps in float32 (see the module
    docstring); compiling the model then wraps its optimizer in a ``LossScaleOptimizer``
    (Keras does it for a ``mixed_float16`` model).
    """
    from chexnet_utils.model.models import build_chexnet

    with policy_scope(mixed_precision):
        return build_chexnet(arch, image_size, weights=weights, **kwargs)


def describe(switches: Switches, gpus: Sequence[Any] | None = None) -> str:
    """One line for logs: ``mixed precision on (default with a GPU), XLA off (...), ...``."""
    parts = [f"{label} {'on' if getattr(switches, name) else 'off'} "
             f"({switches.why.get(name, '')})"
             for name, label in (("mixed_precision", "mixed precision"), ("xla", "XLA"),
                                 ("device_feed", "device feed"))]
    if gpus is not None:
        parts.append(f"{len(gpus)} GPU(s)")
    return ", ".join(parts)


def disable_op_determinism() -> None:
    """Undo ``tf.config.experimental.enable_op_determinism()``.

    TensorFlow (2.21) exports only the switch on; this is its own switch off,
    ``tensorflow.python.framework.config.disable_op_determinism``. Pipelines iterated
    afterwards run as usual again: ``tf.data`` honours ``deterministic=False`` and runs a
    ``map`` with random ops in parallel (with determinism on, on one thread).
    """
    from tensorflow.python.framework import config as tf_config

    tf_config.disable_op_determinism()
