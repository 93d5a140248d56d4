"""The ``tf.data`` toolbox beyond the recipe: cache, ``list_files``, Options.

The new approach of :mod:`chexnet_utils.input.pipelines` (shard, interleave, parallel map,
prefetch) runs at the decode ceiling of the host's cores. What is left when that is not
enough:

* **Do not decode twice**: :func:`cached_pipeline` caches the decoded, *not yet augmented*
  images (``.cache()`` in memory, or to a file), so from the second epoch on nothing is
  decoded; the random flip comes after the cache (augmentation before ``cache()`` would
  freeze one random draw for every epoch). Memory cost: :func:`cache_bytes` (decoded float
  images are far larger than PNGs; data larger than RAM must go to a file or not be cached).
  Notebook 07 writes the same pipeline in a cell and checks it against this one, and puts
  ``Dataset.snapshot(path)`` where the cache was.
* **The articles' SageMaker form**: :func:`list_files_pipeline` -
  ``Dataset.list_files(pattern)`` then ``TFRecordDataset(files, num_parallel_reads=...)`` -
  beside the new approach's ``interleave``. Its trap: ``list_files`` *shuffles by default*,
  with a seed of its own in every process, so ``shard`` after it gives each worker a slice
  of a *different* permutation: workers overlap and files are missed.
  :func:`list_files_shard_overlap` counts that; the fix is ``shuffle=False`` (or one seed
  shared by all workers) before ``shard``, and shuffling after it.
* **tf.data.Options**: :func:`with_options` (autotune RAM budget, private thread pool).
* **Keras 3's own loader**: :class:`chexnet_utils.input.pydataset.DecodePyDataset`, the same
  decode in a ``keras.utils.PyDataset`` with ``workers`` / ``use_multiprocessing`` (a module
  of its own: it imports Keras).
"""

from __future__ import annotations

import glob
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from chexnet_utils.input.pipelines import AUTOTUNE, Files, example_fn
from chexnet_utils.platform.lazy import lazy_module

if TYPE_CHECKING:
    import tensorflow as tf

# TensorFlow: imported on first use (chexnet_utils.platform.lazy)
if not TYPE_CHECKING:
    tf = lazy_module("tensorflow")

__all__ = [
    "cache_bytes",
    "cached_pipeline",
    "epoch_seconds",
    "list_files_pipeline",
    "list_files_shard_overlap",
    "sleeping_step",
    "with_options",
]


def cache_bytes(n_images: int, image_size: int, channels: int = 3, dtype_bytes: int = 4) -> int:
    """Bytes a ``cache()`` of ``n_images`` decoded images takes (float32 RGB by default)."""
    return int(n_images) * image_size * image_size * channels * dtype_bytes


def _decoded(files: Files, image_size: int, with_names: bool) -> tf.data.Dataset:
    """Records of ``files`` -> ``(image, label[, name])`` decoded and normalised, unflipped."""
    fn = example_fn(image_size, False, None, with_names, antialias=False, batched=False)
    ds = tf.data.Dataset.from_tensor_slices([str(f) for f in files])
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=AUTOTUNE,
                       deterministic=True)
    return ds.map(fn, num_parallel_calls=AUTOTUNE, deterministic=True)


def _flip(*element: Any) -> tuple[Any, ...]:
    return (tf.image.random_flip_left_right(element[0]), *element[1:])


def cached_pipeline(files: Files, batch_size: int, image_size: int, cache_file: str = "",
                    training: bool = True, shuffle_buffer: int = 256, seed: int | None = None,
                    with_names: bool = False) -> tf.data.Dataset:
    """Decode once, then serve from the cache: ``... map(decode) .cache() .shuffle .map(flip)
    .batch .prefetch``. One pass = one epoch (no repeat: time epochs with
    :func:`epoch_seconds`).

    ``cache_file=""`` caches in memory (:func:`cache_bytes` of RAM); a path caches to disk
    (files ``PATH*``; a cache is only complete, and reused, once a full pass has finished).
    """
    ds = _decoded(files, image_size, with_names).cache(cache_file)
    if training:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        ds = ds.map(_flip, num_parallel_calls=AUTOTUNE)
    return ds.batch(batch_size).prefetch(AUTOTUNE)



def epoch_seconds(dataset: tf.data.Dataset, epochs: int) -> list[float]:
    """Wall seconds of each full pass over a (finite) ``dataset``."""
    out = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        for _batch in dataset:
            pass
        out.append(time.perf_counter() - t0)
    return out


def list_files_pipeline(pattern: str, batch_size: int, image_size: int,
                        num_workers: int = 1, worker_index: int = 0, shuffle: bool = False,
                        seed: int | None = None, training: bool = True,
                        with_names: bool = False, decode: bool = True) -> tf.data.Dataset:
    """The articles' SageMaker form::

        Dataset.list_files(pattern, shuffle=shuffle, seed=seed)
        .shard(num_workers, worker_index)
        -> TFRecordDataset(files, num_parallel_reads=AUTOTUNE)   # parallel reads
        .map(parse + preprocess, AUTOTUNE) .batch .prefetch

    ``TFRecordDataset(num_parallel_reads=N)`` is a parallel ``interleave`` over the files in
    one call (cycle length N, non-deterministic order). Correct only with ``shuffle=False``
    or a ``seed`` every worker shares: see :func:`list_files_shard_overlap`. With
    ``decode=False`` the elements are the image names only (for counting).
    """
    from chexnet_utils.data.tfrecords import parse_example

    files = tf.data.Dataset.list_files(pattern, shuffle=shuffle, seed=seed)
    files = files.shard(num_workers, worker_index)
    if training and not shuffle:
        # the fix: shard a fixed order, then shuffle this worker's own files
        files = files.shuffle(1024, seed=seed, reshuffle_each_iteration=True)
    ds = tf.data.TFRecordDataset(files, num_parallel_reads=AUTOTUNE)
    if not decode:
        return ds.map(lambda r: parse_example(r)["name"])

    fn = example_fn(image_size, training, None, with_names, antialias=False, batched=False)
    ds = ds.map(fn, num_parallel_calls=AUTOTUNE, deterministic=False)
    return ds.batch(batch_size, drop_remainder=training).prefetch(AUTOTUNE)


def list_files_shard_overlap(pattern: str, num_workers: int = 2, shuffle: bool = True,
                             seeds: Sequence[int | None] | None = None) -> dict[str, Any]:
    """Which examples each of ``num_workers`` workers reads in one epoch of
    :func:`list_files_pipeline`, and how many are read twice or never.

    ``shuffle=True`` with a different ``seeds[i]`` per worker is what happens when every
    Horovod process calls ``list_files(pattern)`` (shuffled, unseeded: each process draws
    its own order); ``seeds=None`` gives worker ``i`` the seed ``i``. ``shuffle=False`` is
    the fix. Returns ``per_worker`` (examples read), ``total``, ``distinct_read``,
    ``duplicated`` (examples read by more than one worker, counted once each), ``missed``
    (never read), and the same for files.
    """
    from chexnet_utils.data.tfrecords import read_examples

    seeds = list(seeds) if seeds is not None else list(range(num_workers))
    if len(seeds) != num_workers:
        raise ValueError(f"{len(seeds)} seeds for {num_workers} workers")
    all_names: list[str] = []
    for f in sorted(glob.glob(pattern)):
        all_names += [ex["name"] for ex in read_examples(f)]
    reads: Counter[str] = Counter()
    per_worker = []
    for i in range(num_workers):
        ds = list_files_pipeline(pattern, 1, 1, num_workers, i, shuffle=shuffle,
                                 seed=seeds[i], training=False, decode=False)
        names = [n.decode() for n in ds.as_numpy_iterator()]
        per_worker.append(len(names))
        reads.update(set(names))
    total = len(set(all_names))
    return {"num_workers": num_workers, "shuffle": shuffle, "seeds": seeds,
            "per_worker": per_worker, "total": total, "distinct_read": len(reads),
            "duplicated": sum(1 for v in reads.values() if v > 1),
            "missed": total - len(reads)}


def with_options(dataset: tf.data.Dataset, ram_budget_mb: int | None = None,
                 private_threads: int | None = None, autotune: bool | None = None
                 ) -> tf.data.Dataset:
    """``dataset`` with ``tf.data.Options``: ``autotune.ram_budget`` (MB the autotuner may
    spend on buffers), ``threading.private_threadpool_size`` (the pipeline's own threads:
    at most this many parallel map calls run at once, so 1 = one decoding core; isolates a
    pipeline from the training step's threads), ``autotune.enabled``."""
    opts = tf.data.Options()
    if ram_budget_mb is not None:
        opts.autotune.ram_budget = int(ram_budget_mb) * 1024 * 1024
    if private_threads is not None:
        opts.threading.private_threadpool_size = int(private_threads)
    if autotune is not None:
        opts.autotune.enabled = autotune
    return dataset.with_options(opts)


def sleeping_step(seconds: float) -> Callable[[Any], None]:
    """A training step for an emulated accelerator: ``step(batch)`` sleeps ``seconds``.

    Sleeping, like waiting for a GPU kernel, uses no CPU core, so the input pipeline keeps
    every core, as it would on a GPU host. Pass it where a step function is expected
    (``benchmark.record_timeline(ds, sleeping_step(0.02), n_steps)``). Raises ``ValueError``
    for a negative duration.
    """
    if seconds < 0:
        raise ValueError(f"seconds must be >= 0, got {seconds}")

    def step(_batch: Any) -> None:
        time.sleep(seconds)

    return step
