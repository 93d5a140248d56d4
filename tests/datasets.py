"""The small synthetic data sets the tests train and convert: one place that makes them.

``synthetic_tfrecords(root, n, size, shard_size)`` generates ``n`` NIH-format images of
``size`` px under ``root/data`` (one worker, fixed seed) and converts them to TFRecords with
``shard_size`` images per shard under ``root/tfrecords``; it returns the TFRecords folder.
"""

from __future__ import annotations

from pathlib import Path


def synthetic_tfrecords(root: Path, n: int, size: int, shard_size: int, seed: int = 0) -> Path:
    """Generate ``n`` synthetic images of ``size`` px and convert them; the TFRecords folder."""
    from chexnet_utils.synthetic import generate_dataset
    from chexnet_utils.tfrecords import convert_dataset

    data = generate_dataset(root / "data", n=n, size=size, seed=seed, workers=1, progress=False)
    convert_dataset(data, root / "tfrecords", shard_size=shard_size, workers=1, progress=False)
    return root / "tfrecords"
