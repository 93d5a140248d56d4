"""The GPU-only branches that need TensorFlow, exercised on a CPU with fakes: pinning one GPU
per local rank, the mixed-precision and XLA switches in this process, the mixed-precision model,
the device stage of the pipeline, and training with mixed precision. The pure GPU-path tests are
in tests/unit/test_gpu_paths.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from chexnet_utils.hardware import devices
from chexnet_utils.input import pipelines
from chexnet_utils.model import accelerator


class FakeTfConfig:
    """What ``pin_process`` calls on ``tf.config``, recording the calls."""

    def __init__(self, n_gpus: int) -> None:
        self.gpus = [SimpleNamespace(name=f"/physical_device:GPU:{i}", device_type="GPU")
                     for i in range(n_gpus)]
        self.visible: list[Any] = []
        self.growth: list[tuple[Any, bool]] = []
        self.experimental = SimpleNamespace(
            set_memory_growth=lambda d, on: self.growth.append((d, on)))

    def list_physical_devices(self, kind: str) -> list[Any]:
        return list(self.gpus) if kind == "GPU" else []

    def set_visible_devices(self, device: Any, kind: str) -> None:
        self.visible.append((device, kind))


def test_pin_process_one_gpu_per_local_rank_with_memory_growth(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tf = pytest.importorskip("tensorflow")
    fake = FakeTfConfig(4)
    monkeypatch.setattr(tf, "config", fake)
    placement = devices.pin_process(2, 4)
    assert placement == devices.Placement("GPU:2", None, 2, 4)
    assert fake.visible == [(fake.gpus[2], "GPU")]
    assert fake.growth == [(fake.gpus[2], True)]


def test_pin_process_with_too_few_gpus_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    tf = pytest.importorskip("tensorflow")
    fake = FakeTfConfig(2)
    monkeypatch.setattr(tf, "config", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(RuntimeError, match=r"4 processes on this node but only 2 GPU") as e:
        devices.pin_process(3, 4)
    assert "CUDA_VISIBLE_DEVICES=0,1" in str(e.value) and "mpirun -np 2" in str(e.value)
    assert fake.visible == [] and fake.growth == []  # nothing was pinned


def test_switches_default_on_with_a_gpu_and_off_without() -> None:
    on = accelerator.resolve_switches(has_gpu=True, env={})
    assert (on.mixed_precision, on.xla, on.device_feed, on.policy) == (
        True, True, True, "mixed_float16")
    off = accelerator.resolve_switches(has_gpu=False, env={})
    assert (off.mixed_precision, off.xla, off.device_feed, off.policy) == (
        False, False, False, "float32")
    assert "no GPU" in off.why["xla"]
    # the real process: this CI machine has no GPU
    if not accelerator.process_gpus():
        here = accelerator.resolve_switches(env={})
        assert not here.mixed_precision and not here.xla


def test_mixed_precision_model_keeps_a_float32_head_and_scales_the_loss() -> None:
    keras = pytest.importorskip("keras")
    from chexnet_utils.model.models import WeightedBCE

    before = keras.config.dtype_policy().name
    model = accelerator.build_model("small", 32, mixed_precision=True)
    assert keras.config.dtype_policy().name == before  # the global policy is restored
    assert model.get_layer("backbone").compute_dtype == "float16"
    head = model.get_layer("predictions")
    assert head.compute_dtype == "float32" and head.variable_dtype == "float32"
    x = np.random.default_rng(0).random((4, 32, 32, 3), dtype=np.float32)
    y = (np.random.default_rng(1).random((4, 14)) > 0.5).astype(np.float32)
    assert str(model(x).dtype) in ("float32", "<dtype: 'float32'>")
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=WeightedBCE(np.full(14, 0.5), np.full(14, 0.5)), jit_compile=False)
    assert type(model.optimizer).__name__ == "LossScaleOptimizer"
    logs = model.train_on_batch(x, y, return_dict=True)
    assert np.isfinite(logs["loss"])
    plain = accelerator.build_model("small", 32, mixed_precision=False)
    assert plain.get_layer("backbone").compute_dtype == "float32"


def test_device_stage_only_with_a_gpu() -> None:
    tf = pytest.importorskip("tensorflow")
    gpu = [SimpleNamespace(name="/physical_device:GPU:0", device_type="GPU")]
    assert pipelines.accelerator_device(True, gpu) == "/gpu:0"
    assert pipelines.accelerator_device(True, []) == "/cpu:0"  # forced on: the same stage
    assert pipelines.accelerator_device(False, gpu) is None
    if not tf.config.get_visible_devices("GPU"):
        assert pipelines.accelerator_device(True) == "/cpu:0"
    ds = tf.data.Dataset.range(3)
    assert pipelines.to_accelerator(ds, None) is ds


def test_device_stage_delivers_batches_on_the_device() -> None:
    tf = pytest.importorskip("tensorflow")
    ds = tf.data.Dataset.from_tensor_slices(np.arange(12, dtype=np.float32)).batch(4)
    staged = pipelines.to_accelerator(ds, "/cpu:0")  # the same code path, on the CPU here
    assert staged is not ds
    batches = list(staged)
    assert [b.numpy().tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert all(b.device.endswith("CPU:0") for b in batches)


def test_train_with_mixed_precision_and_resume(tiny_tfrecords: Path, tmp_path: Path) -> None:
    from chexnet_utils.training import TrainConfig, load_checkpoint, train

    cfg = dict(tfrecords=tiny_tfrecords, out_dir=tmp_path / "mp", arch="small", image_size=32,
               batch_size=8, epochs=1, steps_per_epoch=2, tensorboard=False, verbose=0,
               mixed_precision=True, xla=False, device_feed=True)  # (XLA: the gpu-smoke test)
    first = train(TrainConfig(**cfg))
    metrics = json.loads(first.metrics_path.read_text())
    assert metrics["accelerator"]["mixed_precision"] is True
    assert metrics["accelerator"]["xla"] is False
    assert metrics["accelerator"]["device_feed"] is True
    assert np.isfinite(metrics["history"]["loss"][-1])
    assert first.model.get_layer("predictions").compute_dtype == "float32"
    again = train(TrainConfig(**{**cfg, "epochs": 2, "resume": True}))
    assert (again.initial_epoch, again.epochs) == (1, 2)
    assert type(again.model.optimizer).__name__ == "LossScaleOptimizer"
    with accelerator.policy_scope(True):  # how train() reloads a mixed-precision checkpoint
        model, state = load_checkpoint(cfg["out_dir"])
    assert state["mixed_precision"] is True and state["optimizer_iterations"] == 4
    assert int(model.optimizer.iterations.numpy()) == 4
