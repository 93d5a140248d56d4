"""Answer checks for the notebooks' exercises: is my answer right?

Every notebook ends with exercises. Under each one whose answer is a number, a set, a
claim or a function you write, a cell holds ``answer = None`` and a call such as
``exercises.check_thread_budget(answer)``.
Put your answer in place of ``None`` and run the cell: the check prints ``Correct: ...`` or
``Not yet: <a hint>`` and returns ``True`` or ``False``. It never raises on a wrong or
missing answer.

No check knows the answer in advance. Each one recomputes it from what you pass in: your
data set, your TFRecords, your measurements, your fitted cost model, and the package's own
functions. So a check is right on your machine and your data, whatever numbers they give.
Where the answer is a function, the check runs it and compares what it does with the
package's own implementation or with the state your run ended in; where it is a prediction,
the check measures only after you entered it.

======== ============================= ===============================================
notebook exercise                      check
======== ============================= ===============================================
00       1 thread budget               :func:`check_thread_budget`
00       2 ``hvd.rank()`` as GPU index :func:`check_ranks_without_local_gpu`
00       3 GPU node capabilities       :func:`check_gpu_capabilities`
01       1 shards of 50 images         :func:`check_shard_layout`
01       3 why patients leak           :func:`check_images_per_patient`
02       1 sum vs max                  :func:`check_step_times`
02       2 no parallel decoding        :func:`check_serial_decode`
02       3 worker shares               :func:`check_worker_shares`
03       1 old pipeline, resized data  :func:`check_which_is_faster`
03       2 resume (your function)      :func:`check_resume`
03       3 CAM (your function)         :func:`check_cam`
03       4 old pipeline, full size     :func:`check_full_size_prediction`
04       4 old pipeline on n workers   :func:`check_old_pipeline_efficiency`
04       6 your Horovod conversion     :func:`check_horovod_conversion`
04       7 uneven shards, ``hvd.join`` :func:`check_uneven_shards`
05       1, 2 predicted efficiency     :func:`check_efficiency`
05       3 parameter-server shards     :func:`check_ps_shards`
05       4 a 10 ms cycle time          :func:`check_which_is_faster`
======== ============================= ===============================================

The other exercises ask you to explain something; their solutions are in the notebooks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chexnet_utils import benchmark, comm, devices, envcheck, leakage, tfrecords
from chexnet_utils.nih import ImageRecord

__all__ = [
    "check_cam",
    "check_efficiency",
    "check_full_size_prediction",
    "check_gpu_capabilities",
    "check_horovod_conversion",
    "check_images_per_patient",
    "check_old_pipeline_efficiency",
    "check_ps_shards",
    "check_ranks_without_local_gpu",
    "check_resume",
    "check_serial_decode",
    "check_shard_layout",
    "check_step_times",
    "check_thread_budget",
    "check_uneven_shards",
    "check_which_is_faster",
    "check_worker_shares",
]

SAME = "same"
"""The answer of :func:`check_which_is_faster` when neither is clearly faster."""


def _verdict(ok: bool, correct: str, hint: str) -> bool:
    """Print ``Correct: ...`` or ``Not yet: ...`` and return ``ok``."""
    print(f"Correct: {correct}" if ok else f"Not yet: {hint}")
    return ok


def _missing(answer: Any, hint: str) -> bool:
    """``True`` (after printing a hint) when the answer is still the ``None`` placeholder."""
    if answer is None:
        print(f"Not yet: replace `answer = None` with your answer. Hint: {hint}")
        return True
    return False


def _number(x: Any) -> float | None:
    """``x`` as a float, or ``None`` when it is not a number."""
    if isinstance(x, bool):
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _close(answer: Any, expected: float, rel: float = 0.0, abs_: float = 0.0) -> bool:
    value = _number(answer)
    return value is not None and math.isclose(value, expected, rel_tol=rel, abs_tol=abs_)


def _pair(answer: Any) -> tuple[float, float] | None:
    """``(a, b)`` from a 2-sequence of numbers, else ``None``."""
    if isinstance(answer, str) or not isinstance(answer, Sequence) or len(answer) != 2:
        return None
    a, b = _number(answer[0]), _number(answer[1])
    return None if a is None or b is None else (a, b)


# ---------------------------------------------------------------------------------------
# 00 environment check
# ---------------------------------------------------------------------------------------

def check_thread_budget(answer: int | None, n_processes: int = 3,
                        cores: int | None = None) -> bool:
    """00, exercise 1: threads per process when ``n_processes`` share the cores.

    ``cores`` defaults to the cores this process may use (:func:`devices.usable_cores`).
    """
    cores = cores or devices.usable_cores()
    expected = devices.cpu_thread_budget(n_processes, cores)
    if _missing(answer, "look at cpu_thread_budget in chexnet_utils/devices.py"):
        return False
    return _verdict(
        _close(answer, expected),
        f"{n_processes} processes on {cores} core(s) get max(1, {cores} // {n_processes}) = "
        f"{expected} thread(s) each, " + (
            "and together they still oversubscribe the cores: never start more processes "
            "than cores." if n_processes > cores else
            "so together they ask for no more threads than there are cores."),
        f"the cores are shared: divide the {cores} core(s) among the {n_processes} processes, "
        "rounding down, but give every process at least one thread.")


def check_ranks_without_local_gpu(answer: Iterable[int] | None, nodes: int = 2,
                                  gpus_per_node: int = 4) -> bool:
    """00, exercise 2: which global ranks break ``gpus[hvd.rank()]`` on ``nodes`` nodes with
    ``gpus_per_node`` GPUs (one process per GPU, ranks filled node by node)?"""
    ranks = range(nodes * gpus_per_node)
    expected = {r for r in ranks if r >= gpus_per_node}  # each node lists only its own GPUs
    if _missing(answer, "write the set of ranks, e.g. {1, 2}; each node's "
                        f"tf.config.list_physical_devices('GPU') has {gpus_per_node} entries"):
        return False
    try:
        given = None if isinstance(answer, str) else {int(r) for r in answer}
    except (TypeError, ValueError):
        given = None
    return _verdict(
        given == expected,
        f"ranks {sorted(expected)} index past their node's {gpus_per_node} GPUs (IndexError). "
        f"The local rank (0..{gpus_per_node - 1} on every node) is the right index.",
        f"rank r runs on node r // {gpus_per_node} and sees only that node's GPUs, "
        f"numbered 0..{gpus_per_node - 1}. Which ranks r are too large to index them?")


def check_gpu_capabilities(answer: str | Iterable[str] | None,
                           already: Sequence[str] = ("tensorflow", "horovod", "mpi", "gloo")
                           ) -> bool:
    """00, exercise 3: the capabilities to require on a GPU node besides ``already``.

    ``answer``: names from :data:`envcheck.CAPABILITIES` (a set, a list or ``"a,b"``).
    ``nccl`` is needed (NVIDIA's collectives for the allreduce); ``cuda`` (a CUDA build of
    TensorFlow and Horovod) and ``gpu`` (a GPU visible) are welcome too.
    """
    extra = [c for c in envcheck.CAPABILITIES if c not in already]
    if _missing(answer, f"choose among {extra}"):
        return False
    if isinstance(answer, str):
        names: list[Any] = answer.split(",")
    elif isinstance(answer, Iterable):
        names = list(answer)
    else:
        return _verdict(False, "", f"give capability names, e.g. a list of strings from {extra}")
    given = {str(n).strip().lower() for n in names if str(n).strip()} - set(already)
    unknown = given - set(extra)
    ok = "nccl" in given and not unknown
    return _verdict(
        ok,
        f"require {sorted(given)}: python -m chexnet_utils envcheck --require "
        f"{','.join([*already, *sorted(given)])}. NCCL is what makes the allreduce fast on "
        "GPUs" + ("." if "gpu" in given else "; 'gpu' (TensorFlow sees a GPU) is a good addition."),
        f"unknown capability {sorted(unknown)}; choose among {extra}" if unknown else
        "which build option of Horovod gives the GPU collectives (see the table in section 2)?")


# ---------------------------------------------------------------------------------------
# 01 data preparation
# ---------------------------------------------------------------------------------------

def check_shard_layout(answer: Sequence[int] | None, tfrecords_dir: Path | str,
                       shard_size: int = 50, split: str = "train") -> bool:
    """01, exercise 1: the shard plan of ``split`` when converting with ``shard_size``.

    ``answer``: the images per shard (the list ``shard_plan`` of notebook 01 returns) or the
    pair ``(number of shards, images in the last one)``. The number of images in the split is
    read from the manifest of any conversion of the same data set with the same split
    parameters (e.g. ``full_dir``, or your own ``shard_size=50`` folder).
    """
    n = int(tfrecords.load_manifest(tfrecords_dir)["splits"][split]["images"])
    n_shards = math.ceil(n / shard_size)
    last = n - shard_size * (n_shards - 1)
    plan = [float(shard_size)] * (n_shards - 1) + [float(last)]
    if _missing(answer, f"the {split} split has {n} images; write your plan (a list of images "
                        "per shard) or (shards, images in the last)"):
        return False
    given = None
    if isinstance(answer, Sequence) and not isinstance(answer, str):
        given = [_number(x) for x in answer]
    ok = given == plan or _pair(answer) == (n_shards, last)
    dropped = given is not None and None not in given and sum(given) < n  # type: ignore[arg-type]
    return _verdict(
        ok,
        f"{n} {split} images in shards of {shard_size}: ceil({n} / {shard_size}) = {n_shards} "
        f"shards, the last holds {n} - {shard_size} x {n_shards - 1} = {last}."
        + (f" A writer that keeps only full shards would silently drop those {last}."
           if last < shard_size else ""),
        f"your plan holds {sum(given):g} of the {n} images: the last shard takes the "  # type: ignore[arg-type]
        "remainder (it is written, not dropped)." if dropped else
        f"the {split} split has {n} images; every shard but the last holds {shard_size}, "
        "and the last takes the remainder (it is written, not dropped).")


def check_images_per_patient(answer: float | None, records: Sequence[ImageRecord]) -> bool:
    """01, exercise 3: the mean number of images per patient in ``records`` (e.g.
    ``ds.records``): what makes an image-level split leak."""
    patients = {r.patient_id for r in records}
    expected = len(records) / len(patients)
    if _missing(answer, "count the images and the distinct patient_id values of the records"):
        return False
    if not _close(answer, expected, rel=0.02, abs_=0.01):
        return _verdict(False, "", f"divide the number of images ({len(records)}) by the "
                        "number of distinct patient_id values.")
    # the consequence, computed on the same records: with and without repeat patients
    first_image: dict[int, ImageRecord] = {}
    for r in records:
        first_image.setdefault(r.patient_id, r)
    leaked = leakage.patients_on_both_sides(leakage.image_level_split(records))
    single = leakage.patients_on_both_sides(leakage.image_level_split(list(first_image.values())))
    return _verdict(True, f"{len(records)} images of {len(patients)} patients: {expected:.2f} "
                    f"per patient. An image-level split leaves {leaked['patients_in_both']:.0f} "
                    "patients on both sides; keep one image per patient and it leaves "
                    f"{single['patients_in_both']:.0f}.", "")


# ---------------------------------------------------------------------------------------
# 02 input pipeline
# ---------------------------------------------------------------------------------------

STEP_TIME_KEYS = ("sequential_ms", "pipelined_ms", "wait_sequential_ms", "wait_pipelined_ms")
"""What :func:`check_step_times` expects: step time and accelerator wait per step, without
(sequential) and with prefetch (pipelined)."""


def check_step_times(answer: Mapping[str, float] | None, cpu_ms: float,
                     accel_ms: float) -> bool:
    """02, exercise 1: step time and accelerator wait, without and with prefetch.

    ``answer``: ``{"sequential_ms": ..., "pipelined_ms": ..., "wait_sequential_ms": ...,
    "wait_pipelined_ms": ...}``. Without prefetch a step costs the sum and the accelerator
    waits for every batch; with prefetch a step costs the max and the accelerator waits
    only for what the CPU half takes longer.
    """
    expected = {"sequential_ms": cpu_ms + accel_ms, "pipelined_ms": max(cpu_ms, accel_ms),
                "wait_sequential_ms": cpu_ms, "wait_pipelined_ms": max(0.0, cpu_ms - accel_ms)}
    if _missing(answer, f"a dict with the keys {list(STEP_TIME_KEYS)}, in milliseconds"):
        return False
    if not isinstance(answer, Mapping) or set(answer) != set(STEP_TIME_KEYS):
        return _verdict(False, "", f"give a dict with exactly the keys {list(STEP_TIME_KEYS)}")
    wrong = [k for k in STEP_TIME_KEYS if not _close(answer[k], expected[k], abs_=0.5)]
    return _verdict(
        not wrong,
        f"sum {expected['sequential_ms']:g} ms vs max {expected['pipelined_ms']:g} ms per step; "
        f"the accelerator waits {expected['wait_sequential_ms']:g} ms without prefetch and "
        f"{expected['wait_pipelined_ms']:g} ms with it."
        + (" A faster input pipeline buys nothing now: the accelerator is the bottleneck."
           if accel_ms >= cpu_ms else ""),
        f"recheck {wrong}: one after the other, a step costs cpu + accelerator; overlapped, "
        "max(cpu, accelerator), and the accelerator waits only when the CPU half is longer.")


SERIAL_MAX_SPEEDUP = 1.5
"""A pipeline that runs at most this many times faster than itself confined to one thread
decodes on one core (its reader and prefetch threads still overlap with the decoder, which
one thread cannot: up to about 1.3x); a parallel map on two free cores comes out near 2x, on
more cores higher."""


def _one_thread(dataset: Any) -> Any:
    """``dataset`` confined to one core: a private pool of one thread for all its tf.data
    work and intra-op parallelism 1 (what :func:`benchmark.decode_ceiling` measures with)."""
    import tensorflow as tf

    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    return dataset.with_options(options)


def check_serial_decode(answer: Any, single_core_img_per_s: float, n_batches: int = 8,
                        warmup_batches: int = 2, repeats: int = 3,
                        cores: int | None = None) -> bool:
    """02, exercise 2: the new approach without parallel decoding runs at one core's rate.

    ``answer``: your pipeline, a ``tf.data.Dataset`` of ``(images, labels)`` batches. The
    check runs it side by side with the same pipeline confined to one thread
    (:func:`benchmark.compare_pipelines`, ``repeats`` alternating runs of ``n_batches`` after
    ``warmup_batches``): the one-core rate measured in the same runs, so a busy machine slows
    both alike; the best run of each counts, as in the decode ceiling. Correct when yours is
    at most :data:`SERIAL_MAX_SPEEDUP` times faster. When the runs of either vary by more than
    a quarter the machine is busy, and the verdict says so: rerun it when it is quieter.
    ``single_core_img_per_s`` (``SINGLE_CORE`` of section 2) is shown beside it; given a
    measured rate instead of a pipeline (images/s or a :class:`benchmark.ThroughputResult`),
    the check can only compare with it (at most 1.5 x).
    """
    cores = cores or devices.usable_cores()
    noisy = ""
    if _missing(answer, "new_pipeline(files, ...) with the parallel map switched off"):
        return False
    single = float(single_core_img_per_s)
    spec = getattr(answer, "element_spec", None)
    if spec is None:  # a measurement: only the earlier single-core rate to compare with
        rate = _number(getattr(answer, "mean", answer))
        if rate is None or rate <= 0:
            return _verdict(False, "", "give your pipeline (a tf.data.Dataset of (images, "
                                       "labels) batches)")
        reference, limit, what = single, 1.5, f"section 2's single-core {single:.1f}"
    else:
        first = spec[0] if isinstance(spec, tuple) else None
        if first is None or getattr(first, "shape", None) is None or first.shape.rank != 4:
            return _verdict(False, "", "give a pipeline of (images, labels) batches: images "
                                       "[batch, size, size, 3]")
        timed = benchmark.compare_pipelines(
            {"yours": answer, "yours, one thread": _one_thread(answer)}, n_batches,
            warmup_batches, repeats)
        rate, reference = (max(timed[k].images_per_s) for k in ("yours", "yours, one thread"))
        limit = SERIAL_MAX_SPEEDUP
        if any(r.std > 0.25 * r.mean for r in timed.values()):
            noisy = " The runs varied by more than a quarter: the machine is busy; rerun."
        what = (f"itself on one thread {reference:.1f} (side by side; section 2's single "
                f"core: {single:.1f})")
    shown = f"{rate:.1f} images/s = {rate / reference:.2f} x {what}"
    return _verdict(
        rate <= limit * reference,
        f"{shown}: one image at a time. What the new approach gains on one worker comes from "
        "parallel decoding; sharding first, parallel reads and prefetching cannot make one "
        "core decode faster." + ("" if cores >= 2 else " (With one core a parallel map runs "
                                 "at this rate too: try it on a machine with more cores.)")
        + noisy,
        f"{shown}: something still decodes in parallel. Did you drop num_parallel_calls from "
        "the map, and keep TF's map_parallelization off (TF parallelises a stateless map on "
        "its own)?" + noisy)


def check_worker_shares(answer: tuple[int, int] | None, files: Sequence[Path | str],
                        num_workers: int = 4, counts: Sequence[int] | None = None) -> bool:
    """02, exercise 3: ``(largest, smallest)`` number of images a worker keeps with the new
    approach (file-level sharding), from :func:`benchmark.shard_counts`."""
    kept = [row["new_kept"] for row in benchmark.shard_counts(files, num_workers, counts)]
    expected = (max(kept), min(kept))
    if _missing(answer, f"benchmark.shard_counts(files, {num_workers}, counts=counts): look at "
                        "new_kept; write (largest, smallest)"):
        return False
    ratio = expected[0] / expected[1] if expected[1] else math.inf
    return _verdict(
        _pair(answer) == expected,
        f"{len(files)} shards over {num_workers} workers: the workers keep {kept} images, "
        f"largest/smallest = {ratio:.2f}. Horovod waits for the slowest at every step.",
        f"worker i of {num_workers} opens files i, i + {num_workers}, ...: add up the "
        "records of its files (the new_kept column).")


# ---------------------------------------------------------------------------------------
# 03 training, and 05: a measured comparison
# ---------------------------------------------------------------------------------------

def check_which_is_faster(answer: str | None, measured: Mapping[str, float | None],
                          higher_is_faster: bool = True, same_within: float = 0.2) -> bool:
    """03 exercise 1, 05 exercise 4: your prediction of which of two measurements is faster.

    ``measured``: ``{name: value}`` for the two settings, measured by you (images/s with
    ``higher_is_faster=True``, seconds with ``False``). ``answer``: the faster name, or
    ``"same"`` when neither is more than ``same_within`` (20 %) faster: differences of that
    size are noise on a shared machine.
    """
    names = list(measured)
    if len(names) != 2:
        raise ValueError(f"measured needs exactly two settings, got {names}")
    if _missing(answer, f"write one of {[*names, SAME]}"):
        return False
    not_measured = [n for n in names if _number(measured[n]) is None]
    if not_measured:
        return _verdict(False, "", f"measure {not_measured} first and pass the value(s).")
    a, b = (float(measured[n]) for n in names)  # type: ignore[arg-type]
    fast, slow = (names[0], names[1]) if (a > b) == higher_is_faster else (names[1], names[0])
    speedup = max(a, b) / min(a, b) if min(a, b) > 0 else math.inf
    expected = SAME if speedup <= 1 + same_within else fast
    shown = f"{names[0]} {a:.4g}, {names[1]} {b:.4g}"
    return _verdict(
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
    if _missing(answer, "write resume(run_dir) returning (model, plateau, initial_epoch) and "
                        "set answer = resume"):
        return False
    if not callable(answer):
        return _verdict(False, "", "answer must be your function itself: answer = resume")
    try:
        model, restored, initial_epoch = answer(Path(run_dir))
    except Exception as e:  # the learner's code: report, never raise
        return _verdict(False, "", f"resume({Path(run_dir).name!r}) raised "
                                   f"{type(e).__name__}: {e}")
    problems = []
    if _number(initial_epoch) != epochs_done:
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
                a.shape == b.shape and np.array_equal(a, b) for a, b in zip(mine, theirs)):
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
    return _verdict(
        not problems,
        f"resumed at epoch {epochs_done + 1} with optimizer step {steps}, the learning rate "
        f"and Adam's moments of the run, and the plateau counters {_plateau_counters(plateau)} "
        "surviving on_train_begin: fit continues as if it had never stopped.",
        "; ".join(problems))


def check_cam(answer: Callable[[Any, Any, int], Any] | None, model: Any, image: Any,
              classes: Sequence[int], atol: float = 1e-4) -> bool:
    """03, exercise 3: your ``cam(model, image, class_index)`` (CheXNet's class activation
    map) against Grad-CAM at the last feature map (:func:`chexnet_utils.explain.grad_cam`)
    for each of ``classes``: same shape, values within ``atol``.

    Behind a global average pooling and a dense head the two are the same map up to a
    positive factor, which the scaling to [0, 1] removes; the tolerance is for the different
    order of the floating-point operations.
    """
    from chexnet_utils.explain import grad_cam

    if _missing(answer, "write cam(model, image, class_index) and set answer = cam"):
        return False
    if not callable(answer):
        return _verdict(False, "", "answer must be your function itself: answer = cam")
    worst = 0.0
    for c in classes:
        expected = grad_cam(model, image, int(c))
        try:
            mine = np.asarray(answer(model, image, int(c)), dtype=np.float64)
        except Exception as e:  # the learner's code: report, never raise
            return _verdict(False, "", f"cam(..., {c}) raised {type(e).__name__}: {e}")
        if mine.shape != expected.shape:
            return _verdict(False, "", f"cam(..., {c}) has shape {mine.shape}; Grad-CAM's map "
                                       f"is {expected.shape}: resize to the image")
        worst = max(worst, float(np.max(np.abs(mine - expected))))
    return _verdict(
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
    if _missing(answer, "predict from section 5: how fast does one core decode full-size "
                        "images, and how fast does the model train?"):
        return False
    value = _number(answer)
    if value is None:
        return _verdict(False, "", "give your prediction as a number of images/s")
    old, new = (float(v) for v in measure())
    drift = new / fed_full.fed if fed_full.fed > 0 else 1.0
    adjusted = value * drift
    shown = (f"measured now: old {old:.0f}, new {new:.0f} images/s (section 5: new "
             f"{fed_full.fed:.0f}); your {value:.0f} x {drift:.2f} for the drift = {adjusted:.0f}")
    return _verdict(
        abs(adjusted - old) <= tolerance * old,
        f"{shown}. One core decodes about {one_core:.0f} full-size images/s: with the model on "
        f"other hardware training would approach min(that, model) = {overlap:.0f}, with both "
        f"sharing these cores about {shared:.0f}.",
        f"{shown}. The old approach decodes on one core: about {fed_full.pipeline:.0f} / "
        f"{cores} = {one_core:.0f} images/s; training cannot beat min(that, model) = "
        f"{overlap:.0f}, and on a CPU the two halves share the cores (about {shared:.0f}). On a "
        "busy machine this process may get less than its cores, and the old and new rates "
        "converge.")


# ---------------------------------------------------------------------------------------
# 05 communication and scaling
# ---------------------------------------------------------------------------------------

def check_old_pipeline_efficiency(answer: float | None, rate_1: float, rate_m: float,
                                  m: int, n: int = 4) -> bool:
    """04, exercise 4: the old pipeline's scaling efficiency on ``n`` workers, predicted from
    its measured images/s on 1 and on ``m`` workers (a fraction, 0..1).

    Every worker decodes every image and keeps 1/N, so a useful image costs ``N d + c``
    (decode ``d``, model ``c``): ``1/rate_1 = d + c`` and ``m/rate_m = m d + c`` give ``d`` and
    ``c``, and the efficiency on ``n`` workers is ``(d + c) / (n d + c)``.
    """
    if m < 2:
        raise ValueError(f"needs a measurement on m >= 2 workers, got m={m}")
    t1, tm = 1.0 / rate_1, m / rate_m
    d = (tm - t1) / (m - 1)
    c = t1 - d
    if _missing(answer, "1/rate(1) = d + c and m/rate(m) = m d + c: solve for d and c"):
        return False
    if d <= 0:
        print(f"Not yet: these rates scale at least linearly ({rate_1:.1f} -> {rate_m:.1f} "
              f"img/s on {m} workers), so nothing is decoded twice: that is the new pipeline's "
              "behaviour; use the old pipeline's rates")
        return False
    if c <= 0:
        print(f"Not yet: {rate_1:.1f} -> {rate_m:.1f} img/s on {m} workers is worse than "
              "decoding every image on every worker explains (the model time comes out "
              "negative): something else slowed the workers down (a busy machine, MPI "
              "spinning). Measure again on a quiet machine")
        return False
    expected = (d + c) / (n * d + c)
    value = _number(answer)
    return _verdict(
        value is not None and abs(value - expected) <= 0.01,
        f"{expected:.1%} on {n} workers (d = {d * 1e3:.1f} ms decode, c = {c * 1e3:.1f} "
        f"ms model per image). However many workers, the job never beats 1/d = "
        f"{1 / d:.0f} img/s.",
        "give a fraction between 0 and 1, not a percentage" if value is not None and value > 1
        else f"d = (m/rate(m) - 1/rate(1)) / (m - 1); c = 1/rate(1) - d; then "
             f"(d + c) / ({n} d + c)")


def check_efficiency(answer: float | None, n_workers: int, grad_bytes: float,
                     compute_s: float, alpha: float, beta: float, overhead_s: float = 0.0,
                     n_messages: int = 1) -> bool:
    """05, exercises 1 and 2: the ring's predicted scaling efficiency (a fraction, 0..1).

    Recomputes :func:`comm.scaling_efficiency_prediction` with your fitted ``alpha``,
    ``beta`` and ``overhead_s``; ``n_messages`` > 1 is the gradient sent without fusion.
    """
    def eff(messages: int) -> float:
        return comm.scaling_efficiency_prediction(n_workers, grad_bytes, compute_s, alpha, beta,
                                                  overhead_s=overhead_s, n_messages=messages)

    expected = eff(n_messages)
    if _missing(answer, "use comm.scaling_efficiency_prediction (or eff() of section 7)"):
        return False
    value = _number(answer)
    unfused = (f" Fused into one message it would be {eff(1):.1%}: each of the {n_messages} "
               f"messages pays 2(N-1) = {2 * (n_workers - 1)} latencies."
               if n_messages > 1 else "")
    return _verdict(
        value is not None and abs(value - expected) <= 0.01,
        f"{expected:.1%} on {n_workers} workers with {compute_s * 1e3:g} ms of compute per step."
        + unfused,
        "give a fraction between 0 and 1, not a percentage" if value is not None and value > 1
        else "compute / (compute + overhead + messages x ring time per message); the ring "
             "time is 2(N-1) alpha + 2(N-1)/N x bytes x beta.")


def check_ps_shards(answer: int | None, n_workers: int = 64) -> bool:
    """05, exercise 3: the fewest parameter-server shards whose busiest link carries no more
    than a ring-allreduce worker's link.

    With ``k`` shards a server link carries ``N x size / k`` each way, a ring worker's link
    ``2(N-1)/N x size``: so ``k >= N^2 / (2(N-1))``.
    """
    bound = n_workers ** 2 / (2 * (n_workers - 1))
    expected = math.ceil(bound)
    if _missing(answer, "one shard's link carries N x size / k each way; a ring worker's "
                        "2(N-1)/N x size"):
        return False
    value = _number(answer)
    return _verdict(
        _close(answer, expected),
        f"k >= N^2 / (2(N-1)) = {bound:.2f}, so {expected} shards for {n_workers} workers: "
        "about one server per two workers. As many shards as workers *is* an allreduce.",
        (f"close: with {value:g} shards a server link carries {n_workers / value:.3f} x size, "
         f"a ring worker's {2 * (n_workers - 1) / n_workers:.3f} x size"
         if value is not None and value > 0 and abs(value - bound) < 2 else
         "set N x size / k <= 2(N-1)/N x size and solve for the smallest whole k."))


# ---------------------------------------------------------------------------------------
# 04 distributed training
# ---------------------------------------------------------------------------------------

def check_horovod_conversion(answer: tuple[Callable[..., Any], Callable[..., Any]] | None,
                             n_workers: int = 2,
                             run: Callable[..., list[dict[str, Any]]] | None = None) -> bool:
    """04 exercise 6: ``answer = (to_horovod, save)``, your conversion of a one-worker step
    (``to_horovod(model, optimizer, loss_fn)`` returns ``step(images, labels)``) and of its
    checkpoint (``save(model, folder)``), run on fresh engines (or through ``run``) by
    :func:`chexnet_utils.horovod_keras.conversion_trial`; the ranks compared."""
    import tempfile

    from chexnet_utils.horovod_keras import conversion_problem, conversion_trial, run_on_engines

    if _missing(answer, "convert the two functions above and set answer = (to_horovod, save)"):
        return False
    if callable(answer) or len(answer) != 2:
        return _verdict(False, "", "answer is the pair of your two functions: "
                        "answer = (to_horovod, save).")
    with tempfile.TemporaryDirectory(prefix="chexnet-ex6-") as out:
        ranks = run_on_engines(conversion_trial, *answer, out, n_workers=n_workers, run=run)
    problem = conversion_problem(ranks)
    return _verdict(problem is None, f"{len(ranks)} ranks started from rank 0's weights, "
                    "trained on their own data and ended identical, with the learning rate "
                    "scaled; only rank 0 wrote its checkpoint.", problem or "")


def check_uneven_shards(answer: Callable[..., Any] | None, n_workers: int = 2,
                        run: Callable[..., list[Any]] | None = None, timeout: float = 90) -> bool:
    """04 exercise 7: your ``train_all(step, batches, model)`` on shards of unequal size
    (:func:`chexnet_utils.horovod_keras.join_trial`: 4 batches on rank 0, 2 on rank 1):
    every rank trains on all its batches, no rank hangs, the ranks end identical."""
    from chexnet_utils.distributed import EngineFailure
    from chexnet_utils.horovod_keras import join_problem, join_trial, run_on_engines

    if _missing(answer, "write train_all (the cell above) and set answer = train_all"):
        return False
    try:  # a rank left in an allreduce never returns: the timeout ends the job
        ranks = run_on_engines(join_trial, answer, n_workers=n_workers, run=run, timeout=timeout)
    except EngineFailure as e:
        return _verdict(False, "", f"the job hung ({e}): the rank with more batches waits in "
                        "an allreduce nobody joins; call hvd.join() after your loop.")
    problem = join_problem(ranks)
    return _verdict(problem is None, "every rank trained on all its batches, nobody hung, "
                    "and the ranks ended identical.", problem or "")
