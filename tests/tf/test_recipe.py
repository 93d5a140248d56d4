"""One data-parallel recipe (issue 50): the scaling benchmark's step and train()'s step are
compiled by the same :class:`~chexnet_utils.training.dataparallel.Recipe`, so for the same
config they build the same optimizer, learning rate and gradient averaging. In-process (no
engines): only the broadcast needs Horovod running, and it is recorded instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chexnet_utils.bench import scaling
from chexnet_utils.data.labels import NUM_CLASSES
from chexnet_utils.model.accelerator import resolve_switches
from chexnet_utils.model.models import WeightedBCE, build_chexnet
from chexnet_utils.training import TrainConfig, dataparallel, loop
from chexnet_utils.training.horovod_keras import AVERAGERS

SIZE = 2  # workers


@pytest.fixture
def broadcasts(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """``broadcast_initial_state`` recorded, not run (it needs ``hvd.init()`` on N ranks)."""
    seen: list[Any] = []
    monkeypatch.setattr(dataparallel, "broadcast_initial_state",
                        lambda model, distributed=False: seen.append((model, distributed)))
    return seen


def optimizer_of(model: Any) -> dict[str, Any]:
    """What the step does with the gradients: the optimizer's class and config (name aside),
    the averaging, XLA."""
    config = {k: v for k, v in model.optimizer.get_config().items() if k != "name"}
    return {"optimizer": type(model.optimizer).__name__, "config": config,
            "built": model.optimizer.built, "reducer": model.gradient_reducer,
            "jit_compile": model.jit_compile, "loss": type(model.loss).__name__}


def train_model(tmp_path: Path, **cfg: Any) -> Any:
    """The model train() compiles for ``SIZE`` workers (its ``_load_or_build``, fresh)."""
    config = TrainConfig(tfrecords=tmp_path, out_dir=tmp_path, image_size=32, distributed=True,
                         **cfg)
    switches = resolve_switches(config.mixed_precision, config.xla, config.device_feed,
                                distributed=True)
    loss = WeightedBCE(np.full(NUM_CLASSES, 0.5), np.full(NUM_CLASSES, 0.5))
    model, state = loop._load_or_build(config, None, SIZE, switches, loss, print)
    assert state["epoch"] == 0
    return model


def test_bench_scaling_times_the_step_train_builds(tmp_path: Path, broadcasts: list[Any]) -> None:
    bench = build_chexnet("small", 32)
    scaling.prepare_data_parallel_model(bench, SIZE)
    trained = train_model(tmp_path)
    assert optimizer_of(bench) == optimizer_of(trained)
    assert optimizer_of(bench)["reducer"] is AVERAGERS["per_tensor"]
    assert float(bench.optimizer.learning_rate) == pytest.approx(
        TrainConfig.learning_rate * SIZE)  # linear scaling, the default
    assert broadcasts == [(bench, True)]  # change 5, after the optimizer is built


def test_the_recipe_follows_the_config(tmp_path: Path) -> None:
    """A config that asks for another learning rate, scaling or averaging gets it: the recipe
    is derived from the config, not equal to the benchmark's by coincidence."""
    model = train_model(tmp_path, learning_rate=0.01, lr_scaling="sqrt", allreduce="grouped")
    assert float(model.optimizer.learning_rate) == pytest.approx(0.01 * np.sqrt(SIZE))
    assert model.gradient_reducer is AVERAGERS["grouped"]
    recipe = dataparallel.Recipe.of(TrainConfig(tfrecords=tmp_path, out_dir=tmp_path,
                                                learning_rate=0.01, lr_scaling="sqrt",
                                                allreduce="grouped", distributed=True))
    assert recipe == dataparallel.Recipe(0.01, True, "sqrt", "grouped", True)
    one = dataparallel.Recipe.of(TrainConfig(tfrecords=tmp_path, out_dir=tmp_path))
    assert one.worker_learning_rate(SIZE) == TrainConfig.learning_rate  # not distributed


def test_train_config_takes_its_defaults_from_the_recipe() -> None:
    assert dataparallel.Recipe.of(TrainConfig(tfrecords=".", out_dir=".", distributed=True)) \
        == scaling.BENCH_RECIPE
