"""One call that every notebook starts with: the data set for this scale, ready to read.

If ``CHEXNET_DATA_DIR`` points at a ChestX-ray14 folder (the real download), it is loaded
as it is. Otherwise the synthetic stand-in for ``CHEXNET_SCALE`` is generated on first use
in ``data/synthetic-<scale>/`` (and reused afterwards).
"""

from __future__ import annotations

from chexnet_utils.config import Scale, data_dir, scale, using_real_data
from chexnet_utils.nih import NIHDataset

SYNTHETIC_SEED = 0


def prepare_data(s: Scale | None = None, progress: bool = True) -> NIHDataset:
    """Load the real data set, or make sure the synthetic one exists and load it."""
    s = s or scale()
    root = data_dir(s)
    if not using_real_data():
        from chexnet_utils.synthetic import ensure_dataset

        ensure_dataset(root, n=s.n_images, size=s.source_size, seed=SYNTHETIC_SEED,
                       progress=progress)
    return NIHDataset.load(root)
