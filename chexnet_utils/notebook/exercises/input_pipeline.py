"""Answer checks of the input-pipeline notebooks: 02 (old vs new) and 07 (feeding at scale)."""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chexnet_utils.bench import benchmark
from chexnet_utils.hardware import devices
from chexnet_utils.notebook.exercises.verdict import close, missing, number, pair, verdict
from chexnet_utils.platform.lazy import lazy_module

# TensorFlow: imported on first use (chexnet_utils.platform.lazy)
tf = lazy_module("tensorflow")

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
    if missing(answer, f"a dict with the keys {list(STEP_TIME_KEYS)}, in milliseconds"):
        return False
    if not isinstance(answer, Mapping) or set(answer) != set(STEP_TIME_KEYS):
        return verdict(False, "", f"give a dict with exactly the keys {list(STEP_TIME_KEYS)}")
    wrong = [k for k in STEP_TIME_KEYS if not close(answer[k], expected[k], abs_=0.5)]
    return verdict(
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
    if missing(answer, "new_pipeline(files, ...) with the parallel map switched off"):
        return False
    single = float(single_core_img_per_s)
    spec = getattr(answer, "element_spec", None)
    if spec is None:  # a measurement: only the earlier single-core rate to compare with
        rate = number(getattr(answer, "mean", answer))
        if rate is None or rate <= 0:
            return verdict(False, "", "give your pipeline (a tf.data.Dataset of (images, "
                                       "labels) batches)")
        reference, limit, what = single, 1.5, f"section 2's single-core {single:.1f}"
    else:
        first = spec[0] if isinstance(spec, tuple) else None
        if first is None or getattr(first, "shape", None) is None or first.shape.rank != 4:
            return verdict(False, "", "give a pipeline of (images, labels) batches: images "
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
    return verdict(
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
    if missing(answer, f"benchmark.shard_counts(files, {num_workers}, counts=counts): look at "
                        "new_kept; write (largest, smallest)"):
        return False
    ratio = expected[0] / expected[1] if expected[1] else math.inf
    return verdict(
        pair(answer) == expected,
        f"{len(files)} shards over {num_workers} workers: the workers keep {kept} images, "
        f"largest/smallest = {ratio:.2f}. Horovod waits for the slowest at every step.",
        f"worker i of {num_workers} opens files i, i + {num_workers}, ...: add up the "
        "records of its files (the new_kept column).")


# ---------------------------------------------------------------------------------------
# 07 feeding at scale: the list_files fix and where the cache goes
# ---------------------------------------------------------------------------------------

def _names(dataset: Any) -> list[str]:
    """The file names a dataset of names yields in one pass (one epoch)."""
    return [Path(n.decode() if isinstance(n, bytes) else str(n)).name
            for n in dataset.as_numpy_iterator()]


def check_list_files_fix(answer: Callable[[str, int, int], Any] | None, pattern: str,
                         num_workers: int = 2, epochs: int = 3) -> bool:
    """07, exercise 3: your ``worker_files(pattern, rank, num_workers)``, the dataset of file
    names worker ``rank`` reads, run for every rank and read ``epochs`` times (each new pass
    over a dataset is a new epoch).

    Correct when in every epoch each file matching ``pattern`` is read by exactly one
    worker, and each worker with two or more files reads them in a new order in some epoch
    (shuffled after the shard). ``list_files`` shuffles by default, with a new random order
    for every call: the articles' ``list_files(pattern)`` followed by ``shard`` reads some
    files twice and others never.
    """
    if missing(answer, "fix worker_files above and set answer = worker_files"):
        return False
    if not callable(answer):
        return verdict(False, "", "answer must be your function itself: answer = worker_files")
    everything = sorted(Path(p).name for p in tf.io.gfile.glob(pattern))
    try:
        per_rank = [answer(pattern, rank, num_workers) for rank in range(num_workers)]
        reads = [[_names(ds) for ds in per_rank] for _ in range(epochs)]  # [epoch][rank]
    except Exception as e:  # the learner's code: report, never raise
        return verdict(False, "", f"worker_files raised {type(e).__name__}: {e}")
    for epoch, ranks in enumerate(reads, 1):
        seen = [name for names in ranks for name in names]
        twice = sorted({n for n in seen if seen.count(n) > 1})
        never = sorted(set(everything) - set(seen))
        if len(everything) > 1 and all(sorted(names) == everything for names in ranks):
            return verdict(False, "", (
                f"epoch {epoch}: every worker read every file: shard the file names "
                "(files.shard(num_workers, rank)) so that each worker reads its own share."))
        if twice or never or sorted(seen) != everything:
            return verdict(False, "", (
                f"epoch {epoch}: {len(twice)} of {len(everything)} files read by more than one "
                f"worker, {len(never)} by none (per worker {[len(r) for r in ranks]}). "
                "list_files shuffles by default, in a new order in every process: give every "
                "worker the same order before shard (shuffle=False, or one seed for all), and "
                "shard before anything else."))
    frozen = [rank for rank in range(num_workers) if len(reads[0][rank]) > 1
              and all(reads[e][rank] == reads[0][rank] for e in range(epochs))]
    if frozen:
        return verdict(False, "", (
            f"every file is read once per epoch, but worker(s) {frozen} read theirs in the same "
            f"order in all {epochs} epochs: shuffle each worker's files after the shard "
            "(shuffle(..., reshuffle_each_iteration=True))."))
    return verdict(True, (
        f"{len(everything)} files over {num_workers} workers, each read exactly once per epoch "
        f"in {epochs} epochs, in a new order on every worker: one order for all before the "
        "shard, a shuffle of each worker's own files after it."), "")


DECODE_OPS = frozenset({"DecodePng", "DecodeImage", "DecodeJpeg", "DecodeBmp", "DecodeGif"})
"""TensorFlow ops that decode an image: in a map after the cache, every epoch decodes."""


def _ops_of(function: str, library: Mapping[str, Any], seen: set[str]) -> set[str]:
    """The op types ``function`` of a GraphDef's library runs, nested functions included."""
    if function in seen or function not in library:
        return set()
    seen.add(function)
    ops: set[str] = set()
    for node in library[function].node_def:
        ops.add(node.op)
        ops |= _ops_of(node.op, library, seen)
        for attr in node.attr.values():
            for name in [attr.func.name, *(f.name for f in attr.list.func)]:
                ops |= _ops_of(name, library, seen)
    return ops


def ops_around_cache(dataset: Any) -> dict[str, Any]:
    """Where ``dataset``'s ``cache()`` sits, read from its serialized graph
    (``tf.data.Dataset._as_serialized_graph``: each transformation a node, each map function
    in the graph's function library): ``{"cached": bool, "before": ops, "after": ops}``, the
    op types the transformations upstream and downstream of the (first) cache run."""
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    library = {f.signature.name: f for f in graph.library.function}
    nodes = {n.name: n for n in graph.node}
    inputs = {n.name: [i.lstrip("^").split(":")[0] for i in n.input] for n in graph.node}
    consumers: dict[str, list[str]] = {}
    for name, ins in inputs.items():
        for i in ins:
            consumers.setdefault(i, []).append(name)

    def reach(start: str, edges: Mapping[str, list[str]]) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), []):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    def ops(names: set[str]) -> set[str]:
        found: set[str] = set()
        for name in names:
            for attr in nodes[name].attr.values() if name in nodes else []:
                if attr.func.name:
                    found |= _ops_of(attr.func.name, library, set())
        return found

    caches = [n.name for n in graph.node if n.op.startswith("CacheDataset")]
    if not caches:
        return {"cached": False, "before": ops(set(nodes)), "after": set()}
    return {"cached": True, "before": ops(reach(caches[0], inputs)),
            "after": ops(reach(caches[0], consumers))}


def _random(ops: set[str]) -> bool:
    return any("Random" in op for op in ops)


def _images(dataset: Any) -> list[Any]:
    """The images of one pass over a dataset of ``(image, label)`` elements or batches."""
    out: list[Any] = []
    for element in dataset.as_numpy_iterator():
        images = element[0] if isinstance(element, tuple) else element
        out.extend(images if images.ndim == 4 else [images])
    return out


def _match(image: Any, reference: Sequence[Any]) -> tuple[int, bool] | None:
    """``(index, flipped)`` of the reference image that ``image`` is, or its mirror."""
    for i, ref in enumerate(reference):
        if ref.shape == image.shape:
            if np.allclose(image, ref, atol=1e-5):
                return i, False
            if np.allclose(image, ref[:, ::-1], atol=1e-5):
                return i, True
    return None


def check_cache_placement(answer: Callable[[Sequence[Path]], Any] | None,
                          files: Sequence[Path | str], decode: Callable[..., Any]) -> bool:
    """07, exercise 4: your ``cached_augmented(files)``, a pipeline of decoded, cached,
    randomly flipped ``(image, label)`` elements (or batches).

    The check builds it on a copy of ``files``, reads one epoch, deletes the copy and reads a
    second: the second epoch must come from the cache. Every image of both epochs must be one
    of ``files``' records mapped with ``decode`` (the notebook's map function), or its mirror
    image, each record once per epoch. Where the cache sits is read from the pipeline's graph
    (:func:`ops_around_cache`): no map after it may decode (a cache of undecoded records
    decodes every epoch), no random op may run before it (a flip before the cache is drawn
    once and cached: every epoch the same flips), and a random op must run after it.

    The flips of the two epochs are not compared for the verdict: with a global seed set
    (``tf.random.set_seed``, ``keras.utils.set_random_seed``) a random op in a map draws the
    same sequence in every epoch even after the cache, which the verdict then explains.
    """

    if missing(answer, "write cached_augmented(files) and set answer = cached_augmented"):
        return False
    if not callable(answer):
        return verdict(False, "", "answer must be your function itself: answer = "
                                  "cached_augmented")
    reference = _images(tf.data.TFRecordDataset([str(f) for f in files]).map(decode))
    with tempfile.TemporaryDirectory(prefix="chexnet-ex4-") as tmp:
        copies = [Path(shutil.copy(f, tmp)) for f in files]
        try:
            dataset = answer(copies)
            first = _images(dataset)
        except Exception as e:  # the learner's code: report, never raise
            return verdict(False, "", f"cached_augmented raised {type(e).__name__}: {e}")
        for c in copies:
            c.unlink()
        try:
            second = _images(dataset)
        except Exception as e:  # the files are gone: epoch 2 did not come from a cache
            return verdict(False, "", (
                f"epoch 2 read the files again ({type(e).__name__} once they were deleted): "
                "there is no cache() in your pipeline, or the first epoch stopped before its "
                "end (a cache is kept only after a full pass: not with take())."))
    epochs = []
    for epoch, images in enumerate((first, second), 1):
        found = [_match(x, reference) for x in images]
        matched = [m for m in found if m is not None]
        if (len(matched) != len(found)
                or sorted(i for i, _ in matched) != list(range(len(reference)))):
            return verdict(False, "", (
                f"epoch {epoch} holds {len(images)} images; {len(reference)} records decoded "
                "with decode(...) (or their mirror images) were expected, each once: build on "
                "decoded(files), and keep the images whole."))
        epochs.append(dict(matched))
    graph = ops_around_cache(dataset)
    if not graph["cached"]:
        return verdict(False, "", "epoch 2 did not need the files, but there is no cache() in "
                                  "your pipeline: put cache() after the decode.")
    if graph["after"] & DECODE_OPS:
        return verdict(False, "", (
            "the cache holds undecoded records: a map after cache() decodes, so every epoch "
            "decodes again. Cache after the decode."))
    if _random(graph["before"]):
        return verdict(False, "", (
            "the random flip runs before cache(): it is drawn once and cached, and every "
            "epoch sees the same flips"
            + (" (yours did)." if epochs[0] == epochs[1] else ".")
            + " Put cache() before the random flip."))
    if not _random(graph["after"]):
        return verdict(False, "", "no random flip after the cache: where is the augmentation?")
    changed = sum(epochs[0][i] != epochs[1][i] for i in epochs[0])
    seeded = ("" if changed else
              " (Your two epochs drew the same flips: a global seed is set in this kernel, "
              "tf.random.set_seed or keras.utils.set_random_seed, and a seeded random op in a "
              "map starts its sequence again every epoch.)")
    return verdict(True, (
        f"epoch 2 came from the cache (the files were gone), with every one of the "
        f"{len(reference)} decoded images, and the flip after the cache ({changed} flips "
        f"changed between the epochs): decode, cache, then augment.{seeded}"), "")
