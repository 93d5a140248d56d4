"""GPU speed switches: mixed precision and XLA, on by default where the process has a GPU.

Mixed precision (``mixed_float16``)
    Layers compute in float16 and keep their weights in float32. A V100's tensor cores
    multiply float16 matrices several times faster than float32 ones, and activations take
    half the memory and bandwidth. Two things keep it numerically safe: Keras wraps the
    optimizer in a ``LossScaleOptimizer`` (the loss is multiplied before the backward pass so
    small float16 gradients do not underflow to zero, and divided again before the update),
    and the **last layer runs in float32**: float16 has 11 significant bits, so a float16
    sigmoid rounds every probability above about 0.9998 to exactly 1 (and spaces the ones
    below by 0.0005), and the log in the cross-entropy loses the confident mistakes it
    should punish hardest. :func:`build_model` keeps
    the ``Dense(14, sigmoid)`` head in float32. On a CPU float16 is slower, not faster: off.
XLA (``jit_compile=True``)
    Compiles the whole training step into fused GPU kernels (fewer launches, fewer round trips
    through memory). On a CPU-only machine Keras' own ``"auto"`` leaves it off, and so do we.
    Under Horovod the step contains ``hvd.allreduce`` ops, which XLA can only compile when
    Horovod registered its XLA ops (``HOROVOD_ENABLE_XLA_OPS=1`` in the workers'
    environment); without that variable XLA stays off for distributed training.

Each switch is decided once per process by :func:`resolve_switches`, in this order: the
function argument (``True`` / ``False``; ``None`` = no opinion), the environment variable
(``CHEXNET_MIXED_PRECISION``, ``CHEXNET_XLA``: ``1``/``on``, ``0``/``off``, ``auto``), then
the default (on with a GPU, off without).

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

if TYPE_CHECKING:
    import keras

ENV_MIXED_PRECISION = "CHEXNET_MIXED_PRECISION"
ENV_XLA = "CHEXNET_XLA"
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
    import tensorflow as tf

    return list(tf.config.get_visible_devices("GPU"))


@dataclass(frozen=True)
class Switches:
    """What :func:`resolve_switches` decided, and why (one phrase per switch)."""

    mixed_precision: bool
    xla: bool
    why: dict[str, str] = field(default_factory=dict)

    @property
    def policy(self) -> str:
        """Keras dtype policy name: ``mixed_float16`` or ``float32``."""
        return MIXED_POLICY if self.mixed_precision else "float32"


def resolve_switches(mixed_precision: bool | str | None = None, xla: bool | str | None = None,
                     *, has_gpu: bool | None = None, distributed: bool = False,
                     env: Mapping[str, str] | None = None) -> Switches:
    """Decide mixed precision and XLA for this process (see the module docstring).

    ``has_gpu`` defaults to whether TensorFlow sees a GPU here (:func:`process_gpus`);
    ``distributed``: the training step contains Horovod allreduces (XLA then also needs
    ``HOROVOD_ENABLE_XLA_OPS=1`` by default). An explicit on always wins.
    """
    env = os.environ if env is None else env
    if has_gpu is None:
        has_gpu = bool(process_gpus())
    device = "a GPU" if has_gpu else "no GPU"
    why: dict[str, str] = {}

    def explicit(name: str, value: bool | str | None, env_name: str) -> bool | None:
        """The caller's value, else the environment's, with the reason in ``why``."""
        chosen = parse_switch(value, name)
        if chosen is not None:
            why[name] = "set by the caller"
            return chosen
        chosen = parse_switch(env.get(env_name), env_name)
        if chosen is not None:
            why[name] = f"{env_name}={env[env_name]}"
        return chosen

    mp = explicit("mixed_precision", mixed_precision, ENV_MIXED_PRECISION)
    if mp is None:
        mp = has_gpu
        why["mixed_precision"] = f"default with {device}"
    jit = explicit("xla", xla, ENV_XLA)
    if jit is None:
        if has_gpu and distributed and env.get("HOROVOD_ENABLE_XLA_OPS") != "1":
            jit = False
            why["xla"] = ("off: Horovod's allreduce in the step needs HOROVOD_ENABLE_XLA_OPS=1 "
                          "to be compiled by XLA")
        else:
            jit = has_gpu
            why["xla"] = f"default with {device}"
    return Switches(bool(mp), bool(jit), why)


@contextlib.contextmanager
def policy_scope(mixed_precision: bool) -> Iterator[None]:
    """Keras' global dtype policy set to ``mixed_float16`` (or ``float32``) inside the block,
    restored afterwards: layers built (or models loaded) inside take that policy."""
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(MIXED_POLICY if mixed_precision else "float32")
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def float32_head(model: keras.Model, layer: str = "predictions") -> keras.Model:
    """Make ``model``'s output layer compute in float32 (its weights already are); returns
    ``model``. A no-op for a float32 model."""
    model.get_layer(layer).dtype_policy = "float32"
    return model


def build_model(arch: str, image_size: int, weights: str | None = None,
                mixed_precision: bool = False, **kwargs: Any) -> keras.Model:
    """:func:`chexnet_utils.model.models.build_chexnet` under the chosen precision.

    With ``mixed_precision``, every layer computes in float16 except the sigmoid head, which
    stays float32 (see the module docstring); compiling the model then wraps its optimizer in
    a ``LossScaleOptimizer`` (Keras does it for a ``mixed_float16`` model).
    """
    from chexnet_utils.model.models import build_chexnet

    with policy_scope(mixed_precision):
        model = build_chexnet(arch, image_size, weights=weights, **kwargs)
    return float32_head(model) if mixed_precision else model


def describe(switches: Switches, gpus: Sequence[Any] | None = None) -> str:
    """One line for logs: ``mixed precision on (default with a GPU), XLA off (...)``."""
    parts = [f"mixed precision {'on' if switches.mixed_precision else 'off'} "
             f"({switches.why.get('mixed_precision', '')})",
             f"XLA {'on' if switches.xla else 'off'} ({switches.why.get('xla', '')})"]
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
