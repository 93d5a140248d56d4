"""The small data sets the tests train and convert, and the helpers that read them back: one
place that makes them.

``synthetic_tfrecords(root, n, size, shard_size)`` generates ``n`` NIH-format images of
``size`` px under ``root/data`` (one worker, fixed seed) and converts them to TFRecords with
``shard_size`` images per shard under ``root/tfrecords``; it returns the TFRecords folder
(``tests/conftest.py``: ``make_tfrecords`` makes each parameter set once per session,
``hvd_tfrecords`` and ``tiny_tfrecords`` are the sets several test files share).

``make_dataset(root)`` writes a tiny NIH-layout folder with PIL (CSV, split lists,
``images_001/images/*.png``); ``read_all``, ``shard_bytes`` and ``split_lines`` read a
conversion's output back for the TFRecords tests; ``write_records`` writes hand-made records
as one shard and ``multihot_matrix`` stacks label rows (what only the tests need).
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from PIL import Image

from chexnet_utils.data import tfrecords as T
from chexnet_utils.data.labels import NUM_CLASSES, labels_to_multihot
from chexnet_utils.data.nih import (
    CSV_NAME,
    TEST_LIST,
    TRAIN_VAL_LIST,
    ImageRecord,
    write_data_entry,
    write_split_list,
)
from chexnet_utils.data.tfrecords.wire import frame_record


def synthetic_tfrecords(root: Path, n: int, size: int, shard_size: int, seed: int = 0) -> Path:
    """Generate ``n`` synthetic images of ``size`` px and convert them; the TFRecords folder."""
    from chexnet_utils.data.synthetic import generate_dataset
    from chexnet_utils.data.tfrecords import convert_dataset

    data = generate_dataset(root / "data", n=n, size=size, seed=seed, workers=1, progress=False)
    convert_dataset(data, root / "tfrecords", shard_size=shard_size, workers=1, progress=False)
    return root / "tfrecords"


LABELS = ["No Finding", "Cardiomegaly", "Effusion|Mass", "Hernia", "Atelectasis|Pneumonia|Edema",
          "No Finding", "Pleural_Thickening", "Infiltration|Nodule"]


def grey_image(i: int, size: int) -> np.ndarray:
    """Noise plus a smooth disc: compresses like a radiograph, differs per image."""
    rng = np.random.default_rng(i)
    yy, xx = np.mgrid[:size, :size]
    cx, cy, r = rng.uniform(size * 0.3, size * 0.7, 2).tolist() + [size * rng.uniform(0.15, 0.3)]
    disc = np.clip(1.0 - np.hypot(xx - cx, yy - cy) / r, 0, 1) * 120
    base = 60 + 40 * xx / size + rng.normal(0, 12, (size, size))
    return np.clip(base + disc, 0, 255).astype(np.uint8)


def make_dataset(root: Path, n_train_val: int = 24, n_test: int = 8, size: int = 64,
                 first_patient: int = 1) -> tuple[Path, list[ImageRecord]]:
    """An NIH-layout folder: CSV, split lists, ``images_001/images/*.png``."""
    img_dir = root / "images_001" / "images"
    img_dir.mkdir(parents=True)
    records = []
    n = n_train_val + n_test
    for i in range(n):
        name = f"{i + 1:08d}_000.png"
        Image.fromarray(grey_image(i, size)).save(img_dir / name)
        records.append(ImageRecord(name, LABELS[i % len(LABELS)], 0, first_patient + i // 2,
                                   30 + i % 50, "MF"[i % 2], "PA", size, size, 0.143, 0.143))
    # Test patients must not also be in train_val: test images are the last n_test, and
    # n_train_val is even, so patient pairs never straddle the boundary.
    assert n_train_val % 2 == 0
    write_data_entry(root / CSV_NAME, records)
    write_split_list(root / TRAIN_VAL_LIST, [r.image_index for r in records[:n_train_val]])
    write_split_list(root / TEST_LIST, [r.image_index for r in records[n_train_val:]])
    return root, records


def image_path(root: Path, name: str) -> Path:
    """Where :func:`make_dataset` put the image ``name``."""
    return root / "images_001" / "images" / name


def png_bytes(im: Image.Image) -> bytes:
    """``im`` encoded as PNG."""
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def read_all(out: Path) -> dict[str, dict]:
    """Every record of every split via the pure reader: name -> fields (+ split, shard)."""
    found: dict[str, dict] = {}
    for split in T.SPLITS:
        for shard in T.list_shards(out, split):
            for ex in T.read_examples(shard):
                assert ex["name"] not in found, f"{ex['name']} stored twice"
                found[ex["name"]] = {**ex, "split": split, "shard": shard.name}
    return found


def shard_bytes(out: Path) -> dict[str, bytes]:
    """Shard file name -> its bytes, for every shard in ``out``."""
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.tfrecord"))}


def split_lines(summary: str) -> dict[str, str]:
    """The per-split lines of ConversionResult.summary()."""
    return {m.group(1): m.group(0) for m in re.finditer(r"^  (train|val|test) .*$", summary,
                                                        re.MULTILINE)}


def multihot_matrix(finding_labels: Iterable[str]) -> np.ndarray:
    """Stack :func:`labels_to_multihot` over many rows: shape ``(n, 14)``, float32."""
    rows = [labels_to_multihot(f) for f in finding_labels]
    if not rows:
        return np.zeros((0, NUM_CLASSES), dtype=np.float32)
    return np.stack(rows)


def write_records(path: Path | str, records: Iterable[bytes]) -> str:
    """Write records to ``path`` (not atomically); returns the sha256 of the file."""
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for data in records:
            chunk = frame_record(data)
            digest.update(chunk)
            f.write(chunk)
    return digest.hexdigest()
