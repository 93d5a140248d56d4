"""The pure parts of training's helper modules: the data-parallel seams when not distributed,
the learning-rate scaling rules, and the files of a run's ``out_dir`` (strict JSON, state,
CSV log). Training itself is tested in tests/tf/test_models_training.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from chexnet_utils import training
from chexnet_utils.training import checkpoints, dataparallel


def test_single_worker_seams_are_identities() -> None:
    assert dataparallel.init_world(False) == (0, 1)
    assert dataparallel.gradient_averager(False) is None
    assert dataparallel.broadcast_initial_state(object(), False) is None  # touches nothing


@pytest.mark.parametrize("size", [1, 2, 3, 8])
def test_learning_rate_scaling_rules(size: int) -> None:
    lr = 1e-3
    linear = dataparallel.scaled_learning_rate(lr, size, "linear")
    root = dataparallel.scaled_learning_rate(lr, size, "sqrt")
    assert linear / lr == pytest.approx(size)
    assert (root / lr) ** 2 == pytest.approx(size)
    assert dataparallel.scaled_learning_rate(lr, size, None) == lr
    assert set(dataparallel.LR_SCALINGS) == {"linear", "sqrt"}
    with pytest.raises(ValueError, match="cubic"):
        dataparallel.scaled_learning_rate(lr, size, "cubic")


def test_json_safe_and_atomic_write_round_trip(tmp_path: Path) -> None:
    obj = {"a": np.float32(0.5), "nan": math.nan, "inf": -math.inf, 3: np.int64(7),
           "list": (1.5, np.float64(math.nan)), "path": tmp_path}
    target = tmp_path / "m.json"
    checkpoints.write_json_atomic(target, obj)
    back = json.loads(target.read_text(encoding="utf-8"))  # strict JSON: no NaN literals
    assert back == {"a": 0.5, "nan": None, "inf": None, "3": 7, "list": [1.5, None],
                    "path": str(tmp_path)}
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]
    assert math.isnan(checkpoints.nan_if_none(back["nan"]))
    assert checkpoints.nan_if_none(back["a"]) == 0.5


def test_checkpoint_state_needs_both_files_and_the_format(tmp_path: Path) -> None:
    ckpt = tmp_path / checkpoints.CHECKPOINT_DIR
    ckpt.mkdir()
    state = {"format": checkpoints.STATE_FORMAT, "epoch": 3}
    checkpoints.write_json_atomic(ckpt / checkpoints.STATE_NAME, state)
    assert checkpoints.read_state(ckpt) is None  # no last.keras yet
    (ckpt / checkpoints.LAST_NAME).write_bytes(b"")
    assert checkpoints.read_state(ckpt) == state
    checkpoints.write_json_atomic(ckpt / checkpoints.STATE_NAME, {**state, "format": "x/1"})
    with pytest.raises(ValueError, match="not a checkpoint state"):
        checkpoints.read_state(ckpt)


def test_read_csv_log(tmp_path: Path) -> None:
    (tmp_path / checkpoints.CSV_NAME).write_text("epoch,loss\n0,0.7\n1,0.5\n",
                                                 encoding="utf-8")
    assert checkpoints.read_csv_log(tmp_path) == [{"epoch": "0", "loss": "0.7"},
                                                  {"epoch": "1", "loss": "0.5"}]


def test_training_keeps_the_names_callers_use() -> None:
    """Notebooks, scripts and tests reach these through ``chexnet_utils.training``."""
    for name in ("init_world", "gradient_averager", "broadcast_initial_state",
                 "scaled_learning_rate", "LR_SCALINGS"):
        assert getattr(training, name) is getattr(dataparallel, name)
    from chexnet_utils.training import horovod_keras

    assert training.weights_sha256 is horovod_keras.weights_sha256
    for name in ("CHECKPOINT_DIR", "METRICS_NAME", "BEST_NAME", "LAST_NAME", "STATE_NAME",
                 "TENSORBOARD_DIR", "load_checkpoint", "read_csv_log"):
        assert getattr(training, name) is getattr(checkpoints, name)
    for name in training.__all__:
        assert hasattr(training, name), name
