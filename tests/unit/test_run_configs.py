"""Notebook 04's engine training configuration is a valid ``TrainConfig`` (the engines build
one from it), with the preset's fields and the run's overrides."""

from __future__ import annotations

from chexnet_utils import config
from chexnet_utils.training import TrainConfig, run_configs


def test_engine_train_config_builds_a_train_config(tmp_path):
    s = config.scale("ci")
    cfg = TrainConfig(**run_configs.engine_train_config(tmp_path / "shards", tmp_path / "run", s,
                                                        lr_scaling="linear", verbose=0))
    assert (cfg.arch, cfg.image_size, cfg.batch_size, cfg.epochs) == (
        s.arch, s.image_size, s.batch_size, s.epochs)
    assert cfg.lr_scaling == "linear" and cfg.verbose == 0 and cfg.tensorboard is False
    assert str(cfg.out_dir) == str(tmp_path / "run")
