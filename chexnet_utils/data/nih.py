"""Read (and write) the NIH ChestX-ray14 layout: metadata CSV, image folders, split lists.

What a user downloads from NIH looks like this::

    DATA_DIR/
      Data_Entry_2017.csv            # one row per image, 11 fields
      train_val_list.txt             # 86,524 image names, one per line
      test_list.txt                  # 25,596 image names
      images_001/images/00000001_000.png
      ...
      images_012/images/00030805_000.png

Some mirrors flatten the folders into ``DATA_DIR/images/``; both are found. The CSV header is
``Image Index,Finding Labels,Follow-up #,Patient ID,Patient Age,Patient Gender,View Position,
OriginalImage[Width,Height],OriginalImagePixelSpacing[x,y]``: because the two bracketed names
contain a comma, a CSV parser sees 11 columns. Some copies end every row with a comma (a 12th,
empty column), and some say ``Patient Sex`` instead of ``Patient Gender``. All of these load.

Every problem in the input raises :class:`DataFormatError` naming the file and the row.
"""

from __future__ import annotations

import csv
import io
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np

from chexnet_utils.data.labels import (
    NO_FINDING,
    PATHOLOGIES,
    LabelError,
    labels_to_multihot,
    parse_finding_labels,
)
from chexnet_utils.platform.atomic import write_text_atomic

CSV_NAME = "Data_Entry_2017.csv"
TRAIN_VAL_LIST = "train_val_list.txt"
TEST_LIST = "test_list.txt"

CSV_HEADER: tuple[str, ...] = (
    "Image Index",
    "Finding Labels",
    "Follow-up #",
    "Patient ID",
    "Patient Age",
    "Patient Gender",
    "View Position",
    "OriginalImage[Width",
    "Height]",
    "OriginalImagePixelSpacing[x",
    "y]",
)
"""The 11 columns as a CSV parser splits NIH's header line."""

_REQUIRED = ("Image Index", "Finding Labels", "Follow-up #", "Patient ID", "Patient Age",
             "Patient Gender", "View Position")
_ALIASES = {"Patient Sex": "Patient Gender"}
_T = TypeVar("_T")


class DataFormatError(ValueError):
    """Bad input in a data set file; the message names the file and (where known) the row."""

    def __init__(self, path: Path | str, message: str, row: int | None = None) -> None:
        where = f"{path}, row {row}" if row is not None else f"{path}"
        super().__init__(f"{where}: {message}")
        self.path = Path(path)
        self.row = row


class LeakageError(ValueError):
    """The same patient appears in more than one part of a split."""


@dataclass(frozen=True)
class ImageRecord:
    """One row of ``Data_Entry_2017.csv``."""

    image_index: str
    finding_labels: str
    follow_up: int
    patient_id: int
    patient_age: int
    patient_gender: str
    view_position: str
    width: int | None = None
    height: int | None = None
    spacing_x: float | None = None
    spacing_y: float | None = None

    @property
    def labels(self) -> np.ndarray:
        """The 14-way multi-hot label (float32)."""
        return labels_to_multihot(self.finding_labels)

    def csv_row(self) -> list[str]:
        """The record as the 11 CSV fields NIH writes."""
        def fmt(v: object) -> str:
            return "" if v is None else str(v)
        return [self.image_index, self.finding_labels, str(self.follow_up), str(self.patient_id),
                str(self.patient_age), self.patient_gender, self.view_position, fmt(self.width),
                fmt(self.height), fmt(self.spacing_x), fmt(self.spacing_y)]


def _parse_int(text: str, what: str, path: Path, row: int) -> int:
    # NIH's 2017 CSV has plain integers; earlier releases wrote ages as '058Y' (or M/D for
    # months/days), which we convert to whole years.
    m = re.fullmatch(r"\s*(\d+)\s*([YMD]?)\s*", text)
    if not m:
        raise DataFormatError(path, f"{what} is not a whole number: {text!r}", row)
    value, unit = int(m.group(1)), m.group(2)
    return value // 12 if unit == "M" else value // 365 if unit == "D" else value


def _parse_optional(text: str, kind: Callable[[str], _T], what: str, path: Path,
                    row: int) -> _T | None:
    if text.strip() == "":
        return None
    try:
        return kind(text)
    except ValueError:
        raise DataFormatError(path, f"{what} is not a number: {text!r}", row) from None


def _read_utf8(path: Path, encoding: str = "utf-8") -> str:
    """The text of ``path``; :class:`DataFormatError` naming the row and byte offset of the
    first byte that is not UTF-8 (a copy re-saved as Latin-1 or Windows-1252, say)."""
    data = path.read_bytes()
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        row = data.count(b"\n", 0, e.start) + 1
        raise DataFormatError(path, f"not UTF-8 text: byte 0x{data[e.start]:02x} at offset "
                              f"{e.start} (convert the file to UTF-8, e.g. iconv -f latin1 "
                              "-t utf-8)", row) from None


def _csv_rows(path: Path, f: Iterable[str]) -> Iterator[list[str]]:
    """``csv.reader(f)``, its ``csv.Error`` (a NUL byte, a field over
    ``csv.field_size_limit()``) raised as :class:`DataFormatError` with the row."""
    reader = csv.reader(f)
    try:
        yield from reader
    except csv.Error as e:
        raise DataFormatError(path, f"not a CSV file: {e}", reader.line_num) from None


def read_data_entry(path: Path | str) -> list[ImageRecord]:
    """Parse ``Data_Entry_2017.csv`` (or a copy in the same format) into records.

    Accepts the 11-field layout, a trailing comma on every row, and ``Patient Sex`` for
    ``Patient Gender``. Raises :class:`DataFormatError` for a missing file or column, text
    that is not UTF-8 or not CSV, a row without an image name, a malformed number, an unknown
    label, or a duplicate image name.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(path, "metadata file not found")
    with io.StringIO(_read_utf8(path, "utf-8-sig"), newline="") as f:
        reader = _csv_rows(path, f)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise DataFormatError(path, "file is empty", 1) from None
        header = [_ALIASES.get(h, h) for h in header]
        missing = [c for c in _REQUIRED if c not in header]
        if missing:
            raise DataFormatError(path, f"missing column(s) {missing}; header is {header}", 1)
        col = {name: header.index(name) for name in header if name}
        records: list[ImageRecord] = []
        seen: dict[str, int] = {}
        for line_no, fields in enumerate(reader, start=2):
            if not fields or all(not x.strip() for x in fields):
                continue  # blank line
            # A trailing comma adds an empty last field; anything else must line up.
            while len(fields) > len(header) and fields[-1].strip() == "":
                fields = fields[:-1]
            if len(fields) > len(header):
                raise DataFormatError(path, f"expected {len(header)} fields, got {len(fields)} "
                                      f"(extra values: {fields[len(header):]})", line_no)
            if len(fields) < len(_REQUIRED):
                raise DataFormatError(path, f"expected {len(header)} fields, got {len(fields)}",
                                      line_no)
            fields = fields + [""] * (len(header) - len(fields))

            def get(name: str, fields: list[str] = fields) -> str:
                return fields[col[name]].strip() if name in col else ""

            name = get("Image Index")
            if not name:
                raise DataFormatError(path, "row has no image name (Image Index is empty)",
                                      line_no)
            if name in seen:
                raise DataFormatError(
                    path, f"duplicate image name {name!r} (first seen in row {seen[name]})",
                    line_no)
            seen[name] = line_no
            try:
                labels = parse_finding_labels(get("Finding Labels"))
            except LabelError as e:
                raise DataFormatError(path, str(e), line_no) from None
            records.append(ImageRecord(
                image_index=name,
                finding_labels="|".join(labels) if labels else NO_FINDING,
                follow_up=_parse_int(get("Follow-up #"), "Follow-up #", path, line_no),
                patient_id=_parse_int(get("Patient ID"), "Patient ID", path, line_no),
                patient_age=_parse_int(get("Patient Age"), "Patient Age", path, line_no),
                patient_gender=get("Patient Gender"),
                view_position=get("View Position"),
                width=_parse_optional(get("OriginalImage[Width"), int, "width", path, line_no),
                height=_parse_optional(get("Height]"), int, "height", path, line_no),
                spacing_x=_parse_optional(get("OriginalImagePixelSpacing[x"), float,
                                          "pixel spacing x", path, line_no),
                spacing_y=_parse_optional(get("y]"), float, "pixel spacing y", path, line_no),
            ))
    return records


def write_data_entry(path: Path | str, records: Iterable[ImageRecord]) -> None:
    """Write records as NIH does: the 11-field header, then one row per image."""
    path = Path(path)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        # NIH's header line keeps the bracketed pairs unquoted, so it splits into 11 fields.
        f.write(",".join(CSV_HEADER) + "\n")
        for r in records:
            writer.writerow(r.csv_row())


def read_split_list(path: Path | str) -> list[str]:
    """Read ``train_val_list.txt`` / ``test_list.txt``: one image name per line.

    Raises :class:`DataFormatError` when the file is missing or names an image twice.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(path, "split list not found (NIH ships train_val_list.txt and "
                                    "test_list.txt next to Data_Entry_2017.csv)")
    names: list[str] = []
    seen: dict[str, int] = {}
    for line_no, line in enumerate(_read_utf8(path).splitlines(), start=1):
        name = line.strip()
        if not name:
            continue
        if name in seen:
            raise DataFormatError(path, f"image {name!r} listed twice (first in row {seen[name]})",
                                  line_no)
        seen[name] = line_no
        names.append(name)
    return names


def write_split_list(path: Path | str, names: Iterable[str]) -> None:
    """Write one image name per line, as NIH's split lists are written (atomically: a reader
    sees the old list or the new one)."""
    write_text_atomic(path, "".join(f"{n}\n" for n in names))


def find_images(data_dir: Path | str) -> dict[str, Path]:
    """Map image name -> path for every PNG under ``images/`` or ``images_NNN/images/``.

    Also accepts ``images_NNN/*.png`` (archives unpacked without the inner folder).
    Raises :class:`DataFormatError` if the same name is found in two folders.
    """
    data_dir = Path(data_dir)
    found: dict[str, Path] = {}
    patterns = ("images/*.png", "images_[0-9][0-9][0-9]/images/*.png",
                "images_[0-9][0-9][0-9]/*.png")
    for pattern in patterns:
        for p in sorted(data_dir.glob(pattern)):
            if p.name in found and found[p.name] != p:
                raise DataFormatError(p, f"image name also found at {found[p.name]}")
            found[p.name] = p
    return found


@dataclass
class Split:
    """Image records of the train, validation and test parts."""

    train: list[ImageRecord]
    val: list[ImageRecord]
    test: list[ImageRecord]

    def parts(self) -> dict[str, list[ImageRecord]]:
        """``{'train': ..., 'val': ..., 'test': ...}``."""
        return {"train": self.train, "val": self.val, "test": self.test}

    def check_no_leakage(self) -> None:
        """Raise :class:`LeakageError` if any patient appears in two parts."""
        check_no_leakage(self.parts())


def check_no_leakage(parts: Mapping[str, Sequence[ImageRecord]]) -> None:
    """Raise :class:`LeakageError` naming the patients found in more than one part."""
    owner: dict[int, str] = {}
    clashes: dict[int, set[str]] = {}
    for part, records in parts.items():
        for r in records:
            first = owner.setdefault(r.patient_id, part)
            if first != part:
                clashes.setdefault(r.patient_id, {first}).add(part)
    if clashes:
        sample = ", ".join(f"patient {pid} in {sorted(ps)}" for pid, ps in
                           sorted(clashes.items())[:5])
        raise LeakageError(f"{len(clashes)} patient(s) appear in more than one split part: "
                           f"{sample}")


def patient_split(
    records: Sequence[ImageRecord],
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    seed: int = 0,
    test_names: Iterable[str] | None = None,
) -> Split:
    """Split records by patient so that no patient is in two parts.

    Without ``test_names``, ``test_fraction`` and ``val_fraction`` of the *patients* are drawn
    at random for test and validation. With ``test_names`` (NIH's ``test_list.txt``) those
    images form the test part, ``test_fraction`` is ignored, and ``val_fraction`` of the
    remaining patients form validation. The result is checked for leakage before it is
    returned (an official list that puts a patient on both sides raises
    :class:`LeakageError`).
    """
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    rng = random.Random(seed)
    if test_names is not None:
        test_set = set(test_names)
        test = [r for r in records if r.image_index in test_set]
        rest = [r for r in records if r.image_index not in test_set]
        patients = sorted({r.patient_id for r in rest})
        rng.shuffle(patients)
        val_p = set(patients[:round(len(patients) * val_fraction)])
        split = Split(train=[r for r in rest if r.patient_id not in val_p],
                      val=[r for r in rest if r.patient_id in val_p], test=test)
    else:
        if not 0 <= test_fraction < 1 or val_fraction + test_fraction >= 1:
            raise ValueError(f"bad fractions: val={val_fraction}, test={test_fraction}")
        patients = sorted({r.patient_id for r in records})
        rng.shuffle(patients)
        n_test = round(len(patients) * test_fraction)
        n_val = round(len(patients) * val_fraction)
        test_p = set(patients[:n_test])
        val_p = set(patients[n_test:n_test + n_val])
        split = Split(
            train=[r for r in records if r.patient_id not in test_p | val_p],
            val=[r for r in records if r.patient_id in val_p],
            test=[r for r in records if r.patient_id in test_p],
        )
    split.check_no_leakage()
    return split


def class_prevalence(records: Sequence[ImageRecord]) -> dict[str, float]:
    """Fraction of images carrying each pathology, plus ``No Finding``."""
    n = len(records)
    counts: Counter[str] = Counter()
    for r in records:
        names = parse_finding_labels(r.finding_labels)
        counts.update(names or [NO_FINDING])
    keys = (*PATHOLOGIES, NO_FINDING)
    return {k: (counts[k] / n if n else 0.0) for k in keys}


@dataclass
class NIHDataset:
    """A ChestX-ray14-style folder: metadata, where each image is, and the official lists."""

    root: Path
    records: list[ImageRecord]
    image_paths: dict[str, Path]
    train_val_names: list[str] = field(default_factory=list)
    test_names: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, data_dir: Path | str, require_split_lists: bool = True) -> "NIHDataset":
        """Load ``DATA_DIR``. Split lists are required unless ``require_split_lists=False``.

        Raises :class:`DataFormatError` for a bad CSV, a missing list, a listed image that is
        not in the CSV, or an image in both lists.
        """
        root = Path(data_dir)
        if not root.is_dir():
            raise DataFormatError(root, "data directory not found")
        records = read_data_entry(root / CSV_NAME)
        images = find_images(root)
        train_val: list[str] = []
        test: list[str] = []
        if require_split_lists or (root / TRAIN_VAL_LIST).exists():
            train_val = read_split_list(root / TRAIN_VAL_LIST)
        if require_split_lists or (root / TEST_LIST).exists():
            test = read_split_list(root / TEST_LIST)
        known = {r.image_index for r in records}
        for list_name, names in ((TRAIN_VAL_LIST, train_val), (TEST_LIST, test)):
            unknown = [n for n in names if n not in known]
            if unknown:
                raise DataFormatError(root / list_name, f"{len(unknown)} image(s) not in "
                                      f"{CSV_NAME}, e.g. {unknown[:3]}")
        both = set(train_val) & set(test)
        if both:
            raise DataFormatError(root / TEST_LIST, f"{len(both)} image(s) are also in "
                                  f"{TRAIN_VAL_LIST}, e.g. {sorted(both)[:3]}")
        return cls(root=root, records=records, image_paths=images, train_val_names=train_val,
                   test_names=test)

    def missing_images(self) -> list[str]:
        """Names in the CSV whose PNG is not on disk (e.g. only some archives unpacked)."""
        return [r.image_index for r in self.records if r.image_index not in self.image_paths]

    def split(self, val_fraction: float = 0.1, seed: int = 0) -> Split:
        """Official test list as test; ``val_fraction`` of the train_val patients as val.

        Without split lists, draws a 70/10/20 patient-level split.
        """
        if self.test_names:
            return patient_split(self.records, val_fraction, seed=seed,
                                 test_names=self.test_names)
        return patient_split(self.records, val_fraction, 0.2, seed)

    def labels(self) -> np.ndarray:
        """``(n_images, 14)`` multi-hot matrix in CSV order."""
        return np.stack([r.labels for r in self.records]) if self.records else \
            np.zeros((0, len(PATHOLOGIES)), np.float32)
