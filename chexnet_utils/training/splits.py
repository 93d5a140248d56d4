"""The data side of training: what the TFRecords manifest says, and predicting a whole split.

* :func:`training_label_sums` - per-class positive counts and the image count of a split
  (the class weights of the loss, the default ``steps_per_epoch``);
* :func:`split_counts` - images per split;
* :func:`eval_dataset` - the evaluation pipeline of the val and test splits (the new
  approach, no augmentation);
* :func:`predict_split` - ``(y_true, y_score)`` over one pass of such a dataset, whose
  exact AUROC :func:`chexnet_utils.model.auroc.per_class_auroc` computes;
* :func:`loss_value` - a loss over a predicted split, as a float (NaN when it is empty).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from chexnet_utils.data.labels import NUM_CLASSES

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

__all__ = ["eval_dataset", "loss_value", "predict_split", "split_counts", "training_label_sums"]


def training_label_sums(tfrecords_dir: Path | str, split: str = "train"
                        ) -> tuple[np.ndarray, int]:
    """Per-class positive counts and the image count of a split, from the manifest.

    Uses the split totals, or sums the per-shard ``label_sums`` when the totals are absent.
    """
    from chexnet_utils.data.tfrecords import load_manifest

    manifest = load_manifest(tfrecords_dir)
    info = manifest.get("splits", {}).get(split)
    if info and "label_sums" in info:
        sums = np.asarray(info["label_sums"], dtype=np.float64)
        n = int(info["images"])
    else:
        shards = [s for s in manifest.get("shards", []) if s.get("split") == split]
        sums = np.sum([s["label_sums"] for s in shards], axis=0) if shards else np.zeros(
            NUM_CLASSES)
        n = int(sum(s["count"] for s in shards))
    if sums.shape != (NUM_CLASSES,):
        raise ValueError(f"{tfrecords_dir}: manifest label sums have shape {sums.shape}")
    return sums, n


def split_counts(tfrecords_dir: Path) -> dict[str, int]:
    """``{split: images}`` from the manifest of a TFRecords folder."""
    from chexnet_utils.data.tfrecords import load_manifest

    splits = load_manifest(tfrecords_dir).get("splits", {})
    return {name: int(info.get("images", 0)) for name, info in splits.items()}


def eval_dataset(files: Sequence[Path], batch_size: int, image_size: int,
                 antialias: bool) -> tf.data.Dataset:
    """The evaluation dataset of ``files``: the new approach, ``training=False``."""
    from chexnet_utils.input.pipelines import new_approach

    return new_approach(files, batch_size, image_size, training=False, antialias=antialias)


def predict_split(model: keras.Model, dataset: tf.data.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """``(y_true, y_score)`` over one pass of an evaluation dataset of ``(image, label)``.

    Labels and predictions are collected batch by batch in the same pass, so they stay aligned
    even though the pipeline may reorder images (``deterministic=False``).
    """
    ys: list[np.ndarray] = []
    ps: list[np.ndarray] = []
    for batch in dataset:
        x, y = batch[0], batch[1]
        ps.append(np.asarray(model.predict_on_batch(x), dtype=np.float64))
        ys.append(np.asarray(y, dtype=np.float64))
    if not ys:
        return np.zeros((0, NUM_CLASSES)), np.zeros((0, NUM_CLASSES))
    return np.concatenate(ys), np.concatenate(ps)


def loss_value(loss_fn: Any, y_true: np.ndarray, y_score: np.ndarray) -> float:
    """``loss_fn`` over a predicted split as a float; NaN for an empty split."""
    if len(y_true) == 0:
        return math.nan
    return float(np.asarray(loss_fn(y_true.astype(np.float32), y_score.astype(np.float32))))
