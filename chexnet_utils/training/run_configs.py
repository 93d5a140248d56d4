"""Training configurations for runs on the MPI engines, filled in from the scale preset.

``training.train_on_engine`` takes a plain dict (it travels to the engines by value). Every
run of notebook 04 starts from the same one, the preset's model, image size, batch and epochs
on the given TFRecords, and changes a field or two: :func:`engine_train_config` builds it.
"""

from __future__ import annotations

import os
from typing import Any

from chexnet_utils.config import Scale, scale


def engine_train_config(tfrecords: str | os.PathLike[str], out_dir: str | os.PathLike[str],
                        s: Scale | None = None, **overrides: Any) -> dict[str, Any]:
    """The keyword arguments of :class:`chexnet_utils.training.TrainConfig` for one run:
    ``s``'s (default: :func:`chexnet_utils.config.scale`) architecture, image size, batch size
    and epochs, no TensorBoard, one log line per epoch, seed 0; ``overrides`` win."""
    s = s or scale()
    cfg: dict[str, Any] = dict(tfrecords=str(tfrecords), out_dir=str(out_dir), arch=s.arch,
                               image_size=s.image_size, batch_size=s.batch_size,
                               epochs=s.epochs, tensorboard=False, verbose=2, seed=0)
    cfg.update(overrides)
    return cfg
