"""Notebook 03's lesson step under what a GPU node switches on (issue 45), run on this CPU.

The ``CheXNet`` class and ``compile_chexnet`` are taken from the notebook file
(:mod:`chexnet_utils.notebook.cells`), not copied. (a) With mixed precision and XLA forced on,
the first updates of the step must match the float32 step's within a small factor, for SGD
and for Adam; with the ``scale_loss`` line taken out (the step as it was before issue 45),
SGD's updates shrink by about the loss scale, 2**15, which is what the check exists to catch.
Under mixed precision the step trains exactly like Keras' own. (b), a whole run learning under
the switches, is in tests/tf/test_models_training.py; (c) and the step inside ``fit`` with XLA,
in the gpu-smoke stand-in (tests/mpi/test_gpu_smoke.py).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from chexnet_utils.data.labels import PATHOLOGIES  # noqa: E402
from chexnet_utils.model import accelerator, models  # noqa: E402
from chexnet_utils.notebook.cells import code_cell, definition  # noqa: E402

NB03 = Path(__file__).resolve().parents[2] / "notebooks" / "03_training_single_worker.ipynb"
SCALE_LINE = "            scaled = self.optimizer.scale_loss(loss)"
SIZE = 32


def lesson_namespace(drop_scale_loss: bool = False, xla: bool = False) -> dict[str, Any]:
    """Notebook 03's ``CheXNet``, ``as_chexnet`` and ``compile_chexnet``, executed here."""
    cell = code_cell(NB03, "class CheXNet(keras.Model)")
    if drop_scale_loss:
        assert SCALE_LINE in cell and "tape.gradient(scaled," in cell
        cell = "\n".join(line for line in cell.splitlines() if not line.startswith(SCALE_LINE))
        cell = cell.replace("tape.gradient(scaled,", "tape.gradient(loss,")
    loss_fn = models.WeightedBCE(np.full(14, 0.7), np.full(14, 0.3))
    ns: dict[str, Any] = {"keras": keras, "tf": tf, "loss_fn": loss_fn,
                          "PATHOLOGIES": PATHOLOGIES,
                          "SW": SimpleNamespace(xla=xla)}  # what notebook 03's setup resolves
    exec(cell.replace('@keras.saving.register_keras_serializable(package="notebook03")\n', ""),
         ns)
    compile_cell = code_cell(NB03, "def compile_chexnet(m):")
    exec(definition(compile_cell, "compile_chexnet"), ns)
    return ns


def batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.random((16, SIZE, SIZE, 3), dtype=np.float32),
            (rng.random((16, 14)) < 0.3).astype(np.float32))


def trained(ns: dict[str, Any], optimizer: str, mixed: bool, keras_own: bool = False,
            xla: bool | None = None, steps: int = 2
            ) -> tuple[float, list[np.ndarray], list[float], Any]:
    """``steps`` steps on one batch from a fixed start, with mixed precision and XLA (or in
    float32 without XLA; ``xla`` to choose), through the lesson's step or Keras' own: the sum
    of |weight change|, the weights, the logged losses and the model."""
    keras.utils.set_random_seed(0)
    wrap = (lambda m: keras.Model(m.inputs, m.outputs)) if keras_own else ns["as_chexnet"]
    with accelerator.policy_scope(mixed):  # as notebook 03's setup sets the global policy
        model = wrap(models.build_chexnet("small", SIZE))
    opt = {"sgd": keras.optimizers.SGD(0.05), "adam": keras.optimizers.Adam(1e-3)}[optimizer]
    model.compile(optimizer=opt, loss=ns["loss_fn"], jit_compile=mixed if xla is None else xla)
    start = [w.numpy() for w in model.trainable_weights]
    x, y = batch()
    logs = [float(model.train_on_batch(x, y, return_dict=True)["loss"]) for _ in range(steps)]
    weights = [w.numpy() for w in model.trainable_weights]
    moved = sum(float(np.abs(w - s).sum()) for w, s in zip(weights, start, strict=True))
    return moved, weights, logs, model


@pytest.fixture(scope="module")
def float32_moves() -> dict[str, float]:
    ns = lesson_namespace()
    return {opt: trained(ns, opt, mixed=False)[0] for opt in ("sgd", "adam")}


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_lesson_step_under_mixed_precision_and_xla_moves_like_float32(
        optimizer: str, float32_moves: dict[str, float]) -> None:
    """(a): the first updates with the GPU switches on match float32's within 2x. With Adam
    it also trains exactly like Keras' own ``train_step`` under the same switches: the
    differences notebook 03 §3.1 lists (``[v.value ...]``, the loss tracker, no branches for
    models without a training argument or an optimizer) change nothing."""
    ns = lesson_namespace()
    moved, ours, our_logs, model = trained(ns, optimizer, mixed=True)
    assert type(model.optimizer).__name__ == "LossScaleOptimizer"  # what compile() adds
    assert model.get_layer("predictions").compute_dtype == "float32" and model.jit_compile
    ratio = moved / float32_moves[optimizer]
    print(f"03 step, {optimizer}: mixed+XLA / float32 weight change {ratio:.4g}")
    assert 0.5 < ratio < 2, f"{optimizer}: mixed+XLA moved the weights {ratio:.3g}x as far"
    if optimizer == "adam":  # without XLA on both sides: two compiles fewer, the same maths
        _, ours, our_logs, _ = trained(ns, optimizer, mixed=True, xla=False)
        _, theirs, their_logs, _ = trained(ns, optimizer, mixed=True, keras_own=True, xla=False)
        assert all(np.allclose(a, b, rtol=1e-5, atol=1e-6)
                   for a, b in zip(ours, theirs, strict=True))
        assert our_logs == pytest.approx(their_logs, rel=1e-5)


def test_without_scale_loss_the_check_sees_the_loss_scale(float32_moves: dict[str, float]
                                                          ) -> None:
    """The step as it was before issue 45: SGD's updates shrink by about the loss scale (XLA
    left off here: it changes nothing to that, and costs a compile)."""
    ns = lesson_namespace(drop_scale_loss=True)
    keras.utils.set_random_seed(0)
    with accelerator.policy_scope(True):
        model = ns["as_chexnet"](models.build_chexnet("small", SIZE))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=ns["loss_fn"], jit_compile=False)
    start = [w.numpy() for w in model.trainable_weights]
    x, y = batch()
    for _ in range(2):
        model.train_on_batch(x, y)
    moved = sum(float(np.abs(w.numpy() - s).sum())
                for w, s in zip(model.trainable_weights, start, strict=True))
    ratio = moved / float32_moves["sgd"]
    print(f"03 step without scale_loss, sgd: mixed / float32 weight change {ratio:.4g}")
    assert ratio < 1e-3, f"without scale_loss SGD moved {ratio:.3g}x as far (expected ~2**-15)"


def test_compile_chexnet_decides_xla_from_the_switches() -> None:
    for xla in (False, True):
        ns = lesson_namespace(xla=xla)
        model = ns["compile_chexnet"](ns["as_chexnet"](models.build_chexnet("small", SIZE)))
        assert model.jit_compile is xla
