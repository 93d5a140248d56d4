"""One call that every notebook starts with: the data set for this scale, ready to read.

If ``CHEXNET_DATA_DIR`` points at a ChestX-ray14 folder (the real download), it is loaded
as it is. Otherwise the synthetic stand-in for ``CHEXNET_SCALE`` is generated on first use
in ``data/synthetic-<scale>/`` (and reused afterwards). Two processes that prepare the same
folder at once (two notebooks opened together, a notebook and ``make tutorial``) take turns:
the second waits on a lock on the folder (:func:`~chexnet_utils.platform.atomic.folder_lock`) and
then finds it made.
"""

from __future__ import annotations

from pathlib import Path

from chexnet_utils.config import Scale, data_dir, scale, using_real_data, work_dir
from chexnet_utils.data.nih import NIHDataset
from chexnet_utils.platform.atomic import folder_lock

SYNTHETIC_SEED = 0


def prepare_data(s: Scale | None = None, progress: bool = True) -> NIHDataset:
    """Load the real data set, or make sure the synthetic one exists and load it."""
    s = s or scale()
    root = data_dir(s)
    if not using_real_data():
        from chexnet_utils.data.synthetic import ensure_dataset

        root.mkdir(parents=True, exist_ok=True)
        with folder_lock(root, waiting=f"waiting for another process that prepares {root}"):
            ensure_dataset(root, n=s.n_images, size=s.source_size, seed=SYNTHETIC_SEED,
                           progress=progress)
    return NIHDataset.load(root)


def tfrecords_dir(image_size: int | None = None) -> Path:
    """Where :func:`prepare_tfrecords` puts shards: ``<work dir>/tfrecords-<px|full>``."""
    return work_dir() / f"tfrecords-{image_size or 'full'}"


def prepare_tfrecords(image_size: int | None = None, s: Scale | None = None,
                      workers: int | None = None, progress: bool = True) -> Path:
    """Convert the data set of :func:`prepare_data` to TFRecords once; reuse them afterwards.

    ``image_size=None`` stores the original images (1024 px for NIH); an integer resizes at
    conversion time. Shard size comes from the scale preset. A finished conversion with the
    same parameters is detected from its manifest and reused as is (a few milliseconds); an
    interrupted one resumes.
    """
    from chexnet_utils.data.tfrecords import convert_dataset

    s = s or scale()
    ds = prepare_data(s, progress=progress)
    out = tfrecords_dir(image_size)
    out.mkdir(parents=True, exist_ok=True)
    with folder_lock(out, waiting=f"waiting for another process that converts into {out}"):
        convert_dataset(ds.root, out, image_size=image_size, shard_size=s.shard_size,
                        workers=workers, progress=progress)
    return out
