"""The TFRecord wire format: CRC-32C, record framing, and ``tf.train.Example`` encoded and
decoded by hand.

Why by hand: ``import tensorflow`` costs seconds per process, and the converter's worker
processes only need to write bytes. A record is a uint64 length, the masked CRC-32C of the
length, the data and the masked CRC-32C of the data; the Example protobuf is written field by
field (:func:`encode_example`), wire-compatible with ``example.proto`` (the tests parse it with
``tf.train.Example`` and read the files with ``tf.data.TFRecordDataset``). CRC-32C comes from
the pinned ``google-crc32c`` package (C). TensorFlow is imported only by
:func:`parse_example` and :func:`feature_spec` (and the lazy ``FEATURE_SPEC`` constant).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import google_crc32c  # type: ignore[import-not-found]
import numpy as np

from chexnet_utils.labels import NUM_CLASSES

__all__ = [
    "CRC32C_IMPLEMENTATION",
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
    "write_records",
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


def write_records(path: Path | str, records: Iterable[bytes]) -> str:
    """Write records to ``path`` (not atomically); returns the sha256 of the file."""
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for data in records:
            chunk = frame_record(data)
            digest.update(chunk)
            f.write(chunk)
    return digest.hexdigest()


def read_records(path: Path | str, check_crc: bool = True) -> Iterator[bytes]:
    """Yield the records of a TFRecord file (uncompressed), checking both CRCs.

    Raises :class:`ValueError` naming the file and the byte offset on a truncated record or
    a CRC mismatch.
    """
    path = Path(path)
    with path.open("rb") as f:
        offset = 0
        while True:
            header = f.read(12)
            if not header:
                return
            if len(header) < 12:
                raise ValueError(f"{path}: truncated record header at byte {offset}")
            (length,) = struct.unpack("<Q", header[:8])
            (len_crc,) = struct.unpack("<I", header[8:])
            if check_crc and len_crc != masked_crc32c(header[:8]):
                raise ValueError(f"{path}: corrupt record length at byte {offset}")
            data = f.read(length)
            footer = f.read(4)
            if len(data) < length or len(footer) < 4:
                raise ValueError(f"{path}: truncated record at byte {offset}")
            if check_crc and struct.unpack("<I", footer)[0] != masked_crc32c(data):
                raise ValueError(f"{path}: data CRC mismatch in record at byte {offset}")
            offset += 16 + length
            yield data


# --------------------------------------------------------------------------------------------
# tf.train.Example, encoded and decoded by hand (wire-compatible with example.proto)
# --------------------------------------------------------------------------------------------

def _varint(n: int) -> bytes:
    n &= 0xFFFFFFFFFFFFFFFF  # int64 two's complement, as protobuf writes negative int64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


def _bytes_feature(values: Sequence[bytes]) -> bytes:
    return _field(1, b"".join(_field(1, v) for v in values))      # Feature.bytes_list


def _float_feature(values: Sequence[float]) -> bytes:
    packed = struct.pack(f"<{len(values)}f", *values)
    return _field(2, _field(1, packed) if values else b"")        # Feature.float_list


def _int64_feature(values: Sequence[int]) -> bytes:
    packed = b"".join(_varint(int(v)) for v in values)
    return _field(3, _field(1, packed) if values else b"")        # Feature.int64_list


def encode_example(features: dict[str, tuple[str, Sequence[Any]]]) -> bytes:
    """Serialize a ``tf.train.Example``: ``{key: ("bytes"|"float"|"int64", values)}``.

    Keys are written in sorted order, so equal inputs give equal bytes.
    """
    enc = {"bytes": _bytes_feature, "float": _float_feature, "int64": _int64_feature}
    entries = []
    for key in sorted(features):
        kind, values = features[key]
        entries.append(_field(1, _field(1, key.encode("utf-8")) + _field(2, enc[kind](values))))
    return _field(1, b"".join(entries))                               # Example.features


def make_example(image: bytes, image_format: str, height: int, width: int,
                 label: Sequence[float], name: str, patient_id: int) -> bytes:
    """The Example this module stores for one image (see :mod:`chexnet_utils.tfrecords`)."""
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


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) for each field of a message; value is bytes for
    wire type 2, int for 0, raw 4/8 bytes for 5/1."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 2:
            length, pos = _read_varint(buf, pos)
            if pos + length > end:
                raise ValueError("truncated length-delimited field")
            value, pos = buf[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


def _signed64(n: int) -> int:
    return n - (1 << 64) if n >= 1 << 63 else n


def decode_example(data: bytes) -> dict[str, list[Any]]:
    """Parse a serialized ``tf.train.Example`` without TensorFlow: ``{key: [values]}``."""
    out: dict[str, list[Any]] = {}
    for number, wire, features in _fields(data):
        if number != 1 or wire != 2:
            continue
        for fnum, fwire, entry in _fields(features):
            if fnum != 1 or fwire != 2:
                continue
            key, feature = "", b""
            for enum, _, value in _fields(entry):
                if enum == 1:
                    key = bytes(value).decode("utf-8")
                elif enum == 2:
                    feature = value
            values: list[Any] = []
            for kind, _, lst in _fields(feature):
                for vnum, vwire, v in _fields(lst):
                    if vnum != 1:
                        continue
                    if kind == 1:
                        values.append(bytes(v))
                    elif kind == 2:
                        values.extend(struct.unpack(f"<{len(v) // 4}f", v))
                    elif kind == 3 and vwire == 2:
                        pos = 0
                        while pos < len(v):
                            n, pos = _read_varint(v, pos)
                            values.append(_signed64(n))
                    elif kind == 3:
                        values.append(_signed64(v))
            out[key] = values
    return out


def read_examples(path: Path | str) -> Iterator[dict[str, Any]]:
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
        import tensorflow as tf

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


def __getattr__(name: str) -> Any:
    # FEATURE_SPEC is a module constant that only imports TensorFlow when first used.
    if name == "FEATURE_SPEC":
        return feature_spec()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def parse_example(serialized: Any) -> dict[str, Any]:
    """Parse serialized Examples (a scalar string or a batch) without decoding the image.

    Returns tensors ``image_bytes`` (string), ``label`` (float32 [..., 14]), ``name``
    (string), ``patient_id``, ``height``, ``width`` (int64) and ``format`` (string); with a
    batch every one gains a leading batch dimension (``tf.io.parse_example`` semantics).
    """
    import tensorflow as tf

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
