"""The TFRecord wire format: CRC-32C, record framing, and ``tf.train.Example`` as real
protobuf messages, without TensorFlow.

Why no TensorFlow: ``import tensorflow`` costs seconds and hundreds of MB per process, and
the converter's worker processes only need to write bytes. A record is a uint64 length, the
masked CRC-32C of the length, the data and the masked CRC-32C of the data (CRC-32C from the
pinned ``google-crc32c`` package, C). The Example itself is written and read by the
``protobuf`` package (a TensorFlow dependency, cheap to import): :data:`Example`,
:data:`Features`, :data:`Feature`, :data:`BytesList`, :data:`FloatList` and :data:`Int64List`
are the messages of TensorFlow's ``example.proto`` / ``feature.proto``, built from a
descriptor in a pool of this module's own, so ``Example(...).SerializeToString(
deterministic=True)`` gives the bytes ``tf.train.Example`` gives (the tests check that, and
read the files with ``tf.data.TFRecordDataset``). TensorFlow is imported only by
:func:`parse_example` and :func:`feature_spec` (the package's lazy ``FEATURE_SPEC`` constant).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from chexnet_utils.data.labels import NUM_CLASSES
from chexnet_utils.platform.lazy import lazy_module

# TensorFlow: imported on first use (chexnet_utils.platform.lazy)
tf = lazy_module("tensorflow")

__all__ = [
    "CRC32C_IMPLEMENTATION",
    "BytesList",
    "ShardFramingError",
    "Example",
    "Feature",
    "Features",
    "FloatList",
    "Int64List",
    "check_framing",
    "crc32c",
    "decode_example",
    "encode_example",
    "feature_spec",
    "frame_record",
    "make_example",
    "masked_crc32c",
    "parse_example",
    "read_examples",
    "read_records",
]

# --------------------------------------------------------------------------------------------
# CRC-32C (Castagnoli), as TFRecord framing needs it
# --------------------------------------------------------------------------------------------

crc32c = google_crc32c.value
"""``crc32c(data) -> int``: CRC-32C of ``data`` (``google_crc32c.value``)."""
CRC32C_IMPLEMENTATION = "google_crc32c"
"""Which implementation backs :func:`crc32c` (recorded in the manifest)."""


def masked_crc32c(data: bytes) -> int:
    """The CRC-32C masking TFRecord uses: rotate right by 15 and add a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# --------------------------------------------------------------------------------------------
# TFRecord framing
# --------------------------------------------------------------------------------------------

def frame_record(data: bytes) -> bytes:
    """One TFRecord: length, masked CRC of the length, data, masked CRC of the data."""
    header = struct.pack("<Q", len(data))
    return b"".join((header, struct.pack("<I", masked_crc32c(header)), data,
                     struct.pack("<I", masked_crc32c(data))))



class ShardFramingError(ValueError):
    """A TFRecord file whose framing is broken (a truncated record, a corrupt length, a
    length longer than the file): the message names the file and the byte offset."""


def _record_length(header: bytes, path: Path, offset: int, size: int, check_crc: bool) -> int:
    """The data length a 12-byte record header announces, checked: its masked CRC, and that
    the record (length + 16 bytes of framing) fits in the ``size - offset`` bytes left."""
    if len(header) < 12:
        raise ShardFramingError(f"{path}: truncated record header at byte {offset}")
    (length,) = struct.unpack("<Q", header[:8])
    (len_crc,) = struct.unpack("<I", header[8:])
    if check_crc and len_crc != masked_crc32c(header[:8]):
        raise ShardFramingError(f"{path}: corrupt record length at byte {offset}")
    if length > size - offset - 16:
        raise ShardFramingError(f"{path}: truncated record at byte {offset} (its length field "
                                f"says {length} bytes, the file has "
                                f"{max(0, size - offset - 16)} left)")
    return length


def read_records(path: str | os.PathLike[str], check_crc: bool = True) -> Iterator[bytes]:
    """Yield the records of a TFRecord file (uncompressed), checking both CRCs.

    Raises :class:`ShardFramingError` (a ``ValueError``) naming the file and the byte offset on
    a truncated record, a CRC mismatch, or a length longer than what is left of the file
    (checked before anything is read into memory: a crafted length cannot ask for more than
    the file holds).
    """
    path = Path(path)
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        offset = 0
        while True:
            header = f.read(12)
            if not header:
                return
            length = _record_length(header, path, offset, size, check_crc)
            data = f.read(length)
            footer = f.read(4)
            if len(data) < length or len(footer) < 4:
                raise ShardFramingError(f"{path}: truncated record at byte {offset}")
            if check_crc and struct.unpack("<I", footer)[0] != masked_crc32c(data):
                raise ShardFramingError(f"{path}: data CRC mismatch in record at byte {offset}")
            offset += 16 + length
            yield data


def check_framing(path: str | os.PathLike[str]) -> int:
    """Walk a TFRecord file's record headers without reading the data; the record count.

    Each length must carry its masked CRC and fit in the bytes left of the file. TensorFlow's
    reader trusts the length field: ``tf.data.TFRecordDataset`` on a shard whose first length
    is 2**62 with a valid CRC kills the process with signal 11 (TensorFlow 2.21, measured), a
    notebook's kernel or a whole MPI job with no message. Every pipeline's file list passes
    through here first (:func:`chexnet_utils.data.tfrecords.verify.list_shards`): 12 bytes
    read per record, milliseconds for a shard. Raises :class:`ShardFramingError` naming the
    file and the byte offset; the data CRCs are :func:`read_records`' (``verify``).
    """
    path = Path(path)
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        offset = count = 0
        while offset < size:
            f.seek(offset)
            offset += 16 + _record_length(f.read(12), path, offset, size, check_crc=True)
            count += 1
    return count


# --------------------------------------------------------------------------------------------
# tf.train.Example: the real protobuf messages, without TensorFlow
# --------------------------------------------------------------------------------------------

def _example_messages() -> dict[str, Any]:
    """The message classes of TensorFlow's ``example.proto`` + ``feature.proto`` (package
    ``tensorflow``), from a descriptor written out here, in a pool of our own, so they never
    clash with TensorFlow's ``tensorflow.Example`` in the default pool."""
    F = descriptor_pb2.FieldDescriptorProto
    opt, rep, msg = F.LABEL_OPTIONAL, F.LABEL_REPEATED, F.TYPE_MESSAGE
    file = descriptor_pb2.FileDescriptorProto(
        name="chexnet_utils/data/tfrecords/example.proto", package="tensorflow", syntax="proto3")
    kinds = (("bytes", F.TYPE_BYTES), ("float", F.TYPE_FLOAT), ("int64", F.TYPE_INT64))
    for kind, ftype in kinds:  # message BytesList { repeated bytes value = 1; } ...
        value = file.message_type.add(name=f"{kind.capitalize()}List").field.add(
            name="value", number=1, type=ftype, label=rep)
        if ftype != F.TYPE_BYTES:
            value.options.packed = True
    feature = file.message_type.add(name="Feature")  # oneof kind { BytesList bytes_list = 1; ...
    feature.oneof_decl.add(name="kind")
    for number, (kind, _) in enumerate(kinds, 1):
        feature.field.add(name=f"{kind}_list", number=number, type=msg, label=opt,
                          type_name=f".tensorflow.{kind.capitalize()}List", oneof_index=0)
    features = file.message_type.add(name="Features")  # map<string, Feature> feature = 1;
    features.field.add(name="feature", number=1, type=msg, label=rep,
                       type_name=".tensorflow.Features.FeatureEntry")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=opt)
    entry.field.add(name="value", number=2, type=msg, label=opt, type_name=".tensorflow.Feature")
    file.message_type.add(name="Example").field.add(  # Features features = 1;
        name="features", number=1, type=msg, label=opt, type_name=".tensorflow.Features")

    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    names = ("Example", "Features", "Feature", "BytesList", "FloatList", "Int64List")
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tensorflow.{n}"))
            for n in names}   # GetMessageClass: protobuf >= 4.21 (pinned in requirements)


_MESSAGES = _example_messages()
Example = _MESSAGES["Example"]
"""``tf.train.Example`` without TensorFlow (same fields, same bytes)."""
Features, Feature = _MESSAGES["Features"], _MESSAGES["Feature"]
BytesList, FloatList, Int64List = (_MESSAGES["BytesList"], _MESSAGES["FloatList"],
                                   _MESSAGES["Int64List"])


def encode_example(features: dict[str, tuple[str, Sequence[Any]]]) -> bytes:
    """Serialize a ``tf.train.Example``: ``{key: ("bytes"|"float"|"int64", values)}``.

    Deterministic serialization (map keys sorted), so equal inputs give equal bytes.
    """
    example = Example()
    feature_map = example.features.feature
    for key, (kind, values) in features.items():
        if kind not in ("bytes", "float", "int64"):
            raise ValueError(f"feature {key!r}: unknown kind {kind!r}")
        lst = getattr(feature_map[key], f"{kind}_list")
        lst.SetInParent()  # an empty list is still this kind
        lst.value.extend(values)
    return example.SerializeToString(deterministic=True)


def make_example(image: bytes, image_format: str, height: int, width: int,
                 label: Sequence[float], name: str, patient_id: int) -> bytes:
    """The Example this module stores for one image (see :mod:`chexnet_utils.data.tfrecords`):
    what ``tf.train.Example(...).SerializeToString(deterministic=True)`` gives."""
    if len(label) != NUM_CLASSES:
        raise ValueError(f"label must have {NUM_CLASSES} values, got {len(label)}")
    return encode_example({
        "image/encoded": ("bytes", [image]),
        "image/format": ("bytes", [image_format.encode("ascii")]),
        "image/height": ("int64", [height]),
        "image/width": ("int64", [width]),
        "label": ("float", [float(x) for x in label]),
        "image/name": ("bytes", [name.encode("utf-8")]),
        "patient_id": ("int64", [patient_id]),
    })


def decode_example(data: bytes) -> dict[str, list[Any]]:
    """Parse a serialized ``tf.train.Example`` without TensorFlow: ``{key: [values]}``.

    Raises :class:`ValueError` (from protobuf's ``DecodeError``) on malformed bytes.
    """
    try:
        example = Example.FromString(data)
    except DecodeError as e:
        raise ValueError(f"not a serialized tf.train.Example ({len(data)} bytes): {e}") from e
    out: dict[str, list[Any]] = {}
    feature_map = example.features.feature
    for key in sorted(feature_map):  # sorted, as deterministic serialization writes them
        feature = feature_map[key]
        kind = feature.WhichOneof("kind")
        out[key] = list(getattr(feature, kind).value) if kind else []
    return out


def read_examples(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Decoded records of one shard without TensorFlow: ``name``, ``label`` (float32 [14]),
    ``patient_id``, ``height``, ``width``, ``format``, ``image_bytes``."""
    for data in read_records(path):
        ex = decode_example(data)
        yield {
            "name": ex["image/name"][0].decode("utf-8"),
            "label": np.asarray(ex["label"], dtype=np.float32),
            "patient_id": int(ex["patient_id"][0]),
            "height": int(ex["image/height"][0]),
            "width": int(ex["image/width"][0]),
            "format": ex["image/format"][0].decode("ascii"),
            "image_bytes": ex["image/encoded"][0],
        }


# --------------------------------------------------------------------------------------------
# TensorFlow side (imported lazily): the parser the tf.data pipelines use
# --------------------------------------------------------------------------------------------

_FEATURE_SPEC: dict[str, Any] | None = None


def feature_spec() -> dict[str, Any]:
    """The ``tf.io.parse_example`` spec of the stored Example (imports TensorFlow)."""
    global _FEATURE_SPEC
    if _FEATURE_SPEC is None:
        _FEATURE_SPEC = {
            "image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/format": tf.io.FixedLenFeature([], tf.string),
            "image/height": tf.io.FixedLenFeature([], tf.int64),
            "image/width": tf.io.FixedLenFeature([], tf.int64),
            "label": tf.io.FixedLenFeature([NUM_CLASSES], tf.float32),
            "image/name": tf.io.FixedLenFeature([], tf.string),
            "patient_id": tf.io.FixedLenFeature([], tf.int64),
        }
    return _FEATURE_SPEC


def parse_example(serialized: Any) -> dict[str, Any]:
    """Parse serialized Examples (a scalar string or a batch) without decoding the image.

    Returns tensors ``image_bytes`` (string), ``label`` (float32 [..., 14]), ``name``
    (string), ``patient_id``, ``height``, ``width`` (int64) and ``format`` (string); with a
    batch every one gains a leading batch dimension (``tf.io.parse_example`` semantics).
    """
    parsed = tf.io.parse_example(serialized, feature_spec())
    return {
        "image_bytes": parsed["image/encoded"],
        "label": parsed["label"],
        "name": parsed["image/name"],
        "patient_id": parsed["patient_id"],
        "height": parsed["image/height"],
        "width": parsed["image/width"],
        "format": parsed["image/format"],
    }
