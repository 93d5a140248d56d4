"""The files of a training run in its ``out_dir``: names, checkpoint state, strict JSON.

::

    checkpoints/last.keras        model + optimizer after the last finished epoch (resume)
    checkpoints/state.json        epoch, best score, LR-plateau state, per-epoch history
    checkpoints/best.weights.h5   weights of the best epoch
    log.csv                       one row per epoch (:func:`read_csv_log`)
    tensorboard/                  TensorBoard logs
    metrics.json                  what :func:`chexnet_utils.training.train` measured

:func:`load_checkpoint` reads the last checkpoint back (``state["epoch"]`` finished epochs),
:func:`read_state` only its ``state.json``; :func:`write_json_atomic` writes strict JSON
(NaN as ``null``: :func:`json_safe`) crash-safely. Writing the checkpoints at every epoch end
is the ``Checkpointer`` callback of :mod:`chexnet_utils.train_callbacks`.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any


from chexnet_utils.atomic import json_safe, write_json_atomic

if TYPE_CHECKING:
    import keras

__all__ = [
    "BEST_NAME",
    "CHECKPOINT_DIR",
    "CSV_NAME",
    "LAST_NAME",
    "METRICS_NAME",
    "STATE_FORMAT",
    "STATE_NAME",
    "TENSORBOARD_DIR",
    "json_safe",
    "load_checkpoint",
    "nan_if_none",
    "read_csv_log",
    "read_state",
    "write_json_atomic",
]

CHECKPOINT_DIR = "checkpoints"
LAST_NAME = "last.keras"
BEST_NAME = "best.weights.h5"
STATE_NAME = "state.json"
CSV_NAME = "log.csv"
TENSORBOARD_DIR = "tensorboard"
METRICS_NAME = "metrics.json"
STATE_FORMAT = "chexnet_utils.training/1"  # frozen: checkpoints written before the split load


def nan_if_none(v: Any) -> float:
    """``None`` (a NaN after :func:`json_safe`) back to NaN; anything else as a float."""
    return math.nan if v is None else float(v)


def read_state(ckpt_dir: Path) -> dict[str, Any] | None:
    """The ``state.json`` of a checkpoint folder; ``None`` unless it and ``last.keras`` exist.

    Raises ``ValueError`` for a ``state.json`` of another format.
    """
    state_path = ckpt_dir / STATE_NAME
    if not (state_path.is_file() and (ckpt_dir / LAST_NAME).is_file()):
        return None
    state = json.loads(state_path.read_text(encoding="utf-8"))
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"{state_path}: not a checkpoint state written by chexnet_utils.training")
    return state


def load_checkpoint(out_dir: Path | str) -> tuple[keras.Model, dict[str, Any]]:
    """The last checkpoint of a run: ``(model with optimizer state, state dict)``.

    ``state["epoch"]`` is the number of finished epochs; training resumes at that (0-based)
    epoch index. Raises ``FileNotFoundError`` when there is no checkpoint.
    """
    import keras

    from chexnet_utils.models import custom_objects

    ckpt_dir = Path(out_dir) / CHECKPOINT_DIR
    state = read_state(ckpt_dir)
    if state is None:
        raise FileNotFoundError(f"{ckpt_dir}: no checkpoint ({LAST_NAME} + {STATE_NAME})")
    model = keras.saving.load_model(ckpt_dir / LAST_NAME, custom_objects=custom_objects(),
                                    compile=True)
    return model, state


def read_csv_log(out_dir: Path | str) -> list[dict[str, str]]:
    """The rows of ``out_dir/log.csv`` (one per epoch, across resumes)."""
    with (Path(out_dir) / CSV_NAME).open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))
