"""Answer checks of notebooks 00 (environment check) and 01 (data preparation)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from chexnet_utils.data import leakage, tfrecords
from chexnet_utils.data.nih import ImageRecord
from chexnet_utils.hardware import devices, envcheck
from chexnet_utils.notebook.exercises.verdict import close, missing, number, pair, verdict


def check_thread_budget(answer: int | None, n_processes: int = 3,
                        cores: int | None = None) -> bool:
    """00, exercise 1: threads per process when ``n_processes`` share the cores.

    ``cores`` defaults to the cores this process may use (:func:`devices.usable_cores`).
    """
    cores = cores or devices.usable_cores()
    expected = devices.cpu_thread_budget(n_processes, cores)
    if missing(answer, "look at cpu_thread_budget in chexnet_utils/hardware/devices.py"):
        return False
    return verdict(
        close(answer, expected),
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
    if missing(answer, "write the set of ranks, e.g. {1, 2}; each node's "
                        f"tf.config.list_physical_devices('GPU') has {gpus_per_node} entries"):
        return False
    try:
        given = None if isinstance(answer, str) else {int(r) for r in answer}
    except (TypeError, ValueError):
        given = None
    return verdict(
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
    if missing(answer, f"choose among {extra}"):
        return False
    if isinstance(answer, str):
        names: list[Any] = answer.split(",")
    elif isinstance(answer, Iterable):
        names = list(answer)
    else:
        return verdict(False, "", f"give capability names, e.g. a list of strings from {extra}")
    given = {str(n).strip().lower() for n in names if str(n).strip()} - set(already)
    unknown = given - set(extra)
    ok = "nccl" in given and not unknown
    return verdict(
        ok,
        f"require {sorted(given)}: python -m chexnet_utils envcheck --require "
        f"{','.join([*already, *sorted(given)])}. NCCL is what makes the allreduce fast on "
        "GPUs" + ("." if "gpu" in given
                  else "; 'gpu' (TensorFlow sees a GPU) is a good addition."),
        f"unknown capability {sorted(unknown)}; choose among {extra}" if unknown else
        "which build option of Horovod gives the GPU collectives (see the table in section 2)?")


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
    if missing(answer, f"the {split} split has {n} images; write your plan (a list of images "
                        "per shard) or (shards, images in the last)"):
        return False
    given = None
    if isinstance(answer, Sequence) and not isinstance(answer, str):
        given = [number(x) for x in answer]
    ok = given == plan or pair(answer) == (n_shards, last)
    numbers = [x for x in given or [] if x is not None]
    dropped = given is not None and len(numbers) == len(given) and sum(numbers) < n
    return verdict(
        ok,
        f"{n} {split} images in shards of {shard_size}: ceil({n} / {shard_size}) = {n_shards} "
        f"shards, the last holds {n} - {shard_size} x {n_shards - 1} = {last}."
        + (f" A writer that keeps only full shards would silently drop those {last}."
           if last < shard_size else ""),
        f"your plan holds {sum(numbers):g} of the {n} images: the last shard takes the "
        "remainder (it is written, not dropped)." if dropped else
        f"the {split} split has {n} images; every shard but the last holds {shard_size}, "
        "and the last takes the remainder (it is written, not dropped).")


def check_images_per_patient(answer: float | None, records: Sequence[ImageRecord]) -> bool:
    """01, exercise 3: the mean number of images per patient in ``records`` (e.g.
    ``ds.records``): what makes an image-level split leak."""
    patients = {r.patient_id for r in records}
    expected = len(records) / len(patients)
    if missing(answer, "count the images and the distinct patient_id values of the records"):
        return False
    if not close(answer, expected, rel=0.02, abs_=0.01):
        return verdict(False, "", f"divide the number of images ({len(records)}) by the "
                        "number of distinct patient_id values.")
    # the consequence, computed on the same records: with and without repeat patients
    first_image: dict[int, ImageRecord] = {}
    for r in records:
        first_image.setdefault(r.patient_id, r)
    leaked = leakage.patients_on_both_sides(leakage.image_level_split(records))
    single = leakage.patients_on_both_sides(leakage.image_level_split(list(first_image.values())))
    return verdict(True, f"{len(records)} images of {len(patients)} patients: {expected:.2f} "
                    f"per patient. An image-level split leaves {leaked['patients_in_both']:.0f} "
                    "patients on both sides; keep one image per patient and it leaves "
                    f"{single['patients_in_both']:.0f}.", "")
