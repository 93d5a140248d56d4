"""Convert an NIH ChestX-ray14-style folder to sharded TFRecords, verify them, read them back.

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
``label``          float x 14  multi-hot, in :data:`chexnet_utils.labels.PATHOLOGIES` order
``image/name``     bytes       NIH image name, e.g. ``b"00000001_000.png"``
``patient_id``     int64       NIH patient id
=================  ==========  ====================================================

Decisions worth knowing
-----------------------
* **No TensorFlow in the converter.** ``import tensorflow`` costs seconds per process, so the
  worker processes write TFRecords with a small pure-Python writer (record = uint64 length,
  masked CRC-32C of the length, data, masked CRC-32C of the data) and encode the Example
  protobuf by hand (:func:`encode_example`). CRC-32C comes from ``google-crc32c`` (C) when it is
  installed, else from the ``crc32c`` package, else from a vectorised numpy implementation
  here (~200 MB/s). TensorFlow is imported only by :func:`parse_example` / :func:`decode_image`
  and the :data:`FEATURE_SPEC` constant.
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
  (:func:`chexnet_utils.pipelines.new_approach`) needs at least one file per worker, and gives
  every worker the same amount of data only when the worker count divides the shard count, so
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
  is always fatal: :class:`chexnet_utils.nih.DataFormatError` names the file and row, under
  either policy, since no label in that file can then be trusted.
* **Resumable.** Shards are written to ``NAME.tmp-PID``, fsynced and renamed; the manifest is
  rewritten atomically after every finished shard. A rerun with the same parameters keeps every
  shard whose file still has the sha256 recorded for the same planned content and writes the
  rest; a rerun with different parameters is refused unless ``overwrite=True`` (so is a
  folder converted with the size-based plan of a version before the multiple-of-8 rule; the
  message says so).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from chexnet_utils.atomic import write_text_atomic
from chexnet_utils.labels import NUM_CLASSES, PATHOLOGIES
from chexnet_utils.nih import NIHDataset
from chexnet_utils.processes import worker_init

__all__ = [
    "CRC32C_IMPLEMENTATION",
    "MANIFEST_NAME",
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
    "list_shards",
    "load_manifest",
    "make_example",
    "masked_crc32c",
    "parse_example",
    "planned_shard_count",
    "read_examples",
    "read_records",
    "shard_name",
    "shard_workers_note",
    "verify",
    "write_records",
]

MANIFEST_NAME = "manifest.json"
SKIPPED_JSON = "skipped.json"
SKIPPED_TXT = "skipped.txt"
SPLITS: tuple[str, ...] = ("train", "val", "test")
FORMAT = "chexnet_utils.tfrecords"
FORMAT_VERSION = 1
DEFAULT_SHARD_MB = 100.0
"""Shard target when neither ``shard_size`` nor ``shard_mb`` is given (TF's usual advice)."""
SHARD_MULTIPLE = 8
"""Size-based plans give a split of >= 8 images a multiple of 8 shards (at least 8), so 1, 2,
4 and 8 workers all get equal numbers of files; see :func:`planned_shard_count`."""
PNG_COMPRESS_LEVEL = 1  # zlib level of re-encoded PNGs: 5x faster than 6, ~15% larger
_MB = 1_000_000
_RECORD_OVERHEAD = 16 + 200  # TFRecord framing + the other Example fields, roughly
_SHARD_RE = re.compile(r"^(?P<split>[A-Za-z0-9_]+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.tfrecord$")
_OUR_SHARD_RE = re.compile(r"^(train|val|test)-\d{5}-of-\d{5}\.tfrecord$")
_TMP_MARK = ".tmp-"


class ConversionError(RuntimeError):
    """An image (or the output folder) stops the conversion; names the file and the reason."""

    def __init__(self, path: Path | str | None, reason: str) -> None:
        super().__init__(f"{path}: {reason}" if path is not None else reason)
        self.path = None if path is None else str(path)
        self.reason = reason

    def __reduce__(self):  # type: ignore[no-untyped-def]  # picklable across processes
        return (self.__class__, (self.path, self.reason))


# --------------------------------------------------------------------------------------------
# CRC-32C (Castagnoli), as TFRecord framing needs it
# --------------------------------------------------------------------------------------------

_POLY = 0x82F63B78  # reflected Castagnoli polynomial


def _make_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _make_table()
_TABLE_NP = np.array(_TABLE, dtype=np.uint32)
_BYTE = np.arange(256, dtype=np.uint32)
_SHIFT_TABLES: dict[int, np.ndarray] = {}
_LANE = 64


def _crc32c_python(data: bytes) -> int:
    """Table-driven CRC-32C, one byte per step (fine for short inputs only)."""
    c = 0xFFFFFFFF
    t = _TABLE
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _apply_tables(tabs: np.ndarray, x: np.ndarray) -> np.ndarray:
    u8, u16, u24 = np.uint32(8), np.uint32(16), np.uint32(24)
    return (tabs[0][x & 0xFF] ^ tabs[1][(x >> u8) & 0xFF] ^ tabs[2][(x >> u16) & 0xFF]
            ^ tabs[3][x >> u24])


def _tables_from_columns(cols: np.ndarray) -> np.ndarray:
    """Byte-sliced lookup tables of the GF(2)-linear map whose bit-i image is ``cols[i]``."""
    tabs = np.zeros((4, 256), np.uint32)
    for j in range(4):
        for b in range(8):
            tabs[j] ^= np.where((_BYTE >> np.uint32(b)) & np.uint32(1), cols[8 * j + b],
                                np.uint32(0))
    return tabs


def _shift_tables(m: int) -> np.ndarray:
    """Tables of the map 'feed m zero bytes into a CRC register' (m a power of two)."""
    tabs = _SHIFT_TABLES.get(m)
    if tabs is None:
        if m == 1:
            cols = np.array([_TABLE[(1 << i) & 0xFF] ^ ((1 << i) >> 8) for i in range(32)],
                            dtype=np.uint32)
        else:
            half = _shift_tables(m // 2)
            basis = np.array([1 << i for i in range(32)], dtype=np.uint32)
            cols = _apply_tables(half, _apply_tables(half, basis))
        tabs = _SHIFT_TABLES[m] = _tables_from_columns(cols)
    return tabs


def _crc32c_numpy(data: bytes) -> int:
    """CRC-32C with numpy: many lanes at once, then lanes combined pairwise (linearity).

    The register is linear over GF(2): with initial value 0, leading zero bytes change
    nothing and crc(A + B) = shift_len(B)(crc(A)) xor crc(B). The standard initial value
    0xFFFFFFFF equals inverting the first four bytes and starting from 0.
    """
    n = len(data)
    if n < 4 * _LANE:
        return _crc32c_python(data)
    k = -(-n // _LANE)
    pad = k * _LANE - n
    buf = np.zeros(k * _LANE, dtype=np.uint8)
    buf[pad:] = np.frombuffer(data, dtype=np.uint8)
    buf[pad:pad + 4] ^= 0xFF
    cols = buf.reshape(k, _LANE).T.astype(np.uint32)
    reg = np.zeros(k, dtype=np.uint32)
    u8 = np.uint32(8)
    for j in range(_LANE):
        reg = _TABLE_NP[(reg ^ cols[j]) & 0xFF] ^ (reg >> u8)
    m = _LANE
    while len(reg) > 1:
        if len(reg) % 2:
            reg = np.concatenate([np.zeros(1, np.uint32), reg])
        reg = _apply_tables(_shift_tables(m), reg[0::2]) ^ reg[1::2]
        m *= 2
    return int(reg[0]) ^ 0xFFFFFFFF


def _pick_crc32c() -> tuple[Callable[[bytes], int], str]:
    check = b"123456789"  # the standard check value of CRC-32C is 0xE3069283
    try:
        import google_crc32c  # type: ignore[import-not-found]

        if getattr(google_crc32c, "implementation", "c") == "c" and \
                google_crc32c.value(check) == 0xE3069283:
            return google_crc32c.value, "google_crc32c"
    except Exception:  # noqa: BLE001 - any import or ABI problem: try the next one
        pass
    try:
        import crc32c as _crc32c_mod  # type: ignore[import-not-found]

        fn = getattr(_crc32c_mod, "crc32c", None) or getattr(_crc32c_mod, "crc32")
        if fn(check) == 0xE3069283:
            return fn, "crc32c"
    except Exception:  # noqa: BLE001
        pass
    return _crc32c_numpy, "numpy"


crc32c, CRC32C_IMPLEMENTATION = _pick_crc32c()
"""``crc32c(data) -> int``, and which implementation backs it."""


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
    """The Example this module stores for one image (see the module docstring)."""
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


def decode_image(image_bytes: Any, image_size: int | None = None) -> Any:
    """PNG/JPEG bytes -> float32 ``[H, W, 1]`` in [0, 1]; resized (bilinear, antialiased) to
    ``image_size`` x ``image_size`` when given. One image (map it over a dataset)."""
    import tensorflow as tf

    img = tf.io.decode_image(image_bytes, channels=1, dtype=tf.uint8, expand_animations=False)
    img = tf.cast(img, tf.float32) / 255.0
    if image_size is not None:
        img = tf.image.resize(img, [image_size, image_size], antialias=True)
        img = tf.clip_by_value(img, 0.0, 1.0)
        img = tf.ensure_shape(img, [image_size, image_size, 1])
    return img


# --------------------------------------------------------------------------------------------
# Images: validate, convert to 8-bit grey, resize, encode
# --------------------------------------------------------------------------------------------

def _is_grey8_png(data: bytes) -> bool:
    # PNG signature (8) + IHDR length/type (8) + width, height (8): bit depth, colour type.
    return (data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) > 25
            and data[24] == 8 and data[25] == 0)


def _open_checked(data: bytes) -> Image.Image:
    """Open and fully decode; for PNG also check every chunk CRC and the IEND chunk."""
    im = Image.open(io.BytesIO(data))
    if im.format == "PNG":
        im.verify()  # chunk CRCs up to IEND: catches a file cut after the pixel data
        im = Image.open(io.BytesIO(data))
    im.load()
    return im


def to_grey8(im: Image.Image) -> Image.Image:
    """8-bit greyscale: 16-bit scaled linearly (0..65535 -> 0..255), colour by luma, alpha
    dropped."""
    if im.mode == "L":
        return im
    if im.mode.startswith("I;16") or im.mode == "I":
        a = np.asarray(im).astype(np.int64)
        a = np.clip(a, 0, 65535)
        return Image.fromarray(((a * 255 + 32767) // 65535).astype(np.uint8), mode="L")
    if im.mode == "F":
        a = np.nan_to_num(np.asarray(im, dtype=np.float64))
        lo, hi = float(a.min()), float(a.max())
        scaled = (a - lo) / (hi - lo) * 255 if hi > lo else np.zeros_like(a)
        return Image.fromarray(np.round(scaled).astype(np.uint8), mode="L")
    if im.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        im = im.convert("RGB" if im.mode in ("RGBA", "RGBa", "PA") else "L")
    return im.convert("L")


def _encode(im: Image.Image, encoding: str, jpeg_quality: int) -> bytes:
    buf = io.BytesIO()
    if encoding == "png":
        im.save(buf, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
    else:
        im.save(buf, format="JPEG", quality=jpeg_quality)
    return buf.getvalue()


def prepare_image(data: bytes, image_size: int | None, encoding: str, jpeg_quality: int = 95,
                  validated: bool = False) -> tuple[bytes, int, int, bool]:
    """Source file bytes -> (stored bytes, height, width, passed_through).

    Raises PIL's exceptions (``OSError``, ``SyntaxError``, ``ValueError`` ...) for a bad
    image; the caller turns them into a :class:`ConversionError`.
    """
    if encoding == "png" and _is_grey8_png(data):
        width, height = struct.unpack(">II", data[16:24])
        if image_size is None or (width, height) == (image_size, image_size):
            if not validated:
                _open_checked(data)
            return data, height, width, True
    im = to_grey8(_open_checked(data))
    if image_size is not None and im.size != (image_size, image_size):
        shrink = image_size <= min(im.size)
        im = im.resize((image_size, image_size),
                       Image.Resampling.BOX if shrink else Image.Resampling.BILINEAR)
    return _encode(im, encoding, jpeg_quality), im.size[1], im.size[0], False


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, Image.UnidentifiedImageError):
        return "unreadable: not an image PIL can identify (corrupt or not a PNG)"
    if "truncat" in text.lower():
        return f"truncated: {text}"
    return f"corrupt: {type(exc).__name__}: {text}"


# --------------------------------------------------------------------------------------------
# Scanning (worker side)
# --------------------------------------------------------------------------------------------

def _scan_one(path: str | None, full: bool) -> dict[str, Any]:
    """Size and dimensions of one source image; ``full`` also decodes it completely."""
    if path is None:
        return {"ok": False, "reason": "missing: no such file under the data folder "
                                         "(images/ or images_NNN/images/)"}
    try:
        size = os.path.getsize(path)
        if full:
            with open(path, "rb") as f:
                data = f.read()
            im = _open_checked(data)
            to_grey8(im)
            width, height = im.size
        else:
            with Image.open(path) as im:
                width, height = im.size
    except FileNotFoundError:
        return {"ok": False, "reason": "missing: file disappeared"}
    except Exception as e:  # noqa: BLE001 - every decoder failure is a property of the file
        return {"ok": False, "reason": _describe(e)}
    return {"ok": True, "size": size, "width": width, "height": height}


def _scan_chunk(args: tuple[list[str | None], bool]) -> list[dict[str, Any]]:
    paths, full = args
    return [_scan_one(p, full) for p in paths]


# --------------------------------------------------------------------------------------------
# Writing one shard (worker side)
# --------------------------------------------------------------------------------------------

_PROGRESS: Any = None  # multiprocessing queue in worker processes, set by _init_worker


def _init_worker(queue: Any, parent: int | None = None) -> None:
    global _PROGRESS
    worker_init(parent)  # default SIGTERM, and die with the parent (chexnet_utils.processes)
    _PROGRESS = queue


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_shard(task: dict[str, Any], progress: Callable[[int], None] | None = None
                 ) -> dict[str, Any]:
    """Convert the images of one shard and write it atomically; returns its manifest entry.

    ``task['items']`` is a list of ``(name, path, label14, patient_id, source_size)``.
    """
    t0 = time.perf_counter()
    out_dir = Path(task["out_dir"])
    final = out_dir / task["file"]
    tmp = out_dir / f"{task['file']}{_TMP_MARK}{os.getpid()}"
    digest = hashlib.sha256()
    label_sums = np.zeros(NUM_CLASSES, dtype=np.int64)
    passthrough = 0
    nbytes = 0
    report = progress
    if report is None and _PROGRESS is not None:
        queue, file = _PROGRESS, task["file"]

        def report(n: int) -> None:
            queue.put((file, n))
    try:
        with open(tmp, "wb") as f:
            for name, path, label, patient_id, source_size in task["items"]:
                try:
                    with open(path, "rb") as src:
                        data = src.read()
                except OSError as e:
                    raise ConversionError(path, f"cannot read: {e}") from None
                if task["validated"] and len(data) != source_size:
                    raise ConversionError(path, "file changed since it was validated")
                try:
                    stored, height, width, passed = prepare_image(
                        data, task["image_size"], task["encoding"], task["jpeg_quality"],
                        validated=task["validated"])
                except Exception as e:  # noqa: BLE001 - a decoder failure names the file
                    raise ConversionError(path, _describe(e)) from None
                passthrough += passed
                example = make_example(stored, task["encoding"], height, width, label, name,
                                       patient_id)
                chunk = frame_record(example)
                digest.update(chunk)
                f.write(chunk)
                nbytes += len(chunk)
                label_sums += np.asarray(label) >= 0.5
                if report is not None:
                    report(1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(out_dir)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    return {
        "file": task["file"],
        "sha256": digest.hexdigest(),
        "bytes": nbytes,
        "count": len(task["items"]),
        "label_sums": [int(x) for x in label_sums],
        "passthrough": passthrough,
        "seconds": round(time.perf_counter() - t0, 3),
    }


# --------------------------------------------------------------------------------------------
# Planning, manifest, conversion driver
# --------------------------------------------------------------------------------------------

def shard_name(split: str, index: int, num_shards: int) -> str:
    """``{split}-{index:05d}-of-{num_shards:05d}.tfrecord``."""
    return f"{split}-{index:05d}-of-{num_shards:05d}.tfrecord"


@dataclass
class _Item:
    name: str
    split: str
    path: str | None
    label: tuple[float, ...]
    patient_id: int
    size: int = 0
    width: int = 0
    height: int = 0


def _names_sha256(names: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(names).encode("utf-8")).hexdigest()


def _plan_sha256(items: Sequence[_Item]) -> str:
    """Hash of what a shard should contain: names, labels, patient ids, source sizes."""
    h = hashlib.sha256()
    for it in items:
        bits = "".join("1" if v >= 0.5 else "0" for v in it.label)
        h.update(f"{it.name}\t{bits}\t{it.patient_id}\t{it.size}\n".encode("utf-8"))
    return h.hexdigest()


def planned_shard_count(n_images: int, estimated_bytes: float,
                        shard_mb: float = DEFAULT_SHARD_MB) -> int:
    """Shards of one split under a size-based plan (the default, or ``shard_mb``).

    * fewer than :data:`SHARD_MULTIPLE` (8) images: one shard per image (as many workers as
      possible can still each get a file);
    * otherwise ``ceil(estimated_bytes / shard_mb MB)`` rounded **up** to a multiple of 8, at
      least 8: every split can be sharded by file over 1, 2, 4 or 8 workers with equal
      numbers of files per worker, and big splits keep shards of at most ~``shard_mb``;
    * never more shards than images allow for a multiple of 8 (``8 * (n_images // 8)``), so a
      shard is never empty; only images bigger than ``shard_mb`` then push shards past it.

    Depends on the split alone, never on the number of conversion or training workers.
    """
    if n_images <= 0:
        return 0
    if n_images < SHARD_MULTIPLE:
        return n_images
    if not shard_mb > 0:
        raise ValueError(f"shard_mb must be > 0, got {shard_mb}")
    by_size = math.ceil(estimated_bytes / (shard_mb * _MB))
    groups = min(max(1, math.ceil(by_size / SHARD_MULTIPLE)), n_images // SHARD_MULTIPLE)
    return groups * SHARD_MULTIPLE


def _estimated_bytes(items: Sequence[_Item], image_size: int | None) -> float:
    """Expected size of the split's shards: source bytes x resize area ratio + overhead."""
    total = 0.0
    for it in items:
        ratio = 1.0
        if image_size is not None and it.width and it.height:
            ratio = image_size * image_size / (it.width * it.height)
        total += it.size * ratio + _RECORD_OVERHEAD
    return total


def _shard_counts(items: Sequence[_Item], shard_size: int | None, shard_mb: float,
                  image_size: int | None) -> list[int]:
    """How many images each shard of one split gets (contiguous blocks).

    ``shard_size``: exactly that many per shard, the last takes the remainder. Otherwise
    :func:`planned_shard_count` shards, the images spread evenly (earlier shards get the
    extra image).
    """
    n = len(items)
    if n == 0:
        return []
    if shard_size is not None:
        full, rest = divmod(n, shard_size)
        return [shard_size] * full + ([rest] if rest else [])
    k = planned_shard_count(n, _estimated_bytes(items, image_size), shard_mb)
    q, r = divmod(n, k)
    return [q + 1] * r + [q] * (k - r)


_NUMBER_LIST = re.compile(r"\[\s*(-?[0-9.eE+-]+(?:,\s*-?[0-9.eE+-]+)*)\s*\]")


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f"{path.name}{_TMP_MARK}{os.getpid()}")
    # indented for people, but lists of numbers (label sums) on one line
    text = _NUMBER_LIST.sub(lambda m: "[" + ", ".join(m.group(1).replace(",", " ").split())
                            + "]", json.dumps(obj, indent=1))
    write_text_atomic(path, text + "\n", tmp=tmp)


def _write_text_atomic(path: Path, text: str) -> None:
    # temporary names that _remove_ours recognises and cleans after a crash
    write_text_atomic(path, text, tmp=path.with_name(f"{path.name}{_TMP_MARK}{os.getpid()}"))


def load_manifest(tfrecords_dir: Path | str) -> dict[str, Any]:
    """The parsed ``manifest.json`` of a TFRecords folder."""
    path = Path(tfrecords_dir) / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no manifest (not a converted TFRecords folder)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ConversionError(path, f"manifest is not valid JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ConversionError(path, f"not a manifest written by {__name__}")
    return manifest


def list_shards(tfrecords_dir: Path | str, split: str) -> list[Path]:
    """The shard files of one split, sorted; ``[]`` when the split has none.

    Raises :class:`ValueError` when the files found are not one complete set
    (``-00000-of-N`` .. ``-(N-1)-of-N``): a conversion still running, interrupted, or left
    over from different parameters.
    """
    root = Path(tfrecords_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: TFRecords folder not found")
    found: list[tuple[int, int, Path]] = []
    for p in root.glob(f"{split}-*-of-*.tfrecord"):
        m = _SHARD_RE.match(p.name)
        if m and m.group("split") == split:
            found.append((int(m.group("n")), int(m.group("i")), p))
    if not found:
        return []
    totals = {n for n, _, _ in found}
    indices = sorted(i for _, i, _ in found)
    if len(totals) != 1 or indices != list(range(next(iter(totals)))):
        raise ValueError(
            f"{root}: the {split} shards are not one complete set ({len(found)} file(s), "
            f"declared totals {sorted(totals)}); finish or redo the conversion")
    return [p for _, _, p in sorted(found)]


@dataclass
class ConversionResult:
    """What :func:`convert_dataset` did. ``manifest`` is the final ``manifest.json``."""

    out_dir: Path
    manifest: dict[str, Any]
    counts: dict[str, int]
    """Images stored per split."""
    shards: dict[str, list[Path]]
    skipped: list[dict[str, str]]
    written_shards: int
    """Shards written by this run (the rest were kept from an interrupted run)."""
    reused_shards: int
    images_written: int
    elapsed_s: float
    images_per_s: float
    """``images_written`` / wall time of the whole call (scan included)."""

    @property
    def num_images(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> str:
        """First line: totals and timing; then one line per split with its shard count and
        the worker counts that file-level sharding can split it between evenly, e.g.
        ``  train 414 images in 8 shard(s) (divisible among 1, 2, 4, 8 workers)``."""
        parts = ", ".join(f"{s} {self.counts[s]}" for s in SPLITS)
        text = (f"{self.num_images} images ({parts}) in {self.out_dir}; wrote "
                f"{self.written_shards} shard(s), kept {self.reused_shards}, "
                f"{self.images_written} images in {self.elapsed_s:.1f} s "
                f"({self.images_per_s:.1f} images/s)")
        if self.skipped:
            text += f"; skipped {len(self.skipped)} image(s), see {SKIPPED_TXT}"
        width = len(str(max(self.counts.values(), default=0)))
        for s in SPLITS:
            k = len(self.shards[s])
            text += (f"\n  {s:<5} {self.counts[s]:>{width}} images in {k} shard(s)"
                     f" ({shard_workers_note(k)})")
        return text


def shard_workers_note(num_shards: int) -> str:
    """Which worker counts (of 1, 2, 4, ... 64) get equal numbers of ``num_shards`` files.

    ``8`` -> ``"divisible among 1, 2, 4, 8 workers"``; below 8 shards it adds the limit of
    file-level sharding (one file per worker at least).
    """
    if num_shards <= 0:
        return "no shards"
    even = [w for w in (1, 2, 4, 8, 16, 32, 64) if w <= num_shards and num_shards % w == 0]
    text = f"divisible among {', '.join(map(str, even))} worker{'s' if even[-1] > 1 else ''}"
    if even == [1]:
        text += " only"
    if num_shards < SHARD_MULTIPLE:
        text += (f"; file-level sharding over at most {num_shards} "
                 f"worker{'s' if num_shards > 1 else ''}")
    return text


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _remove_ours(out_dir: Path, keep: set[str] | None = None, tmp_only: bool = False) -> None:
    """Delete files this module writes (never anything else) from ``out_dir``."""
    for p in out_dir.iterdir():
        if not p.is_file():
            continue
        name = p.name
        base = name.split(_TMP_MARK)[0] if _TMP_MARK in name else None
        ours_tmp = base is not None and (
            _OUR_SHARD_RE.match(base) or base in (MANIFEST_NAME, SKIPPED_JSON, SKIPPED_TXT))
        if ours_tmp:
            p.unlink()
            continue
        if tmp_only:
            continue
        if _OUR_SHARD_RE.match(name) or name in (MANIFEST_NAME, SKIPPED_JSON, SKIPPED_TXT):
            if keep is None or name not in keep:
                p.unlink()


def _param_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    keys = sorted(set(old) | set(new))
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


def _progress_bar(progress: bool, total: int, desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="img", disable=not progress, dynamic_ncols=True)


def convert_dataset(
    data_dir: Path | str,
    out_dir: Path | str,
    image_size: int | None = None,
    encoding: str = "png",
    shard_size: int | None = None,
    shard_mb: float | None = None,
    workers: int | None = None,
    on_error: str = "fail",
    val_fraction: float = 0.1,
    seed: int = 0,
    progress: bool = True,
    overwrite: bool = False,
    jpeg_quality: int = 95,
) -> ConversionResult:
    """Convert ``data_dir`` (NIH layout) to sharded TFRecords in ``out_dir``.

    Splits with ``NIHDataset.load(data_dir).split(val_fraction, seed)`` (official test list
    as test). Shards per split:

    * default (neither given) or ``shard_mb=M`` (default 100): shards of at most about M MB,
      and a shard count that is a multiple of 8, at least 8, so every split can be sharded by
      file over 1, 2, 4 or 8 workers evenly; a split of fewer than 8 images gets one shard
      per image (:func:`planned_shard_count`). ``M`` is an upper bound: the rounding only
      ever adds shards.
    * ``shard_size=N``: exactly N images per shard, the last takes the remainder; no
      rounding (use it to choose the count yourself, e.g. fewer, bigger shards).

    ``ConversionResult.summary()`` prints the count per split and the worker counts it
    divides. ``workers`` processes convert one shard per task (default: all cores; 1 converts
    in this process); the shard plan never depends on it. See the module docstring for the
    error policy, determinism and resuming. Raises :class:`ConversionError` (bad image under
    ``on_error="fail"``, conflicting earlier conversion, including one made with an older
    version's shard plan) or :class:`chexnet_utils.nih.DataFormatError` (bad CSV or split
    list).
    """
    t_start = time.perf_counter()
    if encoding not in ("png", "jpeg"):
        raise ValueError(f"encoding must be 'png' or 'jpeg', got {encoding!r}")
    if on_error not in ("fail", "skip"):
        raise ValueError(f"on_error must be 'fail' or 'skip', got {on_error!r}")
    if shard_size is not None and shard_mb is not None:
        raise ValueError("give shard_size or shard_mb, not both")
    if shard_size is not None and shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    if shard_mb is not None and not shard_mb > 0:
        raise ValueError(f"shard_mb must be > 0, got {shard_mb}")
    if image_size is not None and image_size < 1:
        raise ValueError(f"image_size must be >= 1, got {image_size}")
    if not 1 <= jpeg_quality <= 100:
        raise ValueError(f"jpeg_quality must be in 1..100, got {jpeg_quality}")
    if shard_size is None and shard_mb is None:
        shard_mb = DEFAULT_SHARD_MB
    workers = max(1, int(workers or os.cpu_count() or 1))

    ds = NIHDataset.load(data_dir)
    split = ds.split(val_fraction=val_fraction, seed=seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    params = {
        "data_dir": str(Path(data_dir).resolve()),
        "image_size": image_size,
        "encoding": encoding,
        "jpeg_quality": jpeg_quality if encoding == "jpeg" else None,
        "shard_size": shard_size,
        "shard_mb": None if shard_size is not None else float(shard_mb),  # type: ignore[arg-type]
        # The size-based plan's rounding (see planned_shard_count). Absent (None) in manifests
        # of older versions, whose size-based plans did not round: such a folder is refused
        # below with a hint, rather than silently re-planned and rewritten.
        "shard_multiple": None if shard_size is not None else SHARD_MULTIPLE,
        "val_fraction": val_fraction,
        "seed": seed,
        "png_compress_level": PNG_COMPRESS_LEVEL,
    }

    # ---- an earlier conversion in the same folder: resume, refuse or wipe --------------
    old: dict[str, Any] | None = None
    if (out / MANIFEST_NAME).exists():
        try:
            old = load_manifest(out)
        except ConversionError:
            if not overwrite:
                raise
        if old is not None and not overwrite:
            old_params = old.get("params", {})
            diff = _param_diff(old_params if isinstance(old_params, dict) else {}, params)
            if diff:
                hint = ""
                if (params["shard_multiple"] is not None and isinstance(old_params, dict)
                        and "shard_multiple" not in old_params
                        and old_params.get("shard_size") is None):
                    hint = (" (it was made by an older version whose size-based shard plan did"
                            " not round shard counts to a multiple of "
                            f"{SHARD_MULTIPLE}, which file-level sharding over several "
                            "workers needs)")
                raise ConversionError(out, "holds a conversion with different parameters ("
                                      + "; ".join(diff) + ")" + hint + "; pass overwrite=True"
                                      " (--overwrite) to replace it, or choose another folder")
    elif not overwrite and any(_OUR_SHARD_RE.match(p.name) for p in out.iterdir()):
        raise ConversionError(out, "contains .tfrecord shards but no manifest.json; pass "
                              "overwrite=True (--overwrite) to replace them")
    if overwrite:
        _remove_ours(out)
        old = None
    _remove_ours(out, tmp_only=True)  # stray *.tmp-* from a killed run

    items: list[_Item] = []
    for part, records in split.parts().items():
        for r in records:
            p = ds.image_paths.get(r.image_index)
            items.append(_Item(r.image_index, part, None if p is None else str(p),
                               tuple(float(x) for x in r.labels), r.patient_id))

    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    full = on_error == "skip"
    bar = _progress_bar(progress, len(items), "validating" if full else "scanning")
    executor = None
    queue = None
    try:
        if workers > 1:
            ctx = mp.get_context("spawn")  # no fork of a parent that may hold TF threads
            queue = ctx.Queue()
            executor = ProcessPoolExecutor(max_workers=workers, mp_context=ctx,
                                           initializer=_init_worker, initargs=(queue, os.getpid()))

        # ---- 1. scan: sizes for planning; with on_error="skip" a full validation --------
        step = 16 if full else 256
        chunks = [([it.path for it in items[i:i + step]], full)
                  for i in range(0, len(items), step)]
        results = executor.map(_scan_chunk, chunks) if executor else map(_scan_chunk, chunks)
        scans: list[dict[str, Any]] = []
        for chunk_result in results:
            scans.extend(chunk_result)
            bar.update(len(chunk_result))
        skipped: list[dict[str, str]] = []
        good: list[_Item] = []
        for it, sc in zip(items, scans):
            if sc["ok"]:
                it.size, it.width, it.height = sc["size"], sc["width"], sc["height"]
                good.append(it)
            elif on_error == "fail":
                where = it.path or f"{Path(data_dir) / it.name} (listed in the CSV)"
                raise ConversionError(where, sc["reason"])
            else:
                skipped.append({"name": it.name, "split": it.split,
                                "path": it.path or "", "reason": sc["reason"]})

        skipped_doc = {"on_error": on_error, "count": len(skipped), "skipped": skipped}
        _write_json_atomic(out / SKIPPED_JSON, skipped_doc)
        _write_text_atomic(out / SKIPPED_TXT, "".join(
            f"{s['name']}\t{s['split']}\t{s['reason']}\t{s['path']}\n" for s in skipped))

        # ---- 2. plan: contiguous blocks per split, independent of the worker count -------
        shards: list[dict[str, Any]] = []
        tasks: dict[str, dict[str, Any]] = {}
        split_info: dict[str, Any] = {}
        for part in SPLITS:
            part_items = [it for it in good if it.split == part]
            counts = _shard_counts(part_items, shard_size, shard_mb or DEFAULT_SHARD_MB,
                                   image_size)
            sums = np.zeros(NUM_CLASSES, np.int64)
            start = 0
            for i, count in enumerate(counts):
                block = part_items[start:start + count]
                start += count
                lsum = np.sum([np.asarray(it.label) >= 0.5 for it in block], axis=0)
                sums += lsum
                file = shard_name(part, i, len(counts))
                shards.append({
                    "file": file, "split": part, "index": i, "num_shards": len(counts),
                    "count": count, "label_sums": [int(x) for x in lsum],
                    "names_sha256": _names_sha256(it.name for it in block),
                    "plan_sha256": _plan_sha256(block),
                    "first_name": block[0].name, "last_name": block[-1].name,
                    "done": False, "sha256": None, "bytes": None,
                })
                tasks[file] = {
                    "out_dir": str(out), "file": file, "image_size": image_size,
                    "encoding": encoding, "jpeg_quality": jpeg_quality, "validated": full,
                    "items": [(it.name, it.path, it.label, it.patient_id, it.size)
                              for it in block],
                }
            split_info[part] = {"images": len(part_items), "shards": len(counts),
                                "label_sums": [int(x) for x in sums],
                                "skipped": sum(1 for s in skipped if s["split"] == part)}

        # ---- 3. keep what an interrupted run already finished ----------------------------
        old_done = {s["file"]: s for s in (old or {}).get("shards", []) if s.get("done")}
        reused = 0
        reused_images = 0
        for s in shards:
            prev = old_done.get(s["file"])
            path = out / s["file"]
            if (prev and prev.get("plan_sha256") == s["plan_sha256"]
                    and prev.get("count") == s["count"] and path.is_file()
                    and path.stat().st_size == prev.get("bytes")
                    and _file_sha256(path) == prev.get("sha256")):
                s.update(done=True, sha256=prev["sha256"], bytes=prev["bytes"])
                tasks.pop(s["file"])
                reused += 1
                reused_images += s["count"]
        # Shard files of another plan (e.g. more images than last time) would mix into
        # list_shards(): remove them. Only names this module writes are touched.
        _remove_ours(out, keep={s["file"] for s in shards}
                     | {MANIFEST_NAME, SKIPPED_JSON, SKIPPED_TXT})

        manifest: dict[str, Any] = {
            "format": FORMAT, "version": FORMAT_VERSION, "params": params,
            "on_error": on_error, "classes": list(PATHOLOGIES),
            "crc32c": CRC32C_IMPLEMENTATION, "complete": False,
            "num_images": len(good), "num_skipped": len(skipped), "splits": split_info,
            "shards": shards,
        }
        by_file = {s["file"]: s for s in shards}

        def finish(entry: dict[str, Any]) -> None:
            s = by_file[entry["file"]]
            if entry["count"] != s["count"] or entry["label_sums"] != s["label_sums"]:
                raise ConversionError(out / entry["file"], "written shard does not match plan")
            s.update(done=True, sha256=entry["sha256"], bytes=entry["bytes"])
            _write_json_atomic(out / MANIFEST_NAME, manifest)

        _write_json_atomic(out / MANIFEST_NAME, manifest)

        # ---- 4. convert: one task per shard ---------------------------------------------
        bar.set_description("converting")
        bar.reset(total=len(good))
        bar.update(reused_images)
        t_convert = time.perf_counter()
        written_images = sum(len(t["items"]) for t in tasks.values())
        if executor is None:
            for task in tasks.values():
                finish(_write_shard(task, progress=bar.update))
        else:
            assert queue is not None
            reported: dict[str, int] = {}
            expected = {f: len(t["items"]) for f, t in tasks.items()}
            pending = {executor.submit(_write_shard, t): t["file"] for t in tasks.values()}
            error: BaseException | None = None

            def drain() -> None:
                while True:
                    try:
                        file, n = queue.get_nowait()
                    except Exception:  # noqa: BLE001 - queue.Empty
                        return
                    add = min(n, expected[file] - reported.get(file, 0))
                    if add > 0:
                        reported[file] = reported.get(file, 0) + add
                        bar.update(add)

            while pending:
                done, _ = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                drain()
                for fut in done:
                    file = pending.pop(fut)
                    try:
                        entry = fut.result()
                    except BaseException as e:  # noqa: BLE001 - re-raised below
                        if error is None:
                            error = e
                            for other in pending:
                                other.cancel()  # running shards finish and are kept
                        continue
                    finish(entry)
                    missing = entry["count"] - reported.get(file, 0)
                    if missing > 0:  # progress messages still in flight
                        reported[file] = entry["count"]
                        bar.update(missing)
                pending = {f: n for f, n in pending.items() if not f.cancelled()}
            drain()
            if error is not None:
                raise error
        convert_s = time.perf_counter() - t_convert

        manifest["complete"] = True
        elapsed = time.perf_counter() - t_start
        manifest["stats"] = {
            "elapsed_s": round(elapsed, 3), "convert_s": round(convert_s, 3),
            "images_written": written_images, "shards_written": len(tasks),
            "shards_reused": reused, "workers": workers,
            "images_per_s": round(written_images / elapsed, 2) if elapsed > 0 else None,
        }
        _write_json_atomic(out / MANIFEST_NAME, manifest)
    except KeyboardInterrupt:
        # Stop now rather than after the running shards; finished ones stay in the manifest.
        if executor is not None:
            for proc in list((getattr(executor, "_processes", None) or {}).values()):
                proc.terminate()
        raise
    finally:
        bar.close()
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        if queue is not None:
            queue.close()
            queue.join_thread()
        try:
            _remove_ours(out, tmp_only=True)
        except OSError:
            pass

    return ConversionResult(
        out_dir=out, manifest=manifest,
        counts={p: split_info[p]["images"] for p in SPLITS},
        shards={p: [out / s["file"] for s in shards if s["split"] == p] for p in SPLITS},
        skipped=skipped, written_shards=len(tasks), reused_shards=reused,
        images_written=written_images, elapsed_s=elapsed,
        images_per_s=written_images / elapsed if elapsed > 0 else 0.0,
    )


# --------------------------------------------------------------------------------------------
# Verification
# --------------------------------------------------------------------------------------------

@dataclass
class VerifyReport:
    """Outcome of :func:`verify`: ``ok`` only when every check passed."""

    tfrecords_dir: Path
    problems: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    """Records read per split."""
    shards_checked: int = 0
    records: int = 0
    checked_source: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        head = (f"{self.tfrecords_dir}: {self.records} records in {self.shards_checked} shard(s)"
                f" ({', '.join(f'{k} {v}' for k, v in self.counts.items())})"
                + ("; checked against the source data" if self.checked_source else ""))
        if self.ok:
            return head + ": OK"
        lines = [head + f": {len(self.problems)} problem(s)"]
        lines += [f"  - {p}" for p in self.problems[:200]]
        if len(self.problems) > 200:
            lines.append(f"  ... and {len(self.problems) - 200} more")
        return "\n".join(lines)


def verify(tfrecords_dir: Path | str, data_dir: Path | str | None = None,
           decode_images: bool = False) -> VerifyReport:
    """Check a converted folder against its manifest (and, with ``data_dir``, the source).

    Reads every shard without TensorFlow, checking record CRCs, record counts, per-class
    label sums, image-name hashes and file sha256 against ``manifest.json``; that every
    planned shard exists and no unplanned shard file does; and that no image name appears
    twice. With ``data_dir`` also that every source image of each split part (minus those in
    ``skipped.json``) appears exactly once, in the right part, with the right label and
    patient id. ``decode_images=True`` also decodes every stored image and checks its size.
    """
    root = Path(tfrecords_dir)
    report = VerifyReport(tfrecords_dir=root)
    problems = report.problems
    try:
        manifest = load_manifest(root)
    except (FileNotFoundError, ConversionError) as e:
        problems.append(str(e))
        return report
    if not manifest.get("complete"):
        problems.append("manifest says the conversion is not complete (run it again to resume)")
    shards = manifest.get("shards", [])
    planned = {s["file"] for s in shards}
    for p in sorted(root.glob("*.tfrecord")):
        if p.name not in planned:
            problems.append(f"{p.name}: shard file not in the manifest")
    seen: dict[str, str] = {}
    found: dict[str, dict[str, Any]] = {}
    for s in shards:
        path = root / s["file"]
        if not s.get("done"):
            problems.append(f"{s['file']}: not written yet according to the manifest")
        if not path.is_file():
            problems.append(f"{s['file']}: missing shard file")
            continue
        report.shards_checked += 1
        sha = _file_sha256(path)
        if s.get("sha256") and sha != s["sha256"]:
            problems.append(f"{s['file']}: sha256 {sha[:12]}... differs from the manifest's "
                            f"{s['sha256'][:12]}...")
        names: list[str] = []
        sums = np.zeros(NUM_CLASSES, np.int64)
        try:
            for ex in read_examples(path):
                names.append(ex["name"])
                sums += ex["label"] >= 0.5
                if ex["name"] in seen:
                    problems.append(f"{s['file']}: image {ex['name']} also in {seen[ex['name']]}")
                seen[ex["name"]] = s["file"]
                found[ex["name"]] = {"split": s["split"], "label": ex["label"],
                                     "patient_id": ex["patient_id"]}
                if decode_images:
                    try:
                        with Image.open(io.BytesIO(ex["image_bytes"])) as im:
                            im.load()
                            if im.size != (ex["width"], ex["height"]):
                                problems.append(f"{s['file']}: {ex['name']} is {im.size}, "
                                                f"recorded {ex['width']}x{ex['height']}")
                    except Exception as e:  # noqa: BLE001
                        problems.append(f"{s['file']}: {ex['name']} does not decode: {e}")
        except (ValueError, KeyError, IndexError, struct.error) as e:
            problems.append(f"{s['file']}: unreadable after {len(names)} record(s): {e}")
            continue
        report.records += len(names)
        report.counts[s["split"]] = report.counts.get(s["split"], 0) + len(names)
        if len(names) != s["count"]:
            problems.append(f"{s['file']}: {len(names)} records, manifest says {s['count']}")
        if [int(x) for x in sums] != s["label_sums"]:
            problems.append(f"{s['file']}: label sums {[int(x) for x in sums]} differ from the "
                            f"manifest's {s['label_sums']}")
        if _names_sha256(names) != s.get("names_sha256"):
            problems.append(f"{s['file']}: image names differ from the manifest's")
    for part, info in manifest.get("splits", {}).items():
        n_shards = sum(1 for s in shards if s["split"] == part)
        n_images = sum(s["count"] for s in shards if s["split"] == part)
        if n_shards != info.get("shards") or n_images != info.get("images"):
            problems.append(f"{part}: manifest lists {n_shards} shard(s) with {n_images} "
                            f"image(s), its summary says {info.get('shards')} with "
                            f"{info.get('images')}")

    if data_dir is not None:
        report.checked_source = True
        params = manifest.get("params", {})
        skipped_names: set[str] = set()
        skipped_path = root / SKIPPED_JSON
        if skipped_path.is_file():
            skipped_names = {s["name"] for s in
                             json.loads(skipped_path.read_text(encoding="utf-8"))["skipped"]}
        elif manifest.get("num_skipped"):
            problems.append(f"{SKIPPED_JSON} is missing but the manifest counts "
                            f"{manifest['num_skipped']} skipped image(s)")
        try:
            ds = NIHDataset.load(data_dir)
            split = ds.split(val_fraction=params.get("val_fraction", 0.1),
                             seed=params.get("seed", 0))
        except ValueError as e:  # DataFormatError, LeakageError
            problems.append(f"cannot read the source data set: {e}")
            return report
        expected: set[str] = set()
        for part, records in split.parts().items():
            for r in records:
                if r.image_index in skipped_names:
                    if r.image_index in found:
                        problems.append(f"{r.image_index}: listed as skipped but stored")
                    continue
                expected.add(r.image_index)
                got = found.get(r.image_index)
                if got is None:
                    problems.append(f"{r.image_index} ({part}): source image not in any shard")
                    continue
                if got["split"] != part:
                    problems.append(f"{r.image_index}: stored in {got['split']}, belongs to "
                                    f"{part}")
                if not np.array_equal(got["label"], r.labels):
                    problems.append(f"{r.image_index}: label {got['label'].tolist()} differs "
                                    f"from the CSV's {r.finding_labels!r}")
                if got["patient_id"] != r.patient_id:
                    problems.append(f"{r.image_index}: patient id {got['patient_id']}, CSV "
                                    f"says {r.patient_id}")
        for name in sorted(set(found) - expected - skipped_names):
            problems.append(f"{name}: stored but not an image of the source data set")
    return report



def bench_conversion(data_dir: Path | str, work_dir: Path | str,
                     image_sizes: Sequence[int | None] = (None, 320),
                     workers: Sequence[int] | None = None, repeats: int = 2,
                     shard_size: int | None = 32, progress: bool = True) -> dict[str, Any]:
    """Conversion throughput for each worker count and image size, measured side by side.

    For every ``image_size`` (``None`` = store the original bytes) the data set is converted
    ``repeats`` times with each worker count, alternating the order (1, N, N, 1, ...) so slow
    phases of a noisy machine hit both equally; every run writes into a fresh folder under
    ``work_dir`` (removed afterwards). The whole call is timed (scan, pool start-up and
    writing), since that is what a user waits for. Returns per-run images/s, the mean per
    worker count, and ``speedup`` = mean(N workers) / mean(1 worker) per image size.
    """
    import shutil
    import tempfile

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    counts = list(workers) if workers else sorted({1, int(cores or 1)})
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"cores": cores, "workers": counts, "repeats": repeats,
                           "shard_size": shard_size, "data_dir": str(data_dir), "runs": {}}
    for size in image_sizes:
        key = f"{size or 'original'}"
        rates: dict[int, list[float]] = {w: [] for w in counts}
        for r in range(repeats):
            for w in (counts if r % 2 == 0 else counts[::-1]):
                tmp = Path(tempfile.mkdtemp(prefix=f"conv-{key}-w{w}-", dir=work_dir))
                try:
                    res = convert_dataset(data_dir, tmp, image_size=size, shard_size=shard_size,
                                          workers=w, progress=progress)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                rates[w].append(res.images_per_s)
                out["n_images"] = res.num_images
        means = {w: float(np.mean(v)) for w, v in rates.items()}
        out["runs"][key] = {
            "img_per_s": {str(w): v for w, v in rates.items()},
            "mean_img_per_s": {str(w): m for w, m in means.items()},
            "speedup": means[counts[-1]] / means[counts[0]],
        }
    return out


def format_bench_conversion(r: dict[str, Any]) -> str:
    """Readable table of :func:`bench_conversion` results."""
    lines = [f"conversion of {r.get('n_images', '?')} images, {r['cores']} cores, "
             f"{r['repeats']} repeats (images/s, whole call):"]
    for key, run in r["runs"].items():
        means = run["mean_img_per_s"]
        cells = "  ".join(f"{w} worker(s): {m:7.1f}" for w, m in means.items())
        lines.append(f"  image size {key:>8}:  {cells}   speed-up {run['speedup']:.2f}x")
    return "\n".join(lines)
