"""Keras 3's own loader: the pipelines' decode in a ``keras.utils.PyDataset`` (notebook 07).

:class:`DecodePyDataset` reads the encoded records into memory once and decodes one batch per
``__getitem__`` in Python (PIL + NumPy); ``workers`` threads, or processes with
``use_multiprocessing=True``, call it in parallel (Keras 3's successor of ``fit``'s
``workers=`` / ``use_multiprocessing=``). :func:`pydataset_rate` times one pass through Keras'
own enqueuer, as ``fit`` uses it. Notebook 07 writes the same class in a cell and checks it
against this one. This module imports Keras; the rest of the feeding toolbox
(:mod:`chexnet_utils.input.feeding`) does not.
"""

from __future__ import annotations

import io
import time
from typing import Any

import keras
import numpy as np
import psutil
from keras.src.trainers.data_adapters import get_data_adapter
from PIL import Image

from chexnet_utils.data.tfrecords import read_examples
from chexnet_utils.input.pipelines import IMAGENET_MEAN, IMAGENET_STD, Files

__all__ = ["DecodePyDataset", "pydataset_rate"]


def _load_records(files: Files) -> tuple[list[bytes], np.ndarray]:
    blobs, labels = [], []
    for f in files:
        for ex in read_examples(f):
            blobs.append(ex["image_bytes"])
            labels.append(ex["label"])
    return blobs, np.asarray(labels, np.float32)


def _decode_numpy(blob: bytes, image_size: int) -> np.ndarray:
    """PIL decode + bilinear resize + ImageNet normalisation (as :func:`~chexnet_utils.
    pipelines.preprocess` without the flip)."""
    im = Image.open(io.BytesIO(blob)).convert("L").resize((image_size, image_size),
                                                          Image.Resampling.BILINEAR)
    x = np.asarray(im, np.float32)[..., None] / 255.0
    return (x - np.asarray(IMAGENET_MEAN, np.float32)) / np.asarray(IMAGENET_STD, np.float32)


class DecodePyDataset(keras.utils.PyDataset):
    """A ``keras.utils.PyDataset`` that decodes the records of ``files`` in Python (PIL +
    NumPy): batches of ``batch_size`` images of ``image_size`` px and their labels.

    The encoded records are read into memory once; ``__getitem__`` decodes one batch.
    ``workers`` threads (or processes with ``use_multiprocessing=True``) call it in
    parallel; the decoded batches come back through a queue (pickled between processes).
    """

    def __init__(self, files: Files, batch_size: int, image_size: int, workers: int = 1,
                 use_multiprocessing: bool = False, max_queue_size: int = 10) -> None:
        super().__init__(workers=workers, use_multiprocessing=use_multiprocessing,
                         max_queue_size=max_queue_size)
        self.blobs, self.labels = _load_records(files)
        self.batch_size, self.image_size = batch_size, image_size

    def __len__(self) -> int:
        return len(self.blobs) // self.batch_size

    def __getitem__(self, idx: int) -> tuple[np.ndarray, np.ndarray]:
        sl = slice(idx * self.batch_size, (idx + 1) * self.batch_size)
        return (np.stack([_decode_numpy(b, self.image_size) for b in self.blobs[sl]]),
                self.labels[sl])


def pydataset_rate(dataset: Any, n_batches: int | None = None) -> dict[str, float]:
    """Images/s and CPU use (process + children CPU seconds per wall second) of one pass
    of a ``PyDataset`` (through Keras' own enqueuer, as ``fit`` uses it)."""
    adapter = get_data_adapter(dataset)
    me = psutil.Process()

    seen: dict[int, float] = {}  # last CPU seconds of each child (pool workers may exit)

    def cpu() -> float:
        own = time.process_time()  # this process's threads, ns resolution (cpu_times: ticks)
        for c in me.children(recursive=True):
            try:
                ct = c.cpu_times()
                seen[c.pid] = ct.user + ct.system
            except psutil.Error:
                pass
        return own + sum(seen.values())

    c0, t0, n = cpu(), time.perf_counter(), 0
    for i, (x, _y) in enumerate(adapter.get_numpy_iterator()):
        n += len(x)
        cpu()  # sample the children while they run
        if n_batches is not None and i + 1 >= n_batches:
            break
    wall = time.perf_counter() - t0
    used = cpu() - c0
    adapter.on_epoch_end()
    return {"img_per_s": n / wall, "cpu_cores_used": used / wall, "images": n,
            "seconds": wall}
