"""Notebooks 04's and 08's engine runs: ``TrainConfig.from_scale``, a valid ``TrainConfig``
with the preset's fields and the run's overrides, that travels to the engines as it is."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

from chexnet_utils import config
from chexnet_utils.training import TrainConfig


def test_from_scale_takes_the_preset_and_lets_overrides_win(tmp_path):
    s = config.scale("workstation")
    cfg = TrainConfig.from_scale(tmp_path / "shards", tmp_path / "run", s, epochs=50, verbose=0,
                                 lr_scaling="sqrt")
    assert (cfg.tfrecords, cfg.out_dir) == (tmp_path / "shards", tmp_path / "run")
    assert (cfg.arch, cfg.image_size, cfg.batch_size) == (s.arch, s.image_size, s.batch_size)
    assert (cfg.epochs, cfg.verbose, cfg.seed, cfg.lr_scaling) == (50, 0, 0, "sqrt")
    assert cfg.tensorboard is False
    cfg.validate_values()
    # the next run of a notebook changes a field or two; a config pickles (cluster.run)
    resumed = dataclasses.replace(cfg, resume=True, epochs=52)
    assert (resumed.resume, resumed.epochs, resumed.arch) == (True, 52, s.arch)
    assert pickle.loads(pickle.dumps(resumed)) == resumed


def test_from_scale_defaults_to_the_environment_preset(tmp_path, monkeypatch):
    monkeypatch.setenv("CHEXNET_SCALE", "ci")
    monkeypatch.setenv("CHEXNET_EPOCHS", "3")
    cfg = TrainConfig.from_scale(str(tmp_path), str(tmp_path))
    assert cfg.epochs == 3 and cfg.arch == config.scale("ci").arch
    assert isinstance(cfg.out_dir, Path)
