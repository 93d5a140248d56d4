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

Notebook 02 writes both pipelines in its own cells (with one switch per change of the new
approach, for its ablation) and checks that they deliver the same elements as these; these
are the copies the benchmarks (``python -m chexnet_utils bench pipelines``, ``make bench``),
the training code, notebook 04's scaling runs and the CLI (``--pipeline old|new``) use.

Element structure: batches of ``(image, label)`` with ``image`` float32
``[batch, S, S, 3]`` and ``label`` float32 ``[batch, 14]``; with ``with_names=True``
``(image, label, name)`` where ``name`` is the NIH image name (string ``[batch]``), which the
tests use to prove that both pipelines deliver the same examples.

Two TensorFlow defaults, and what the old approach does about them
------------------------------------------------------------------
TensorFlow 2.x rewrites every pipeline before it runs; two of its default rewrites
(``tf.data.experimental.OptimizationOptions``, TF 2.21: "If None, defaults to True") matter
here:

* ``map_parallelization`` turns a ``map`` without ``num_parallel_calls`` into a parallel map
  (``AUTOTUNE``) when the mapped function is stateless (grappler pass
  ``tensorflow/core/grappler/optimizers/data/map_parallelization.cc``). Decoding is
  stateless; the random flip is not, so in training mode TF leaves the old approach's map
  alone, but in evaluation mode it would run it on all cores. :func:`old_approach` therefore
  sets ``map_parallelization = False`` explicitly (``_old_approach_options``): its map is
  sequential in both modes, so the benchmarks time what one-core decoding costs. Notebook 02 shows
  the rule live (its "TF's defaults" cell).
* ``inject_prefetch`` appends ``prefetch(AUTOTUNE)`` when the last transformation is not a
  prefetch (``inject_prefetch.cc``). Both builders end in an explicit prefetch, so it never
  applies to them; :func:`chexnet_utils.bench.throughput.decode_ceiling` switches both
  rewrites off because it measures one core.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from os import PathLike
from typing import TYPE_CHECKING, Any, Literal

from chexnet_utils.data.labels import NUM_CLASSES
from chexnet_utils.platform.checks import require_at_least
from chexnet_utils.platform.lazy import lazy_module

if TYPE_CHECKING:  # TensorFlow is imported lazily: ``import chexnet_utils`` stays cheap.
    import tensorflow as tf

# TensorFlow: imported on first use (chexnet_utils.platform.lazy)
if not TYPE_CHECKING:
    tf = lazy_module("tensorflow")

__all__ = [
    "AUTOTUNE",
    "DEFAULT_CYCLE_LENGTH",
    "DEFAULT_SHUFFLE_BUFFER",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "PIPELINES",
    "Pipeline",
    "PipelineSpec",
    "build_pipeline",
    "decode_resize",
    "new_approach",
    "normalize",
    "old_approach",
    "preprocess",
    "preprocess_batch",
    "register_pipeline",
    "training_feed",
]

Pipeline = Literal["new", "old"]
"""The built-in input pipelines by name: the new or the old ``tf.data`` approach
(``TrainConfig.pipeline``, the engine timers' ``pipeline``). :data:`PIPELINES` holds these and
any registered later (:func:`register_pipeline`), which ``bench pipelines`` times too."""

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
    grey = tf.map_fn(lambda b: decode_resize(b, image_size, antialias), image_bytes,
                     fn_output_signature=tf.TensorSpec([image_size, image_size, 1], tf.float32))
    images = normalize(grey)
    if training:
        # On a 4-D tensor each image gets its own coin flip.
        images = tf.image.random_flip_left_right(images, seed=seed)
    labels = tf.ensure_shape(tf.cast(labels, tf.float32), [None, NUM_CLASSES])
    return images, labels


def example_fn(image_size: int, training: bool, seed: int | None, with_names: bool,
                antialias: bool, batched: bool) -> Callable[[Any], tuple[Any, ...]]:
    """The map function: serialized record(s) -> ``(image, label[, name])``."""
    from chexnet_utils.data.tfrecords import parse_example

    prep = preprocess_batch if batched else preprocess

    def fn(serialized: Any) -> tuple[Any, ...]:
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
                         "chexnet_utils.data.tfrecords.list_shards)")
    require_at_least(1, batch_size=batch_size, image_size=image_size, num_workers=num_workers)
    if not 0 <= worker_index < num_workers:
        raise ValueError(f"worker_index must be in [0, {num_workers}), got {worker_index}")
    return names


def _old_approach_options() -> tf.data.Options:
    """The ``tf.data.Options`` of :func:`old_approach`: TF's automatic map parallelisation
    off (it is on by default in TF 2.x and would parallelise the sequential map whenever the
    mapped function is stateless, i.e. in evaluation mode). Everything else stays TF's
    default; ``inject_prefetch`` has nothing to do (the pipeline ends in a prefetch)."""
    options = tf.data.Options()
    options.experimental_optimization.map_parallelization = False
    return options


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

    It ends with ``.with_options(_old_approach_options())``: TF's automatic
    ``map_parallelization`` off, so step 2 stays on one core in evaluation mode too (see the
    module docstring; in training mode the random flip already keeps TF from parallelising it).

    Arguments as :func:`new_approach`. ``repeat=None`` means repeat in training, not in
    evaluation. Evaluation (``training=False``) does not shuffle or flip and keeps the last
    partial batch. The order of examples is deterministic (everything is sequential).
    """
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
    return ds.with_options(_old_approach_options())  # keep step 2 on one core


# --------------------------------------------------------------------------------------------
# The new approach
# --------------------------------------------------------------------------------------------

def new_approach(files: Files, batch_size: int, image_size: int, training: bool = True,
                 num_workers: int = 1, worker_index: int = 0,
                 shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER, repeat: bool | None = None,
                 seed: int | None = None, with_names: bool = False,
                 antialias: bool = False) -> tf.data.Dataset:
    """The "new approach" (TensorFlow official ResNet ``input_fn``), in TF2 idioms::

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
    computes batch N, so a step costs max(CPU, accelerator) instead of their sum. Notebook 02
    builds it one change at a time (its ablation) and checks its own version against this one.

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
    """
    names = _check_common(files, batch_size, image_size, num_workers, worker_index)
    repeat = training if repeat is None else repeat
    if len(names) < num_workers:
        raise ValueError(
            f"{len(names)} TFRecord file(s) cannot be sharded over {num_workers} workers: each "
            f"worker needs at least one file. Convert with more shards (e.g. `python -m "
            f"chexnet_utils tfrecords --shard-size N` with a smaller N; ideally a multiple of "
            f"{num_workers} shards), or use fewer workers.")
    fn = example_fn(image_size, training, seed, with_names, antialias, batched=False)

    ds = tf.data.Dataset.from_tensor_slices(names)                          # 1.
    ds = ds.shard(num_workers, worker_index)                                # 2.
    if training:
        ds = ds.shuffle(len(names), seed=seed, reshuffle_each_iteration=True)  # 3.
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=DEFAULT_CYCLE_LENGTH,  # 4.
                       block_length=1, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    ds = ds.prefetch(batch_size)                                            # 5.
    if training:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)  # 6.
    if repeat:
        ds = ds.repeat()                                                    # 7.
    ds = ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)  # 8.
    ds = ds.batch(batch_size, drop_remainder=training)                      # 9.
    return ds.prefetch(tf.data.AUTOTUNE)                                    # 10.


@dataclass(frozen=True)
class PipelineSpec:
    """One input pipeline of the registry: its builder and what goes to the GPU."""

    name: str
    build: Callable[..., tf.data.Dataset]
    """``build(files, batch_size, image_size, training=..., seed=..., shuffle_buffer=...,
    num_workers=..., worker_index=..., ...)``, the arguments of :func:`new_approach`."""
    device_feed: bool = False
    """Training ends it with :func:`to_accelerator` when the device feed is on (batches
    copied to the GPU ahead of time); ``False``: batches stay in host memory."""


PIPELINES: dict[str, PipelineSpec] = {}
"""Every input pipeline by name, in registration order: ``"old"`` and ``"new"``, then any
added with :func:`register_pipeline` (``bench pipelines`` times each)."""


def register_pipeline(name: str, build: Callable[..., tf.data.Dataset], *,
                      device_feed: bool = False) -> PipelineSpec:
    """Add an input pipeline variant (one module that calls this is all a variant needs):
    ``bench pipelines`` times it beside the others and reports it under ``name``."""
    if not name or name in PIPELINES:
        raise ValueError(f"pipeline name {name!r} is empty or taken ({', '.join(PIPELINES)})")
    PIPELINES[name] = spec = PipelineSpec(name, build, device_feed)
    return spec


def pipeline_spec(name: str) -> PipelineSpec:
    """The registered pipeline ``name`` (``ValueError`` naming the registered ones)."""
    try:
        return PIPELINES[name]
    except KeyError:
        raise ValueError(f"pipeline must be one of {', '.join(map(repr, PIPELINES))}, "
                         f"got {name!r}") from None


def build_pipeline(approach: str, files: Files, batch_size: int, image_size: int,
                   **kwargs: Any) -> tf.data.Dataset:
    """The registered pipeline ``approach`` (``"old"``: :func:`old_approach`, ``"new"``:
    :func:`new_approach`, the CLI's ``--pipeline``); ``kwargs`` go to its builder."""
    return pipeline_spec(approach).build(files, batch_size, image_size, **kwargs)


def training_feed(approach: str, ds: tf.data.Dataset, device_feed: bool) -> tf.data.Dataset:
    """``ds`` as training takes it: pipelines registered with ``device_feed`` (the new one)
    end in :func:`to_accelerator` when the feed is on; the others are left as they are."""
    if not pipeline_spec(approach).device_feed:
        return ds
    return to_accelerator(ds, accelerator_device(device_feed))


# --------------------------------------------------------------------------------------------
# The last stage on a GPU: batches copied to the device ahead of time
# --------------------------------------------------------------------------------------------

def accelerator_device(device_feed: bool, gpus: Sequence[Any] | None = None) -> str | None:
    """Where :func:`to_accelerator` sends batches: ``None`` with the device feed off
    (:attr:`~chexnet_utils.model.accelerator.Switches.device_feed`), ``"/gpu:0"`` when this
    process sees a GPU (after pinning by local rank it sees exactly one, as GPU 0), and
    ``"/cpu:0"`` when the feed is forced on without a GPU (``CHEXNET_DEVICE_FEED=on``: the same
    ``prefetch_to_device`` stage, exercised on a CPU). ``gpus`` defaults to TensorFlow's
    visible GPUs (tests pass a fake list)."""
    if not device_feed:
        return None
    if gpus is None:
        from chexnet_utils.model.accelerator import process_gpus

        gpus = process_gpus()
    return "/gpu:0" if len(gpus) > 0 else "/cpu:0"


def to_accelerator(ds: tf.data.Dataset, device: str | None,
                   buffer_size: int | None = 2) -> tf.data.Dataset:
    """End the pipeline by copying ready batches to ``device`` ahead of time.

    ``tf.data.experimental.prefetch_to_device(device, buffer_size)``: a background thread
    copies the next ``buffer_size`` batches into GPU memory while the GPU trains on the
    current one, so the host-to-device copy (over PCIe, about 19 MB per batch of 32 images
    of 224 px in float32) leaves the step's critical path. It must be the last
    transformation. ``device=None`` (the feed off, see :func:`accelerator_device`) returns
    ``ds`` unchanged: on a CPU the batches already are where the model runs.
    """
    if device is None:
        return ds

    return ds.apply(tf.data.experimental.prefetch_to_device(device, buffer_size))


register_pipeline("old", old_approach)
register_pipeline("new", new_approach, device_feed=True)
