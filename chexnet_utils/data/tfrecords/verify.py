"""The layout of a converted folder: names, ``manifest.json``, listing the shards of a split,
and :func:`verify`, which checks a folder against its manifest and the source data.

Layout written by :func:`chexnet_utils.data.tfrecords.convert_dataset` to ``OUT_DIR``::

    OUT_DIR/
      train-00000-of-00296.tfrecord      # {split}-{i:05d}-of-{n:05d}.tfrecord
      ...
      manifest.json                      # parameters + one entry per shard (counts, sha256)
      skipped.json / skipped.txt         # images left out under on_error="skip" (may be empty)
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from chexnet_utils.data.labels import NUM_CLASSES
from chexnet_utils.data.nih import NIHDataset
from chexnet_utils.data.tfrecords.images import check_pixels
from chexnet_utils.data.tfrecords.wire import check_framing, read_examples

__all__ = [
    "MANIFEST_NAME",
    "SKIPPED_JSON",
    "SKIPPED_TXT",
    "SPLITS",
    "ConversionError",
    "VerifyReport",
    "list_shards",
    "load_manifest",
    "verify",
]

MANIFEST_NAME = "manifest.json"
SKIPPED_JSON = "skipped.json"
SKIPPED_TXT = "skipped.txt"
SPLITS: tuple[str, ...] = ("train", "val", "test")
FORMAT = "chexnet_utils.tfrecords"
"""The ``format`` of ``manifest.json``: a name of the data format, not a module path (it stays
when modules move)."""
FORMATS_READ = (FORMAT, "chexnet_utils.data.tfrecords")
"""Accepted when reading: the second was written for a while after the module moved into the
data wing (2026-12-04 to 12-05); a conversion marked either way is this converter's."""
FORMAT_VERSION = 1
_SHARD_RE = re.compile(r"^(?P<split>[A-Za-z0-9_]+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.tfrecord$")


class ConversionError(RuntimeError):
    """An image (or the output folder) stops the conversion; names the file and the reason."""

    def __init__(self, path: Path | str | None, reason: str) -> None:
        super().__init__(f"{path}: {reason}" if path is not None else reason)
        self.path = None if path is None else str(path)
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[str | None, str]]:  # picklable across processes
        return (self.__class__, (self.path, self.reason))


def names_sha256(names: Iterable[str]) -> str:
    """SHA-256 of the image names of a shard, one per line (in the manifest)."""
    return hashlib.sha256("\n".join(names).encode("utf-8")).hexdigest()


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_manifest(tfrecords_dir: Path | str) -> dict[str, Any]:
    """The parsed ``manifest.json`` of a TFRecords folder."""
    path = Path(tfrecords_dir) / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no manifest (not a converted TFRecords folder)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ConversionError(path, f"manifest is not valid JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in FORMATS_READ:
        raise ConversionError(path, f"not a manifest written by {FORMAT}")
    return manifest


_FRAMED: set[tuple[str, int, int]] = set()
"""Shards whose framing this process has checked: (path, size, mtime in ns)."""


def checked_framing(shards: Iterable[Path]) -> None:
    """:func:`~chexnet_utils.data.tfrecords.wire.check_framing` on each shard, once per
    process for an unchanged file; raises its ``ShardFramingError`` (one line: the file and
    the byte offset) before TensorFlow could crash on the file."""
    for p in shards:
        st = p.stat()
        key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
        if key not in _FRAMED:
            check_framing(p)
            _FRAMED.add(key)


def list_shards(tfrecords_dir: Path | str, split: str) -> list[Path]:
    """The shard files of one split, sorted; ``[]`` when the split has none. Their record
    framing is checked first (:func:`checked_framing`): a crafted length would make
    TensorFlow's reader crash the process.

    Raises :class:`ValueError` when the files found are not one complete set
    (``-00000-of-N`` .. ``-(N-1)-of-N``): a conversion still running, interrupted, or left
    over from different parameters; ``ShardFramingError`` (a ``ValueError``) for a shard
    whose framing is broken.
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
    shards = [p for _, _, p in sorted(found)]
    checked_framing(shards)
    return shards


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
    try:
        manifest = load_manifest(root)
    except (FileNotFoundError, ConversionError) as e:
        report.problems.append(str(e))
        return report
    _check_plan(root, manifest, report.problems)
    found: dict[str, dict[str, Any]] = {}
    for s in manifest.get("shards", []):
        _check_shard(root, s, decode_images, found, report)
    _check_split_summaries(manifest, report.problems)
    if data_dir is not None:
        report.checked_source = True
        _check_source(root, manifest, data_dir, found, report.problems)
    return report


def _check_plan(root: Path, manifest: dict[str, Any], problems: list[str]) -> None:
    """The conversion finished, and every shard file in the folder is one it planned."""
    if not manifest.get("complete"):
        problems.append("manifest says the conversion is not complete (run it again to resume)")
    planned = {s["file"] for s in manifest.get("shards", [])}
    for p in sorted(root.glob("*.tfrecord")):
        if p.name not in planned:
            problems.append(f"{p.name}: shard file not in the manifest")


def _decode_problem(shard: str, ex: dict[str, Any]) -> str | None:
    """Why the stored image of record ``ex`` does not decode to its recorded size, if so. An
    image over the converter's pixel limit is a problem found before it is decoded (a
    decompression bomb: a few hundred kB on disk, gigabytes decoded)."""
    try:
        with Image.open(io.BytesIO(ex["image_bytes"])) as im:
            check_pixels(*im.size)
            im.load()
            if im.size != (ex["width"], ex["height"]):
                return (f"{shard}: {ex['name']} is {im.size}, "
                        f"recorded {ex['width']}x{ex['height']}")
    except Image.DecompressionBombError as e:
        return f"{shard}: {ex['name']} is too large to decode: {e}"
    except Exception as e:  # noqa: BLE001
        return f"{shard}: {ex['name']} does not decode: {e}"
    return None


def _check_shard(root: Path, s: dict[str, Any], decode_images: bool,
                 found: dict[str, dict[str, Any]], report: VerifyReport) -> None:
    """Read one planned shard: its file hash, every record (names seen once, in ``found``
    with split, label and patient id), then its count, label sums and names hash."""
    problems = report.problems
    path = root / s["file"]
    if not s.get("done"):
        problems.append(f"{s['file']}: not written yet according to the manifest")
    if not path.is_file():
        problems.append(f"{s['file']}: missing shard file")
        return
    report.shards_checked += 1
    sha = file_sha256(path)
    if s.get("sha256") and sha != s["sha256"]:
        problems.append(f"{s['file']}: sha256 {sha[:12]}... differs from the manifest's "
                        f"{s['sha256'][:12]}...")
    names: list[str] = []
    sums = np.zeros(NUM_CLASSES, np.int64)
    try:
        for ex in read_examples(path):
            names.append(ex["name"])
            sums += ex["label"] >= 0.5
            if ex["name"] in found:
                problems.append(f"{s['file']}: image {ex['name']} also in "
                                f"{found[ex['name']]['file']}")
            found[ex["name"]] = {"split": s["split"], "label": ex["label"],
                                 "patient_id": ex["patient_id"], "file": s["file"]}
            problem = _decode_problem(s["file"], ex) if decode_images else None
            if problem:
                problems.append(problem)
    except (ValueError, KeyError, IndexError, struct.error) as e:
        problems.append(f"{s['file']}: unreadable after {len(names)} record(s): {e}")
        return
    report.records += len(names)
    report.counts[s["split"]] = report.counts.get(s["split"], 0) + len(names)
    if len(names) != s["count"]:
        problems.append(f"{s['file']}: {len(names)} records, manifest says {s['count']}")
    if [int(x) for x in sums] != s["label_sums"]:
        problems.append(f"{s['file']}: label sums {[int(x) for x in sums]} differ from the "
                        f"manifest's {s['label_sums']}")
    if names_sha256(names) != s.get("names_sha256"):
        problems.append(f"{s['file']}: image names differ from the manifest's")


def _check_split_summaries(manifest: dict[str, Any], problems: list[str]) -> None:
    """Each split's summary in the manifest agrees with its shards' entries."""
    shards = manifest.get("shards", [])
    for part, info in manifest.get("splits", {}).items():
        n_shards = sum(1 for s in shards if s["split"] == part)
        n_images = sum(s["count"] for s in shards if s["split"] == part)
        if n_shards != info.get("shards") or n_images != info.get("images"):
            problems.append(f"{part}: manifest lists {n_shards} shard(s) with {n_images} "
                            f"image(s), its summary says {info.get('shards')} with "
                            f"{info.get('images')}")


def _skipped_names(root: Path, manifest: dict[str, Any], problems: list[str]) -> set[str]:
    """The images the conversion left out (``skipped.json``), which the manifest counts."""
    skipped_path = root / SKIPPED_JSON
    if skipped_path.is_file():
        return {s["name"] for s in
                json.loads(skipped_path.read_text(encoding="utf-8"))["skipped"]}
    if manifest.get("num_skipped"):
        problems.append(f"{SKIPPED_JSON} is missing but the manifest counts "
                        f"{manifest['num_skipped']} skipped image(s)")
    return set()


def _check_source(root: Path, manifest: dict[str, Any], data_dir: Path | str,
                  found: dict[str, dict[str, Any]], problems: list[str]) -> None:
    """Every source image of each split part (but the skipped) stored once, in its part,
    with its label and patient id; nothing stored that is not a source image."""
    params = manifest.get("params", {})
    skipped_names = _skipped_names(root, manifest, problems)
    try:
        ds = NIHDataset.load(data_dir)
        split = ds.split(val_fraction=params.get("val_fraction", 0.1),
                         seed=params.get("seed", 0))
    except ValueError as e:  # DataFormatError, LeakageError
        problems.append(f"cannot read the source data set: {e}")
        return
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
