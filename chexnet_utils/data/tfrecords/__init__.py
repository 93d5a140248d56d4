"""Convert an NIH ChestX-ray14-style folder to sharded TFRecords, verify them, read them back.

Modules, one concern each (every public name is re-exported here):

- :mod:`~chexnet_utils.data.tfrecords.wire`: CRC-32C, TFRecord framing, ``tf.train.Example``
  messages from the ``protobuf`` package (no TensorFlow), :func:`parse_example` for
  ``tf.data``;
- :mod:`~chexnet_utils.data.tfrecords.images`: validate, convert to 8-bit grey, resize, encode;
  :func:`decode_image`;
- :mod:`~chexnet_utils.data.tfrecords.plan`: the shard plan (:func:`planned_shard_count`);
- :mod:`~chexnet_utils.data.tfrecords.convert`: the converter (:func:`convert_dataset`);
- :mod:`~chexnet_utils.data.tfrecords.verify`: folder layout, manifest, :func:`list_shards`,
  :func:`verify`.

Conversion throughput (``bench_conversion``) and the per-record decode time (``decode_ms``)
are measurements: :mod:`chexnet_utils.bench.conversion`.

Why TFRecords: 112,120 PNGs of ~400 KB each are read far faster as a few hundred large files
than as small ones, and the labels travel with the pixels. One conversion serves every later
training run.

Layout written to ``OUT_DIR``::

    OUT_DIR/
      train-00000-of-00296.tfrecord      # {split}-{i:05d}-of-{n:05d}.tfrecord
      ...
      val-00000-of-00040.tfrecord
      test-00000-of-00096.tfrecord
      manifest.json                      # parameters + one entry per shard (counts, sha256)
      skipped.json / skipped.txt         # images left out under on_error="skip" (may be empty)

Each record is a ``tf.train.Example`` with

=================  ==========  ====================================================
key                type        content
=================  ==========  ====================================================
``image/encoded``  bytes       the PNG or JPEG file
``image/format``   bytes       ``b"png"`` or ``b"jpeg"``
``image/height``   int64       height of the stored image in pixels
``image/width``    int64       width of the stored image in pixels
``label``          float x 14  multi-hot, in :data:`chexnet_utils.data.labels.PATHOLOGIES` order
``image/name``     bytes       NIH image name, e.g. ``b"00000001_000.png"``
``patient_id``     int64       NIH patient id
=================  ==========  ====================================================

Decisions worth knowing
-----------------------
* **No TensorFlow in the converter.** ``import tensorflow`` costs seconds per process, so the
  worker processes write TFRecords with a small pure-Python writer (record = uint64 length,
  masked CRC-32C of the length, data, masked CRC-32C of the data) and build the Example with
  the ``protobuf`` package from TensorFlow's own ``example.proto`` schema
  (:func:`encode_example`: the same bytes as ``tf.train.Example.SerializeToString``).
  CRC-32C comes from the pinned ``google-crc32c`` package (C). TensorFlow is imported only by
  :func:`parse_example` / :func:`decode_image` and the :data:`FEATURE_SPEC` constant.
* **Deterministic.** Records keep CSV order within each split part
  (:meth:`NIHDataset.split`), go to shards in contiguous blocks, and the shard plan never
  depends on the number of workers, so two conversions with the same parameters give
  byte-identical shards.
* **Shard sizing.** The default plan (``shard_mb=100``) and any explicit ``shard_mb=M``
  compute each split's shard count up front from an estimate of its size (source file sizes
  times the resize area ratio, plus record overhead), then round it *up* to a multiple of
  :data:`SHARD_MULTIPLE` (8), with at least 8 shards for every split of 8 or more images and
  one shard per image for a smaller split (:func:`planned_shard_count`); the images are spread
  evenly (shard sizes differ by at most one image). Why: file-level sharding
  (:func:`chexnet_utils.input.pipelines.new_approach`) needs at least one file per worker, and
  gives every worker the same amount of data only when the worker count divides the shard count, so
  every split works over 1, 2, 4 and 8 workers out of the box, whatever its size, and the
  plan never depends on the worker count. Rounding up only makes shards smaller, so ``M`` stays
  an upper bound (unless a single image is bigger than ``M``). On NIH ChestX-ray14 (112,120
  images, ~42 GB) the 100 MB default gives a few hundred ~100 MB train shards, a multiple of
  8. ``shard_size=N`` is the exact alternative: shards of N images and a final partial shard
  (the remainder is written, not dropped), with no rounding - the user's count wins.
* **Fastest path.** Without resizing, with ``encoding="png"``, an 8-bit greyscale PNG source
  (what NIH ships) is stored byte for byte; everything else is decoded, converted to 8-bit grey
  (16-bit scaled linearly 0..65535 -> 0..255, RGB/RGBA by luma with alpha dropped), resized
  with an area (box) filter to ``image_size`` x ``image_size`` when asked, and re-encoded.
* **Bad input.** ``on_error="fail"`` stops at the first missing, truncated or unreadable image
  with a :class:`ConversionError` naming the file and the reason. ``on_error="skip"`` first
  validates every image (header, chunk CRCs, full decode) in parallel, leaves the bad ones out,
  lists them in ``skipped.json`` / ``skipped.txt`` and only then assigns shards, so the
  assignment stays deterministic. A malformed ``Data_Entry_2017.csv`` (unknown label, bad row)
  is always fatal: :class:`chexnet_utils.data.nih.DataFormatError` names the file and row, under
  either policy, since no label in that file can then be trusted.
* **Resumable.** Shards are written to ``NAME.tmp-PID``, fsynced and renamed; the manifest is
  rewritten atomically after every finished shard. A rerun with the same parameters keeps every
  shard whose file still has the sha256 recorded for the same planned content and writes the
  rest; a rerun with different parameters is refused unless ``overwrite=True`` (so is a
  folder converted with the size-based plan of a version before the multiple-of-8 rule; the
  message says so).
"""

from __future__ import annotations

from typing import Any

from chexnet_utils.data.tfrecords.convert import ConversionResult, convert_dataset
from chexnet_utils.data.tfrecords.images import (
    PNG_COMPRESS_LEVEL,
    decode_image,
    prepare_image,
    to_grey8,
)
from chexnet_utils.data.tfrecords.plan import (
    DEFAULT_SHARD_MB,
    SHARD_MULTIPLE,
    planned_shard_count,
    shard_name,
    shard_workers_note,
)
from chexnet_utils.data.tfrecords.verify import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    SKIPPED_JSON,
    SKIPPED_TXT,
    SPLITS,
    ConversionError,
    VerifyReport,
    list_shards,
    load_manifest,
    verify,
)
from chexnet_utils.data.tfrecords.wire import (
    CRC32C_IMPLEMENTATION,
    crc32c,
    decode_example,
    encode_example,
    feature_spec,
    frame_record,
    make_example,
    masked_crc32c,
    parse_example,
    read_examples,
    read_records,
)

__all__ = [
    "CRC32C_IMPLEMENTATION",
    "DEFAULT_SHARD_MB",
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "PNG_COMPRESS_LEVEL",
    "SHARD_MULTIPLE",
    "SKIPPED_JSON",
    "SKIPPED_TXT",
    "SPLITS",
    "ConversionError",
    "ConversionResult",
    "VerifyReport",
    "convert_dataset",
    "crc32c",
    "decode_example",
    "decode_image",
    "encode_example",
    "feature_spec",
    "frame_record",
    "list_shards",
    "load_manifest",
    "make_example",
    "masked_crc32c",
    "parse_example",
    "planned_shard_count",
    "prepare_image",
    "read_examples",
    "read_records",
    "shard_name",
    "shard_workers_note",
    "to_grey8",
    "verify",
]


def __getattr__(name: str) -> Any:
    # FEATURE_SPEC is a constant that only imports TensorFlow when first used.
    if name == "FEATURE_SPEC":
        return feature_spec()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
