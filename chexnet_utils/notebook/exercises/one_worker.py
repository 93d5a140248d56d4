"""Answer checks of notebook 03 (training on one worker), and the measured comparison
(:func:`check_which_is_faster`) that notebooks 03, 06 and 07 use."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chexnet_utils.hardware import devices
from chexnet_utils.notebook.exercises.verdict import SAME, missing, number, verdict


def check_which_is_faster(answer: str | None, measured: Mapping[str, float | None],
                          higher_is_faster: bool = True, same_within: float = 0.2) -> bool:
    """03 exercise 1, 06 exercise 1: your prediction of which of two measurements is faster.

    ``measured``: ``{name: value}`` for the two settings, measured by you (images/s with
    ``higher_is_faster=True``, seconds with ``False``). ``answer``: the faster name, or
    ``"same"`` when neither is more than ``same_within`` (20 %) faster: differences of that
    size are noise on a shared machine.
    """
    names = list(measured)
    if len(names) != 2:
        raise ValueError(f"measured needs exactly two settings, got {names}")
    if missing(answer, f"write one of {[*names, SAME]}"):
        return False
    not_measured = [n for n in names if number(measured[n]) is None]
    if not_measured:
        return verdict(False, "", f"measure {not_measured} first and pass the value(s).")
    a, b = (float(measured[n]) for n in names)  # type: ignore[arg-type]  # number() took both above
    fast, slow = (names[0], names[1]) if (a > b) == higher_is_faster else (names[1], names[0])
    speedup = max(a, b) / min(a, b) if min(a, b) > 0 else math.inf
    expected = SAME if speedup <= 1 + same_within else fast
    shown = f"{names[0]} {a:.4g}, {names[1]} {b:.4g}"
    return verdict(
        str(answer).strip().lower() == expected.lower(),
        f"measured {shown}: " + (f"within {same_within:.0%} of each other, the same within "
                                 "the noise." if expected == SAME else
                                 f"{fast} is {speedup:.2f}x faster than {slow}."),
        f"your measurements say {shown} ({'higher' if higher_is_faster else 'lower'} is "
        f"faster); a difference of up to {same_within:.0%} counts as '{SAME}'.")


def _plateau_counters(callback: Any) -> tuple[Any, Any, Any]:
    return (getattr(callback, "best", None), getattr(callback, "wait", None),
            getattr(callback, "cooldown_counter", None))


def check_resume(answer: Callable[[Path], tuple[Any, Any, int]] | None, run_dir: Path | str,
                 optimizer: Any, plateau: Any, epochs_done: int) -> bool:
    """03, exercise 2: your ``resume(run_dir) -> (model, plateau, initial_epoch)``.

    Runs it on ``run_dir`` and compares what it returns with the state the run ended in:
    ``initial_epoch`` equal to ``epochs_done``; the model's optimizer with the same step
    counter, learning rate and variables (Adam's moments) as ``optimizer``, the trained
    model's; and the returned ``ReduceLROnPlateau``'s ``best``, ``wait`` and
    ``cooldown_counter`` equal to ``plateau``'s *after* its ``on_train_begin``, which is what
    ``fit`` calls first (Keras' own resets them there).
    """
    if missing(answer, "write resume(run_dir) returning (model, plateau, initial_epoch) and "
                        "set answer = resume"):
        return False
    if not callable(answer):
        return verdict(False, "", "answer must be your function itself: answer = resume")
    try:
        model, restored, initial_epoch = answer(Path(run_dir))
    except Exception as e:  # the learner's code: report, never raise
        return verdict(False, "", f"resume({Path(run_dir).name!r}) raised "
                                   f"{type(e).__name__}: {e}")
    problems = []
    if number(initial_epoch) != epochs_done:
        problems.append(f"initial_epoch is {initial_epoch!r}: the run finished {epochs_done} "
                        "epochs, and fit's initial_epoch counts finished epochs")
    opt = getattr(model, "optimizer", None)
    steps = int(optimizer.iterations.numpy())
    if opt is None:
        problems.append("the model has no optimizer: load the whole model, not its weights")
    elif int(opt.iterations.numpy()) != steps:
        problems.append(f"optimizer.iterations is {int(opt.iterations.numpy())}, the run ended "
                        f"at step {steps}: a rebuilt model restarts Adam (or, given "
                        "best.weights.h5, goes back to the best epoch's optimizer state); "
                        "keras.saving.load_model on last.keras restores the last one")
    else:
        lr, lr_run = float(np.asarray(opt.learning_rate)), float(
            np.asarray(optimizer.learning_rate))
        mine = [np.asarray(v) for v in opt.variables]
        theirs = [np.asarray(v) for v in optimizer.variables]
        if not math.isclose(lr, lr_run, rel_tol=1e-6):
            problems.append(f"the learning rate is {lr:.3g}, the run ended with {lr_run:.3g}")
        elif len(mine) != len(theirs) or not all(
                a.shape == b.shape and np.array_equal(a, b)
                for a, b in zip(mine, theirs, strict=True)):
            problems.append("the optimizer's variables (Adam's moments) differ from the run's")
    before = _plateau_counters(restored)
    try:
        restored.set_model(model)
        restored.on_train_begin()
    except Exception as e:
        problems.append(f"the plateau callback failed in on_train_begin: {type(e).__name__}: {e}")
    else:
        after, expected = _plateau_counters(restored), _plateau_counters(plateau)
        if after != expected:
            reset = " (set before fit, reset by Keras' on_train_begin)" if before == expected \
                else ""
            problems.append(f"after on_train_begin the plateau has (best, wait, cooldown) = "
                            f"{after}, the run ended with {expected}{reset}")
    return verdict(
        not problems,
        f"resumed at epoch {epochs_done + 1} with optimizer step {steps}, the learning rate "
        f"and Adam's moments of the run, and the plateau counters {_plateau_counters(plateau)} "
        "surviving on_train_begin: fit continues as if it had never stopped.",
        "; ".join(problems))


def check_cam(answer: Callable[[Any, Any, int], Any] | None, model: Any, image: Any,
              classes: Sequence[int], atol: float = 1e-4) -> bool:
    """03, exercise 3: your ``cam(model, image, class_index)`` (CheXNet's class activation
    map) against Grad-CAM at the last feature map (:func:`chexnet_utils.model.explain.grad_cam`)
    for each of ``classes``: same shape, values within ``atol``.

    Behind a global average pooling and a dense head the two are the same map up to a
    positive factor, which the scaling to [0, 1] removes; the tolerance is for the different
    order of the floating-point operations.
    """
    if missing(answer, "write cam(model, image, class_index) and set answer = cam"):
        return False
    if not callable(answer):
        return verdict(False, "", "answer must be your function itself: answer = cam")
    from chexnet_utils.model.explain import grad_cam  # imports TensorFlow: not for a placeholder
    worst = 0.0
    for c in classes:
        expected = grad_cam(model, image, int(c))
        try:
            mine = np.asarray(answer(model, image, int(c)), dtype=np.float64)
        except Exception as e:  # the learner's code: report, never raise
            return verdict(False, "", f"cam(..., {c}) raised {type(e).__name__}: {e}")
        if mine.shape != expected.shape:
            return verdict(False, "", f"cam(..., {c}) has shape {mine.shape}; Grad-CAM's map "
                                       f"is {expected.shape}: resize to the image")
        worst = max(worst, float(np.max(np.abs(mine - expected))))
    return verdict(
        worst <= atol,
        f"CAM and Grad-CAM agree for classes {list(classes)} (largest difference {worst:.1e}): "
        "after the last feature map come only average pooling and the dense head, so "
        "Grad-CAM's channel weights are the head's weights times a positive constant.",
        f"your map differs from Grad-CAM's by up to {worst:.3f}: weight the last feature map "
        "by column class_index of the predictions layer's kernel, keep the positive part, "
        "divide by its maximum, then resize.")


def check_full_size_prediction(answer: float | None, fed_full: Any,
                               measure: Callable[[], tuple[float, float]],
                               tolerance: float = 0.3, cores: int | None = None) -> bool:
    """03, exercise 4: your predicted images/s of training fed by the old pipeline from the
    full-size shards, then the measurement.

    ``measure`` returns ``(old, new)``: images/s of training fed by the old and by the new
    approach from the full-size shards, measured now in alternating runs. It is called only
    once ``answer`` is a number, so the prediction comes first. ``fed_full`` is section 5's
    :class:`benchmark.FedTrainingResult` of the new approach on those shards, which the
    prediction is made from. A shared machine drifts between section 5 and now, so the
    prediction is scaled by ``new / fed_full.fed`` (the same feed, then and now) before it
    is compared with ``old``; within ``tolerance`` (30 %) counts.
    """
    cores = cores or devices.usable_cores()
    one_core = fed_full.pipeline / cores
    overlap = min(one_core, fed_full.in_memory)
    shared = 1.0 / (1.0 / one_core + 1.0 / fed_full.in_memory) if one_core > 0 else 0.0
    if missing(answer, "predict from section 5: how fast does one core decode full-size "
                        "images, and how fast does the model train?"):
        return False
    value = number(answer)
    if value is None:
        return verdict(False, "", "give your prediction as a number of images/s")
    old, new = (float(v) for v in measure())
    drift = new / fed_full.fed if fed_full.fed > 0 else 1.0
    adjusted = value * drift
    shown = (f"measured now: old {old:.0f}, new {new:.0f} images/s (section 5: new "
             f"{fed_full.fed:.0f}); your {value:.0f} x {drift:.2f} for the drift = {adjusted:.0f}")
    return verdict(
        abs(adjusted - old) <= tolerance * old,
        f"{shown}. One core decodes about {one_core:.0f} full-size images/s: with the model on "
        f"other hardware training would approach min(that, model) = {overlap:.0f}, with both "
        f"sharing these cores about {shared:.0f}.",
        f"{shown}. The old approach decodes on one core: about {fed_full.pipeline:.0f} / "
        f"{cores} = {one_core:.0f} images/s; training cannot beat min(that, model) = "
        f"{overlap:.0f}, and on a CPU the two halves share the cores (about {shared:.0f}). On a "
        "busy machine this process may get less than its cores, and the old and new rates "
        "converge.")
