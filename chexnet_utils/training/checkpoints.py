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
(NaN as ``null``: :func:`json_safe`) crash-safely, :func:`write_checkpoint` the three
checkpoint files as one consistent set. Writing the checkpoints at every epoch end is the
``Checkpointer`` callback of :mod:`chexnet_utils.training.callbacks`.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chexnet_utils.platform.atomic import (
    create_temp,
    fsync_dir,
    fsync_file,
    json_safe,
    write_json_atomic,
)
from chexnet_utils.platform.lazy import lazy_module

if TYPE_CHECKING:
    import keras

# Keras: imported on first use (chexnet_utils.platform.lazy)
if not TYPE_CHECKING:
    keras = lazy_module("keras")

__all__ = [
    "BEST_NAME",
    "CHECKPOINT_DIR",
    "CSV_NAME",
    "LAST_NAME",
    "METRICS_NAME",
    "STATE_FORMAT",
    "STATE_NAME",
    "TENSORBOARD_DIR",
    "discard_uncommitted",
    "json_safe",
    "load_checkpoint",
    "nan_if_none",
    "read_csv_log",
    "read_state",
    "write_checkpoint",
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

    First finishes a :func:`write_checkpoint` that was cut short after its commit point, so
    ``last.keras`` and ``best.weights.h5`` are always those of the epoch ``state.json`` names.
    Raises ``ValueError`` for a ``state.json`` of another format.
    """
    state_path = ckpt_dir / STATE_NAME
    if not state_path.is_file():
        return None
    state = json.loads(state_path.read_text(encoding="utf-8"))
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"{state_path}: not a checkpoint state written by chexnet_utils.training")
    _install_staged(ckpt_dir, state.pop(_STAGED, None) or {})
    return state if (ckpt_dir / LAST_NAME).is_file() else None


_STAGED = "staged"
"""Key of ``state.json`` naming the temporary files of a checkpoint being installed."""


def _install_staged(ckpt_dir: Path, staged: dict[str, str]) -> None:
    """Rename each staged temporary file (``{final name: temporary name}``) that is still
    there over its final name (a second call, or a second rank, finds nothing left to do)."""
    for name, tmp in staged.items():
        if name in (LAST_NAME, BEST_NAME) and tmp == Path(tmp).name:  # no path from the file
            with contextlib.suppress(FileNotFoundError):
                os.replace(ckpt_dir / tmp, ckpt_dir / name)


def _staged_on_disk(ckpt_dir: Path) -> dict[str, str] | None:
    """The staged names in ``state.json`` as it is on disk now (``None`` if unreadable)."""
    try:
        return json.loads((ckpt_dir / STATE_NAME).read_text(encoding="utf-8")).get(_STAGED)
    except (OSError, ValueError, AttributeError):
        return None


def write_checkpoint(ckpt_dir: Path, state: dict[str, Any],
                     writers: dict[str, Callable[[Path], Any]]) -> None:
    """Write a checkpoint set (``best.weights.h5`` and/or ``last.keras``, then ``state.json``)
    so that a crash anywhere leaves one consistent set, the old or the new.

    ``writers`` maps each file to write (:data:`BEST_NAME`, :data:`LAST_NAME`) to a function
    that writes a given path (``model.save_weights``, ``model.save``). Each goes to a new
    temporary file in ``ckpt_dir`` (:func:`~chexnet_utils.platform.atomic.create_temp`, with the
    suffix Keras wants) and is flushed to disk. Then ``state.json`` is written atomically
    naming those temporary files: that write is the commit point. Then they are renamed into
    place and ``state.json`` rewritten without their names. A crash before the commit leaves
    the old set (and temporary files that :func:`discard_uncommitted` removes); after it,
    :func:`read_state` finishes the renames.
    """
    staged: dict[str, Path] = {}
    names: dict[str, str] = {}
    try:
        for name, write in writers.items():
            staged[name] = create_temp(ckpt_dir, f".{name}.", name[name.index("."):])
            names[name] = staged[name].name
            write(staged[name])
            fsync_file(staged[name])
        write_json_atomic(ckpt_dir / STATE_NAME, {**state, _STAGED: names})
    except BaseException:
        if _staged_on_disk(ckpt_dir) != names:  # not committed (an interrupt may come late)
            for tmp in staged.values():
                tmp.unlink(missing_ok=True)
        raise
    _install_staged(ckpt_dir, names)
    fsync_dir(ckpt_dir)
    write_json_atomic(ckpt_dir / STATE_NAME, state)


def discard_uncommitted(ckpt_dir: Path) -> list[Path]:
    """Remove temporary files of checkpoints that were never committed (a crash while
    :func:`write_checkpoint` was writing them); call after :func:`read_state`, where only
    one process writes. Returns what was removed."""
    removed = []
    for name in (LAST_NAME, BEST_NAME, STATE_NAME):
        for tmp in ckpt_dir.glob(f".{name}.*"):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def load_checkpoint(out_dir: Path | str) -> tuple[keras.Model, dict[str, Any]]:
    """The last checkpoint of a run: ``(model with optimizer state, state dict)``.

    ``state["epoch"]`` is the number of finished epochs; training resumes at that (0-based)
    epoch index. Raises ``FileNotFoundError`` when there is no checkpoint.
    """
    from chexnet_utils.model.models import custom_objects

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
