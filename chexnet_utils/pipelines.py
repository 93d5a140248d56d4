"""Two ``tf.data`` input pipelines over the same TFRecords: the "old" one and the "new" one.

Why this module exists
----------------------
A training step has two halves: the CPU reads, decodes and augments a mini-batch, then the
accelerator computes on it. Run one after the other, each half waits for the other and a step
costs the **sum** of both; pipelined (the CPU prepares batch N+1 while the accelerator works
on batch N) a step costs the **max**. When the CPU half is the larger one, no faster GPU and
no additional GPU helps: they wait for data (utilisation jumping between 0 % and 90 %).

The source articles show this with two pipelines that read the same TFRecords of chest X-rays:

* :func:`old_approach` - what many scripts of 2018/2019 did, kept here flaws and all:
  sequential reads, one-image-at-a-time decoding, and **sharding after decoding** (every
  Horovod worker decodes *every* image and throws away ``(N-1)/N`` of them, so adding workers
  adds no throughput).
* :func:`new_approach` - the recipe of the TensorFlow official ResNet ``input_fn``, in TF2
  idioms: shard the *file names* first, read several files in parallel, shuffle cheap encoded
  records instead of decoded images, decode on all cores, prefetch.

Both call the same :func:`preprocess` (decode, resize, grey to RGB, ImageNet normalisation,
random horizontal flip when training), so a model trained from either sees identically
distributed inputs and only the speed differs. Both take the same arguments (shard files,
batch size, image size, training/eval mode, ``num_workers`` / ``worker_index``) so that under
Horovod each process calls them with ``num_workers=hvd.size(), worker_index=hvd.rank()``.

:class:`PipelineOptions` has one switch per change of the new approach; with every switch
off, :func:`new_approach` behaves like :func:`old_approach`, and :func:`ablation_steps`
turns the switches on one at a time so the notebook can measure what each change is worth.

Element structure: batches of ``(image, label)`` with ``image`` float32
``[batch, S, S, 3]`` and ``label`` float32 ``[batch, 14]``; with ``with_names=True``
``(image, label, name)`` where ``name`` is the NIH image name (string ``[batch]``), which the
tests use to prove that both pipelines deliver the same examples.

Two TensorFlow defaults that would blur the comparison
------------------------------------------------------
* ``tf.data`` *silently parallelises stateless maps* (static optimisation
  ``map_parallelization``, on by default since TF 2.x). Decoding is stateless, so without
  precautions the "sequential" map of the old approach would run on all cores in eval mode.
  Pipelines that model "no parallel map" switch that optimisation off.
* ``tf.data`` *injects a prefetch* at the end of a pipeline whose last step is synchronous
  (``inject_prefetch``). Both builders end in an explicit prefetch, so it never applies here;
  :mod:`chexnet_utils.bench_pipeline` switches it off where it simulates a non-pipelined loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from os import PathLike
from typing import TYPE_CHECKING, Any

from chexnet_utils.checks import require_at_least
from chexnet_utils.labels import NUM_CLASSES

if TYPE_CHECKING:  # TensorFlow is imported lazily: ``import chexnet_utils`` stays cheap.
    import tensorflow as tf

__all__ = [
    "AUTOTUNE",
    "DEFAULT_CYCLE_LENGTH",
    "DEFAULT_SHUFFLE_BUFFER",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "PipelineOptions",
    "ablation_steps",
    "build_pipeline",
    "decode_resize",
    "new_approach",
    "normalize",
    "old_approach",
    "preprocess",
    "preprocess_batch",
]

IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
"""Per-channel (R, G, B) mean of ImageNet in [0, 1]; CheXNet starts from ImageNet weights, so
its inputs are normalised the way those weights expect."""
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)
"""Per-channel (R, G, B) standard deviation of ImageNet in [0, 1]."""

AUTOTUNE = -1
"""Same value as ``tf.data.AUTOTUNE``: let the tf.data runtime pick (and keep re-tuning) a
parallelism or buffer size. Defined here so that importing this module does not import TF."""

DEFAULT_SHUFFLE_BUFFER = 256
"""Shuffle buffer of both pipelines, in *elements*. Note what an element is: in the old
approach a decoded float image (224 px: 0.6 MB, so 256 of them are 150 MB; at 1024 px 3.2 GB),
in the new approach an encoded record (a few hundred KB at most), so the new approach can
afford a much larger buffer for the same memory."""

DEFAULT_CYCLE_LENGTH = 4
"""Files the new approach reads at once (``interleave(cycle_length=...)``)."""

Files = Sequence[str | PathLike[str]]


# --------------------------------------------------------------------------------------------
# Preprocessing: one definition used by both pipelines
# --------------------------------------------------------------------------------------------

def decode_resize(image_bytes: Any, image_size: int, antialias: bool = False) -> tf.Tensor:
    """PNG/JPEG bytes of one image -> float32 ``[S, S, 1]`` grey values in [0, 255].

    ``tf.io.decode_image(channels=1)`` turns any 8-bit grey, RGB or RGBA file into one grey
    channel (NIH ships a few RGBA PNGs among the grey ones); ``expand_animations=False`` keeps
    the result 3-D (a GIF would otherwise be 4-D). Decoding is the expensive part of the whole
    pipeline (about 9 ms for a 1024 px PNG on one core), and it can only run one image at a
    time: each file is a separate compressed stream.

    The resize is bilinear on the single grey channel (three times cheaper than resizing after
    the grey-to-RGB step). ``antialias=True`` low-pass filters before sub-sampling (what PIL and
    torchvision do), which avoids aliasing when shrinking 1024 -> 224 but costs about 15 %
    more CPU per image on top of decoding. It is off by default (as in ``tf.image.resize``)
    because this tutorial is about keeping the accelerator fed; switch it on when you train
    for accuracy on real data and the CPU has headroom. Both pipelines pass it through, so
    they always preprocess identically.
    """
    import tensorflow as tf

    img = tf.io.decode_image(image_bytes, channels=1, dtype=tf.uint8, expand_animations=False)
    img = tf.ensure_shape(img, [None, None, 1])
    img = tf.image.resize(img, [image_size, image_size], method="bilinear",
                          antialias=antialias)  # float32 out
    return tf.ensure_shape(img, [image_size, image_size, 1])


def normalize(grey: Any) -> tf.Tensor:
    """Grey values in [0, 255], shape ``[..., 1]`` -> ImageNet-normalised RGB ``[..., 3]``.

    Grey becomes RGB by repeating the channel (broadcasting ``[..., 1]`` against the three
    per-channel constants does it without a copy), values are scaled to [0, 1] and then
    standardised per channel: ``(x - mean_c) / std_c``. A mid-grey pixel (128) becomes
    ``(0.502 - 0.485) / 0.229 = 0.074`` in R, ``0.205`` in G and ``0.426`` in B. Works on one
    image ``[S, S, 1]`` and on a batch ``[B, S, S, 1]`` alike.
    """
    import tensorflow as tf

    mean = tf.constant(IMAGENET_MEAN, tf.float32)
    std = tf.constant(IMAGENET_STD, tf.float32)
    x = tf.clip_by_value(tf.cast(grey, tf.float32), 0.0, 255.0) * (1.0 / 255.0)
    return (x - mean) / std


def preprocess(image_bytes: Any, label: Any, image_size: int, training: bool,
               seed: int | None = None, antialias: bool = False) -> tuple[tf.Tensor, tf.Tensor]:
    """One example: encoded image + label -> ``(image float32 [S, S, 3], label float32 [14])``.

    Steps: :func:`decode_resize` (decode grey, bilinear resize to ``image_size`` square),
    :func:`normalize` (grey to 3 channels, [0, 1], ImageNet mean/std), and in training a
    random horizontal flip (CheXNet's only augmentation; chest films are nearly left-right
    symmetric in what matters for the labels). ``seed`` is the op-level seed of the flip
    (combine with ``tf.random.set_seed`` for repeatable runs). Evaluation never flips.

    This is the single definition both pipelines use, so any difference in accuracy between
    them can only come from the order of examples, never from what the model sees.
    """
    import tensorflow as tf

    image = normalize(decode_resize(image_bytes, image_size, antialias))
    if training:
        image = tf.image.random_flip_left_right(image, seed=seed)
    label = tf.ensure_shape(tf.cast(label, tf.float32), [NUM_CLASSES])
    return image, label


def preprocess_batch(image_bytes: Any, labels: Any, image_size: int, training: bool,
                     seed: int | None = None, antialias: bool = False
                     ) -> tuple[tf.Tensor, tf.Tensor]:
    """A batch: encoded images ``[B]`` + labels ``[B, 14]`` -> ``([B, S, S, 3], [B, 14])``.

    The "batch first, then map" variant. Decoding and resizing stay per image, inside
    ``tf.map_fn``: every file is its own compressed stream, and the sources need not all have
    the same size (NIH has a few that are not 1024 px), so there is nothing to vectorise
    before the resize. What follows (grey to RGB, scaling, normalisation, flip) runs as one op
    over the whole batch instead of ``B`` small ops, which saves per-op dispatch overhead -
    worthwhile when the per-image work is small (small images, cheap decoding), negligible
    when decoding a 1024 px PNG dominates. Gives exactly the same values as :func:`preprocess`
    image by image (up to the random flips).
    """
    import tensorflow as tf

    grey = tf.map_fn(lambda b: decode_resize(b, image_size, antialias), image_bytes,
                     fn_output_signature=tf.TensorSpec([image_size, image_size, 1], tf.float32))
    images = normalize(grey)
    if training:
        # On a 4-D tensor each image gets its own coin flip.
        images = tf.image.random_flip_left_right(images, seed=seed)
    labels = tf.ensure_shape(tf.cast(labels, tf.float32), [None, NUM_CLASSES])
    return images, labels


def example_fn(image_size: int, training: bool, seed: int | None, with_names: bool,
                antialias: bool, batched: bool):  # type: ignore[no-untyped-def]
    """The map function: serialized record(s) -> ``(image, label[, name])``."""
    from chexnet_utils.tfrecords import parse_example

    prep = preprocess_batch if batched else preprocess

    def fn(serialized):  # type: ignore[no-untyped-def]
        ex = parse_example(serialized)
        image, label = prep(ex["image_bytes"], ex["label"], image_size, training, seed,
                            antialias)
        return (image, label, ex["name"]) if with_names else (image, label)

    return fn


# --------------------------------------------------------------------------------------------
# Shared checks and tf.data options
# --------------------------------------------------------------------------------------------

def _check_common(files: Files, batch_size: int, image_size: int, num_workers: int,
                  worker_index: int) -> list[str]:
    names = [str(f) for f in files]
    if not names:
        raise ValueError("no TFRecord files given (is the split empty? see "
                         "chexnet_utils.tfrecords.list_shards)")
    require_at_least(1, batch_size=batch_size, image_size=image_size, num_workers=num_workers)
    if not 0 <= worker_index < num_workers:
        raise ValueError(f"worker_index must be in [0, {num_workers}), got {worker_index}")
    return names


def _map(ds: tf.data.Dataset, fn: Any, num_parallel_calls: int | None,
         deterministic: bool) -> tf.data.Dataset:
    """``ds.map(fn)``, parallel when ``num_parallel_calls`` is given."""
    if num_parallel_calls is None:
        return ds.map(fn)
    return ds.map(fn, num_parallel_calls=num_parallel_calls, deterministic=deterministic)


def _tf_options(parallel_map: bool) -> tf.data.Options:
    import tensorflow as tf

    opts = tf.data.Options()
    if not parallel_map:
        # Keep a sequential map sequential: TF would otherwise parallelise stateless maps.
        opts.experimental_optimization.map_parallelization = False
    return opts


# --------------------------------------------------------------------------------------------
# The old approach
# --------------------------------------------------------------------------------------------

def old_approach(files: Files, batch_size: int, image_size: int, training: bool = True,
                 num_workers: int = 1, worker_index: int = 0,
                 shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER, repeat: bool | None = None,
                 seed: int | None = None, with_names: bool = False,
                 antialias: bool = False) -> tf.data.Dataset:
    """The "old approach" input pipeline of the articles, flaws included. Do not copy it.

    ::

        TFRecordDataset(files)           # 1. one file after the other, one reader
        .map(parse + decode + preprocess)  # 2. one image at a time, on one core
        .shard(num_workers, worker_index)  # 3. keep every N-th image ... AFTER decoding all
        .shuffle(shuffle_buffer)           # 4. a buffer of *decoded* images
        .repeat()                          # 5.
        .batch(batch_size)                 # 6.
        .prefetch(batch_size)              # 7. batch_size *batches*, not images

    What is wrong with it, in order of cost:

    * **Shard after decode** (3): under Horovod every worker reads and decodes the whole data
      set and keeps ``1/N`` of it. Per-worker useful throughput falls as ``1/N``, so the
      aggregate stays flat however many GPUs you add - the "no scaling" curve of the
      articles. (``shard`` before ``map`` on records would fix the decoding but still make
      every worker read every byte.)
    * **Sequential decode** (2): one core decodes while the others idle; decoding a 1024 px
      PNG takes ~9 ms, so one core caps the pipeline near 100 images/s whatever the
      accelerator could do.
    * **Sequential reads** (1): one file at a time; on network storage (NFS, Lustre) a single
      reader stream rarely saturates the link.
    * **Shuffling decoded images** (4): the buffer holds float32 images (0.6 MB each at 224 px,
      12.6 MB at 1024 px) and must be filled - by the slow sequential decoder - before the
      first batch comes out.
    * **prefetch(batch_size)** (7): ``prefetch`` counts *elements*, here batches, so this
      buffers ``batch_size`` batches (memory) but adds no parallelism beyond one background
      thread: prefetching only overlaps the producer with the consumer, it cannot make the
      producer faster.

    Arguments as :func:`new_approach`. ``repeat=None`` means repeat in training, not in
    evaluation. Evaluation (``training=False``) does not shuffle or flip and keeps the last
    partial batch. The order of examples is deterministic (everything is sequential).
    """
    import tensorflow as tf

    names = _check_common(files, batch_size, image_size, num_workers, worker_index)
    repeat = training if repeat is None else repeat
    ds = tf.data.TFRecordDataset(names)
    ds = ds.map(example_fn(image_size, training, seed, with_names, antialias, batched=False))
    ds = ds.shard(num_workers, worker_index)
    if training:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    ds = ds.batch(batch_size)
    ds = ds.prefetch(batch_size)
    return ds.with_options(_tf_options(parallel_map=False))


# --------------------------------------------------------------------------------------------
# The new approach, switch by switch
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PipelineOptions:
    """One switch per change from the old approach to the new one.

    The defaults are the full new approach. :meth:`old_equivalent` turns every change off,
    which makes :func:`new_approach` behave like :func:`old_approach` (same steps in the same
    order, same examples per worker). :func:`ablation_steps` goes from one to the other.
    """

    shard_files_first: bool = True
    """Shard the list of *file names* before reading anything, so each worker opens only its
    own files (``len(files) >= num_workers`` needed). Off: shard decoded images, as the old
    approach does. This switch also moves the record shuffle and the repeat before decoding:
    the cheap encoded records are shuffled, then decoded."""
    shuffle_files: bool = True
    """Training only: shuffle the (per-worker) file names every epoch, so the files, and not
    only the records within the shuffle buffer, come in a new order."""
    parallel_interleave: bool = True
    """Read ``cycle_length`` files at once with a parallel ``interleave`` (off: one file
    after the other, like ``TFRecordDataset(files)``)."""
    cycle_length: int = DEFAULT_CYCLE_LENGTH
    """Files read concurrently when ``parallel_interleave`` is on."""
    record_prefetch: bool = True
    """Prefetch about one mini-batch of raw records after reading: the readers run ahead of
    the decoders instead of in lock-step with them."""
    parallel_map: bool = True
    """Parse + decode + preprocess with ``num_parallel_calls`` (off: one image at a time,
    and TF's automatic map parallelisation is switched off as well)."""
    num_parallel_calls: int = AUTOTUNE
    """Parallel calls of the map when ``parallel_map`` is on (``AUTOTUNE`` = let tf.data pick,
    up to the number of cores)."""
    vectorized_map: bool = False
    """Batch the raw records first, then parse + decode + preprocess whole batches
    (:func:`preprocess_batch`). An alternative to the default map-then-batch (which tf.data
    fuses into one ``map_and_batch`` step, the TF1 recipe), not part of the new approach."""
    final_prefetch: bool = True
    """End with ``prefetch(AUTOTUNE)``: ready batches wait for the accelerator, and tf.data
    sizes the buffer (off: ``prefetch(batch_size)``, the old approach's mistake)."""
    deterministic: bool = False
    """Keep the order of elements through parallel steps. ``False`` lets a fast element
    overtake a slow one (a small PNG decoded in parallel with a large one), so one slow
    image does not stall the batch. Only matters when something runs in parallel."""

    @classmethod
    def old_equivalent(cls) -> PipelineOptions:
        """Every change off: :func:`new_approach` then behaves like :func:`old_approach`."""
        return cls(shard_files_first=False, shuffle_files=False, parallel_interleave=False,
                   record_prefetch=False, parallel_map=False, vectorized_map=False,
                   final_prefetch=False, deterministic=True)

    def describe(self) -> dict[str, Any]:
        """The switches as a plain dict (for tables and JSON)."""
        return asdict(self)


def ablation_steps(include_vectorized: bool = False) -> list[tuple[str, PipelineOptions]]:
    """From the old approach to the new one, one change per step: ``[(label, options), ...]``.

    Step 0 is :meth:`PipelineOptions.old_equivalent`; each later step switches on one more
    change; the last (without ``include_vectorized``) equals ``PipelineOptions()``, the full
    new approach. ``include_vectorized=True`` appends the batch-then-vectorised-map variant
    as an extra step. The order follows the articles' recipe: first stop decoding other
    workers' images, then read in parallel, then decode in parallel, then overlap.
    """
    o = PipelineOptions.old_equivalent()
    steps: list[tuple[str, PipelineOptions]] = [("old-equivalent", o)]
    changes: list[tuple[str, dict[str, Any]]] = [
        ("+ shard file names first", {"shard_files_first": True}),
        ("+ shuffle file names", {"shuffle_files": True}),
        ("+ parallel interleave", {"parallel_interleave": True}),
        ("+ prefetch records", {"record_prefetch": True}),
        ("+ parallel map", {"parallel_map": True}),
        ("+ prefetch(AUTOTUNE)", {"final_prefetch": True}),
        ("+ non-deterministic order (= new)", {"deterministic": False}),
    ]
    for label, change in changes:
        o = replace(o, **change)
        steps.append((label, o))
    assert steps[-1][1] == PipelineOptions(), "the last step must be the full new approach"
    if include_vectorized:
        steps.append(("+ batch, then vectorised map", replace(o, vectorized_map=True)))
    return steps


def new_approach(files: Files, batch_size: int, image_size: int, training: bool = True,
                 num_workers: int = 1, worker_index: int = 0,
                 options: PipelineOptions | None = None,
                 shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER, repeat: bool | None = None,
                 seed: int | None = None, with_names: bool = False,
                 antialias: bool = False) -> tf.data.Dataset:
    """The "new approach" (TensorFlow official ResNet ``input_fn``), in TF2 idioms.

    With the default :class:`PipelineOptions`::

        Dataset.from_tensor_slices(files)      # 1. the file names, not their contents
        .shard(num_workers, worker_index)      # 2. FIRST: each worker keeps its own files
        .shuffle(len(files))                   # 3. new file order every epoch (training)
        .interleave(TFRecordDataset,           # 4. read cycle_length files at once
                    cycle_length, num_parallel_calls=AUTOTUNE, deterministic=False)
        .prefetch(batch_size)                  # 5. about one mini-batch of raw records
        .shuffle(shuffle_buffer)               # 6. shuffle cheap *encoded* records (training)
        .repeat()                              # 7. (training)
        .map(parse + preprocess,               # 8. decode on every core ...
             num_parallel_calls=AUTOTUNE, deterministic=False)
        .batch(batch_size, drop_remainder=training)  # ... tf.data fuses 8+9 (map_and_batch)
        .prefetch(AUTOTUNE)                    # 10. ready batches wait for the accelerator

    Why each step: (2) a worker never touches another worker's data, so N workers do N times
    the work in the same time; (3)+(6) two-level shuffling gives a good mix while the buffer
    only holds compressed bytes; (4)+(5) several readers hide storage latency; (8) decoding -
    the expensive part - uses all cores; (10) the CPU prepares batch N+1 while the accelerator
    computes batch N, so a step costs max(CPU, accelerator) instead of their sum.

    Arguments
    ---------
    files
        Shard files of one split (e.g. ``tfrecords.list_shards(dir, "train")``). File-level
        sharding needs at least ``num_workers`` of them (``ValueError`` otherwise); for an
        even load use many more shards than workers (a multiple of ``num_workers``).
    batch_size, image_size
        Per-worker batch size; side of the square model input.
    training
        ``True``: shuffle files and records, random flips, repeat, drop the last partial
        batch (every step has the same shape, and under Horovod every worker the same number
        of steps). ``False``: none of that; every example exactly once per worker, the last
        partial batch kept.
    num_workers, worker_index
        ``hvd.size()`` and ``hvd.rank()`` under Horovod.
    options
        :class:`PipelineOptions` (default: all changes on).
    shuffle_buffer
        Records in the record shuffle buffer (training only).
    repeat
        Repeat forever; ``None`` (default) means ``training``.
    seed
        Seed of the shuffles and the flips (``None``: different every run).
    with_names
        Also yield the image names (``(image, label, name)``).
    antialias
        Antialiased resize (see :func:`decode_resize`).

    Correctness notes: with ``shard_files_first=False`` the records are sharded after
    decoding, like the old approach. A record-level ``shard`` is a partition only if every
    worker sees the records in the *same* order, so in that mode everything upstream of the
    shard runs deterministically, and the file shuffle (if on) uses a seed all workers share
    (``seed``, or 0 when ``seed`` is None and ``num_workers > 1``).
    """
    import tensorflow as tf

    o = options or PipelineOptions()
    names = _check_common(files, batch_size, image_size, num_workers, worker_index)
    repeat = training if repeat is None else repeat
    if o.shard_files_first and len(names) < num_workers:
        raise ValueError(
            f"{len(names)} TFRecord file(s) cannot be sharded over {num_workers} workers: each "
            f"worker needs at least one file. Convert with more shards (e.g. `python -m "
            f"chexnet_utils tfrecords --shard-size N` with a smaller N; ideally a multiple of "
            f"{num_workers} shards), or use fewer workers.")
    if o.cycle_length < 1:
        raise ValueError(f"cycle_length must be >= 1, got {o.cycle_length}")

    # Upstream of a record-level shard every worker must see the same order.
    upstream_deterministic = o.deterministic or not o.shard_files_first
    fn = example_fn(image_size, training, seed, with_names, antialias,
                     batched=o.vectorized_map)
    map_calls = o.num_parallel_calls if o.parallel_map else None

    # 1.-3. file names
    ds = tf.data.Dataset.from_tensor_slices(names)
    if o.shard_files_first:
        ds = ds.shard(num_workers, worker_index)
    if training and o.shuffle_files:
        file_seed = seed
        if not o.shard_files_first and num_workers > 1 and file_seed is None:
            file_seed = 0  # all workers must agree on the file order before a record shard
        ds = ds.shuffle(len(names), seed=file_seed, reshuffle_each_iteration=True)

    # 4.-5. records
    if o.parallel_interleave:
        ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=o.cycle_length,
                           block_length=1, num_parallel_calls=tf.data.AUTOTUNE,
                           deterministic=upstream_deterministic)
    else:
        ds = ds.flat_map(tf.data.TFRecordDataset)  # = TFRecordDataset(files): one by one
    if o.record_prefetch:
        ds = ds.prefetch(batch_size)

    if o.shard_files_first:
        # 6.-9. shuffle and repeat the cheap records, then decode (and batch)
        if training:
            ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        if repeat:
            ds = ds.repeat()
        if o.vectorized_map:
            ds = ds.batch(batch_size, drop_remainder=training)
            ds = _map(ds, fn, map_calls, o.deterministic)
        else:
            ds = _map(ds, fn, map_calls, o.deterministic)
            ds = ds.batch(batch_size, drop_remainder=training)
    else:
        # the old order: decode everything, keep 1/N, shuffle decoded images, repeat, batch
        if o.vectorized_map:
            # Batch-decode in groups, unbatch for the record-level shard.
            ds = ds.batch(batch_size)
            ds = _map(ds, fn, map_calls, True)
            ds = ds.unbatch()
        else:
            ds = _map(ds, fn, map_calls, True)
        ds = ds.shard(num_workers, worker_index)
        if training:
            ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        if repeat:
            ds = ds.repeat()
        ds = ds.batch(batch_size)  # the old approach keeps the last partial batch

    # 10. overlap the CPU with the accelerator
    ds = ds.prefetch(tf.data.AUTOTUNE if o.final_prefetch else batch_size)
    return ds.with_options(_tf_options(parallel_map=o.parallel_map))


def build_pipeline(approach: str | PipelineOptions, files: Files, batch_size: int,
                   image_size: int, **kwargs: Any) -> tf.data.Dataset:
    """``"old"`` -> :func:`old_approach`; ``"new"`` or a :class:`PipelineOptions` ->
    :func:`new_approach` (with those options). ``kwargs`` go to the builder."""
    if isinstance(approach, PipelineOptions):
        return new_approach(files, batch_size, image_size, options=approach, **kwargs)
    if approach == "old":
        return old_approach(files, batch_size, image_size, **kwargs)
    if approach == "new":
        return new_approach(files, batch_size, image_size, **kwargs)
    raise ValueError(f"approach must be 'old', 'new' or a PipelineOptions, got {approach!r}")


# --------------------------------------------------------------------------------------------
# The last stage on a GPU: batches copied to the device ahead of time
# --------------------------------------------------------------------------------------------

def accelerator_device(gpus: Sequence[Any] | None = None) -> str | None:
    """Where :func:`to_accelerator` sends batches: ``"/gpu:0"`` when this process sees a GPU
    (after pinning by local rank it sees exactly one, as GPU 0), ``None`` on a CPU-only
    process. ``gpus`` defaults to TensorFlow's visible GPUs (tests pass a fake list)."""
    if gpus is None:
        from chexnet_utils.accelerator import process_gpus

        gpus = process_gpus()
    return "/gpu:0" if len(gpus) > 0 else None


def to_accelerator(ds: tf.data.Dataset, device: str | None,
                   buffer_size: int | None = 2) -> tf.data.Dataset:
    """End the pipeline by copying ready batches to ``device`` ahead of time.

    ``tf.data.experimental.prefetch_to_device(device, buffer_size)``: a background thread
    copies the next ``buffer_size`` batches into GPU memory while the GPU trains on the
    current one, so the host-to-device copy (over PCIe, about 19 MB per batch of 32 images
    of 224 px in float32) leaves the step's critical path. It must be the last
    transformation. ``device=None`` (no GPU, see :func:`accelerator_device`) returns ``ds``
    unchanged: on a CPU the batches already are where the model runs.
    """
    if device is None:
        return ds
    import tensorflow as tf

    return ds.apply(tf.data.experimental.prefetch_to_device(device, buffer_size))


def file_names(ds: tf.data.Dataset) -> list[str]:
    """The base names (no folder) of the paths a dataset of file names yields, in its order.

    For showing what a file-level ``shard`` or ``shuffle`` hands to a worker:
    ``file_names(names.shard(2, 0))``.
    """
    from pathlib import Path

    return [Path(n.decode() if isinstance(n, bytes) else str(n)).name
            for n in ds.as_numpy_iterator()]
