"""Models, weighted loss, AUROC, the ``train`` function (learning, checkpoints, resume,
metrics.json) and the ``train`` command. Fixture: a tiny synthetic data set (240 images of
64 px) converted to TFRecords once per module; training runs use the ``small`` model."""

from __future__ import annotations

import itertools
import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chexnet_utils import training as T
from chexnet_utils.cli import main
from chexnet_utils.data.labels import NUM_CLASSES, PATHOLOGIES
from chexnet_utils.model import auroc as A
from chexnet_utils.model import models as M
from chexnet_utils.training.splits import eval_dataset
from tests.support.datasets import synthetic_tfrecords

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

N_IMAGES = 240
SOURCE_PX = 64
PX = 64          # model input in the training runs
EPOCHS = 5       # first run; the resume test continues to EPOCHS + 1
BATCH = 16


# --------------------------------------------------------------------------------------------
# fixtures and helpers
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tfr_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_tfrecords(tmp_path_factory.mktemp("train-data"), N_IMAGES, SOURCE_PX, 16)


def snapshot(model: Any) -> dict[str, Any]:
    return {
        "weights": [np.array(w) for w in model.weights],
        "optimizer": {v.path: np.array(v) for v in model.optimizer.variables},
        "iterations": int(model.optimizer.iterations.numpy()),
        "learning_rate": float(np.asarray(model.optimizer.learning_rate)),
    }


class Capture(keras.callbacks.Callback):
    """Model/optimizer state at the start and end of training, epochs run, test AUROC of the
    untrained (or just restored) model."""

    def __init__(self, test_ds: Any = None) -> None:
        super().__init__()
        self.test_ds = test_ds
        self.epochs: list[int] = []
        self.start_auroc = math.nan

    def on_train_begin(self, logs: Any = None) -> None:
        self.begin = snapshot(self.model)
        if self.test_ds is not None:
            self.start_auroc = A.mean_auroc(*T.predict_split(self.model, self.test_ds))

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epochs.append(epoch)

    def on_train_end(self, logs: Any = None) -> None:
        self.end = snapshot(self.model)


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert len(a["weights"]) == len(b["weights"])
    for x, y in zip(a["weights"], b["weights"], strict=True):
        np.testing.assert_array_equal(x, y)
    assert a["optimizer"].keys() == b["optimizer"].keys()
    for k in a["optimizer"]:
        np.testing.assert_array_equal(a["optimizer"][k], b["optimizer"][k], err_msg=k)
    assert a["iterations"] == b["iterations"]
    assert a["learning_rate"] == pytest.approx(b["learning_rate"])


def config(tfr_dir: Path, out: Path, **kw: Any) -> T.TrainConfig:
    base = dict(tfrecords=tfr_dir, out_dir=out, arch="small", image_size=PX,
                batch_size=BATCH, epochs=EPOCHS, seed=0, verbose=0)
    return T.TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def first_run(tfr_dir: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[T.TrainConfig, T.TrainResult, Capture]:
    from chexnet_utils.data.tfrecords import list_shards

    out = tmp_path_factory.mktemp("run") / "run"
    cfg = config(tfr_dir, out)
    test_ds = eval_dataset(list_shards(tfr_dir, "test"), 32, PX, False)
    cap = Capture(test_ds)
    result = T.train(cfg, callbacks=[cap])
    return cfg, result, cap


# --------------------------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,size", [("small", 32), ("small", 128), ("densenet121", 32),
                                       ("densenet121", 64), ("resnet50", 32),
                                       ("resnet50", 64)])
def test_build_output_shape_and_range(arch: str, size: int) -> None:
    model = M.build_chexnet(arch, size)
    assert isinstance(model, M.ChexNet)
    assert model.output_shape == (None, NUM_CLASSES)
    assert model.input_shape == (None, size, size, 3)
    assert model.get_layer("predictions").activation.__name__ == "sigmoid"
    x = np.random.default_rng(0).normal(size=(2, size, size, 3)).astype("float32")
    y = np.asarray(model(x, training=False))
    assert y.shape == (2, NUM_CLASSES)
    assert np.all((y >= 0) & (y <= 1))


def test_build_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown arch 'vgg16'"):
        M.build_chexnet("vgg16", 64)
    missing = tmp_path / "densenet121_weights_tf_dim_ordering_tf_kernels_notop.h5"
    with pytest.raises(FileNotFoundError, match="not found.*Nothing is downloaded"):
        M.build_chexnet("densenet121", 64, weights=missing)
    fake = tmp_path / "x_notop.h5"
    fake.write_bytes(b"not an h5 file")
    with pytest.raises(ValueError, match="'small' has no ImageNet backbone weights"):
        M.build_chexnet("small", 64, weights=fake)
    with pytest.raises(ValueError, match="cannot load as ImageNet backbone weights"):
        M.build_chexnet("resnet50", 32, weights=fake)


def test_full_model_weights_file_roundtrip(tmp_path: Path) -> None:
    a = M.build_chexnet("small", 32)
    for w in a.trainable_weights:
        w.assign(np.random.default_rng(1).normal(size=w.shape).astype("float32"))
    a.save_weights(tmp_path / "a.weights.h5")
    b = M.build_chexnet("small", 32, weights=tmp_path / "a.weights.h5")
    for x, y in zip(a.weights, b.weights, strict=True):
        np.testing.assert_array_equal(np.array(x), np.array(y))


def test_imagenet_notop_file_loads_into_backbone(tmp_path: Path) -> None:
    """A keras-applications style ``*_notop.h5`` (legacy HDF5 of the backbone without the
    classifier) goes into the backbone; the head stays random."""
    src = keras.applications.ResNet50(include_top=False, weights=None, input_shape=(32, 32, 3),
                                      pooling="avg")
    path = tmp_path / "resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5"
    src.save(path)  # legacy HDF5, the format keras-applications ships
    model = M.build_chexnet("resnet50", 64, weights=path)
    for x, y in zip(src.weights, model.get_layer("backbone").weights, strict=True):
        np.testing.assert_array_equal(np.array(x), np.array(y))


def test_gradient_reducer_seam() -> None:
    """``train_step`` sends the gradients through ``gradient_reducer`` (Horovod's allreduce
    slot): a reducer returning zeros leaves the trainable weights unchanged."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 32, 32, 3)).astype("float32")
    y = (rng.random((4, NUM_CLASSES)) < 0.3).astype("float32")
    model = M.build_chexnet("small", 32)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=M.WeightedBCE(
        *M.class_weights_from_prevalence([0.3] * NUM_CLASSES)))
    seen: list[int] = []

    def zero(grads: list[Any]) -> list[Any]:
        seen.append(len(grads))
        return [tf.zeros_like(g) for g in grads]

    model.gradient_reducer = zero
    before = [np.array(w) for w in model.trainable_weights]
    model.train_on_batch(x, y)
    assert seen and seen[0] == len(model.trainable_weights)
    for b, w in zip(before, model.trainable_weights, strict=True):
        np.testing.assert_array_equal(b, np.array(w))
    model.gradient_reducer = None  # resets the compiled step: identity again
    model.train_on_batch(x, y)
    assert any(not np.array_equal(b, np.array(w))
               for b, w in zip(before, model.trainable_weights, strict=True))


# --------------------------------------------------------------------------------------------
# loss and metrics
# --------------------------------------------------------------------------------------------

def test_class_weights_paper_form() -> None:
    w_pos, w_neg = M.class_weights_from_prevalence([2, 0, 5, 1], n=5)
    # P = 2, 0, 5, 1; N = 3, 5, 0, 4: w+ = N / (P + N), w- = P / (P + N); no positives or no
    # negatives -> 0.5 / 0.5
    np.testing.assert_allclose(w_pos, [0.6, 0.5, 0.5, 0.8])
    np.testing.assert_allclose(w_neg, [0.4, 0.5, 0.5, 0.2])
    assert w_pos.dtype == np.float32
    w_pos, w_neg = M.class_weights_from_prevalence([0.25, 0.0])
    np.testing.assert_allclose(w_pos, [0.75, 0.5])
    np.testing.assert_allclose(w_neg, [0.25, 0.5])
    with pytest.raises(ValueError):
        M.class_weights_from_prevalence([1.5])
    with pytest.raises(ValueError):
        M.class_weights_from_prevalence([6], n=5)


def test_weighted_bce_matches_hand_computation() -> None:
    y = [[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]]
    p = [[0.9, 0.2, 0.6], [0.3, 0.1, 0.7]]
    w_pos, w_neg = [0.6, 0.5, 0.8], [0.4, 0.5, 0.2]
    per_image = []
    for yi, pi in zip(y, p, strict=True):
        terms = [-(wp * t * math.log(q) + wn * (1 - t) * math.log(1 - q))
                 for t, q, wp, wn in zip(yi, pi, w_pos, w_neg, strict=True)]
        per_image.append(sum(terms) / len(terms))
    expected = sum(per_image) / len(per_image)
    loss = M.WeightedBCE(w_pos, w_neg)
    assert float(loss(np.array(y), np.array(p))) == pytest.approx(expected, rel=1e-5)
    # serialisable: the weights travel in the config
    again = keras.losses.deserialize(keras.losses.serialize(loss))
    assert isinstance(again, M.WeightedBCE)
    assert again.pos_weights == pytest.approx(w_pos) and again.neg_weights == pytest.approx(
        w_neg)
    assert float(again(np.array(y), np.array(p))) == pytest.approx(expected, rel=1e-5)
    # from manifest-style label sums
    from_sums = M.WeightedBCE.from_label_sums([2, 0, 5], n=5)
    assert from_sums.pos_weights == pytest.approx([0.6, 0.5, 0.5])


def brute_force_auroc(t: np.ndarray, s: np.ndarray) -> float:
    pos, neg = s[t == 1], s[t == 0]
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_per_class_auroc_matches_pairwise_definition() -> None:
    rng = np.random.default_rng(3)
    y = (rng.random((60, NUM_CLASSES)) < 0.3).astype(float)
    s = np.round(rng.random((60, NUM_CLASSES)) * 0.5 + 0.3 * y, 1)  # many ties
    y[:, 5] = 0.0   # no positives
    y[:, 9] = 1.0   # no negatives
    result = A.per_class_auroc(y, s)
    assert list(result) == list(PATHOLOGIES)
    for c, name in enumerate(PATHOLOGIES):
        if c in (5, 9):
            assert math.isnan(result[name])
        else:
            assert result[name] == pytest.approx(brute_force_auroc(y[:, c], s[:, c]))
    finite = [v for v in result.values() if not math.isnan(v)]
    assert A.mean_auroc(result) == pytest.approx(np.mean(finite))
    assert A.mean_auroc(y, s) == pytest.approx(np.mean(finite))
    assert A.binary_auroc([0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4]) == 1.0
    assert A.binary_auroc([1, 1, 0, 0], [0.1, 0.2, 0.3, 0.4]) == 0.0
    assert math.isnan(A.mean_auroc(np.zeros((3, 2)), np.ones((3, 2))))


def test_roc_curve_points_and_area() -> None:
    fpr, tpr = A.roc_curve([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
    assert fpr.tolist() == [0.0, 0.0, 0.5, 0.5, 1.0]
    assert tpr.tolist() == [0.0, 0.5, 0.5, 1.0, 1.0]
    rng = np.random.default_rng(4)
    for _ in range(5):
        y = (rng.random(80) < 0.3).astype(float)
        s = np.round(rng.random(80) * 0.6 + 0.3 * y, 1)  # many ties
        fpr, tpr = A.roc_curve(y, s)
        assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0.0, 0.0, 1.0, 1.0)
        assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)
        area = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))
        assert area == pytest.approx(A.binary_auroc(y, s))
    empty = A.roc_curve([1, 1], [0.2, 0.3])
    assert empty[0].size == 0 and empty[1].size == 0
    with pytest.raises(ValueError):
        A.roc_curve([0, 1], [0.5])


def brute_force_roc(t: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ROC points by counting: for every distinct score from the highest down, the rates of
    positives and negatives scoring at least that much; plus the start point (0, 0)."""
    pos, neg = s[t == 1], s[t == 0]
    thresholds = sorted(set(s.tolist()), reverse=True)
    fpr = [0.0] + [float(np.sum(neg >= th)) / len(neg) for th in thresholds]
    tpr = [0.0] + [float(np.sum(pos >= th)) / len(pos) for th in thresholds]
    return np.array(fpr), np.array(tpr)


def test_auroc_equals_pair_counting_and_keras_auc() -> None:
    """The rank-based AUROC is the exact pairwise probability (what scikit-learn's
    ``roc_auc_score`` gives: 2,964 random cases agreed within 2.2e-16 and the ROC points
    exactly, checked when scikit-learn left the dependencies) and agrees with Keras'
    thresholded ``AUC``."""
    rng = np.random.default_rng(11)
    # tiny cases with ties: exact agreement with pair counting, curve point by point
    for _ in range(20):
        y = (rng.random(9) < 0.4).astype(float)
        y[:2] = [0.0, 1.0]  # both classes present
        s = np.round(rng.random(9), 1)
        assert A.binary_auroc(y, s) == pytest.approx(brute_force_auroc(y, s), abs=1e-12)
        fpr, tpr = A.roc_curve(y, s)
        want_fpr, want_tpr = brute_force_roc(y, s)
        np.testing.assert_array_equal(fpr, want_fpr)
        np.testing.assert_array_equal(tpr, want_tpr)
    # undefined cases are NaN (scikit-learn raises): one class, a non-finite score; no curve
    # through a non-finite score
    assert math.isnan(A.binary_auroc([1, 1, 1], [0.2, 0.5, 0.9]))
    assert math.isnan(A.binary_auroc([0, 1, 1], [0.2, math.nan, 0.9]))
    assert math.isnan(A.binary_auroc([0, 1], [-math.inf, 0.9]))
    with pytest.raises(ValueError, match="NaN or infinite"):
        A.roc_curve([0, 1, 1], [0.2, math.nan, 0.9])
    # continuous scores: Keras' estimate with fine thresholds is within 1e-3, class by class
    n, classes = 400, 5
    y = (rng.random((n, classes)) < np.linspace(0.1, 0.5, classes)).astype(np.float32)
    s = np.clip(rng.normal(0.4 + 0.2 * y, 0.2), 0.0, 1.0).astype(np.float32)
    names = [f"c{c}" for c in range(classes)]
    ours = A.per_class_auroc(y, s, names)
    theirs = []
    for c, name in enumerate(names):
        metric = keras.metrics.AUC(num_thresholds=20001)
        metric.update_state(y[:, c], s[:, c])
        theirs.append(float(metric.result()))
        assert ours[name] == pytest.approx(theirs[-1], abs=1e-3)
        assert ours[name] == pytest.approx(brute_force_auroc(y[:, c], s[:, c]), abs=1e-12)
    assert A.mean_auroc(y, s) == pytest.approx(np.mean(theirs), abs=1e-3)
    # a class without negatives: NaN, and left out of the mean
    y[:, 2] = 1.0
    ours = A.per_class_auroc(y, s, names)
    assert math.isnan(ours["c2"])
    assert A.mean_auroc(ours) == pytest.approx(
        np.mean([v for k, v in ours.items() if k != "c2"]))


def test_keras_mean_auroc_metric_and_paper_figures() -> None:
    metric = M.MeanAUROC(num_labels=2)
    metric.update_state(np.array([[1, 0], [0, 1], [1, 1], [0, 0]], "float32"),
                        np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.9], [0.1, 0.3]], "float32"))
    assert float(metric.result()) == pytest.approx(1.0, abs=1e-3)
    again = M.MeanAUROC.from_config(metric.get_config())
    assert again.multi_label and again.num_labels == 2 and again.name == "mean_auroc"
    assert list(A.CHEXNET_PAPER_AUROC) == list(PATHOLOGIES)
    assert np.mean(list(A.CHEXNET_PAPER_AUROC.values())) == pytest.approx(
        A.CHEXNET_PAPER_MEAN_AUROC, abs=5e-4)


# --------------------------------------------------------------------------------------------
# train()
# --------------------------------------------------------------------------------------------

def test_training_lowers_loss_and_beats_chance(first_run: Any) -> None:
    cfg, result, cap = first_run
    loss = result.history["loss"]
    assert len(loss) == EPOCHS and cap.epochs == list(range(EPOCHS))
    assert loss[-1] < loss[0]
    assert math.isfinite(result.mean_auroc)
    assert result.mean_auroc > 0.6, result.per_class_auroc
    assert result.mean_auroc > cap.start_auroc + 0.05, (result.mean_auroc, cap.start_auroc)
    assert result.img_per_s > 0
    assert result.epochs == EPOCHS and result.initial_epoch == 0
    assert 1 <= result.best_epoch <= EPOCHS


def test_with_the_gpu_switches_training_learns_like_float32(first_run: Any, tfr_dir: Path,
                                                              tmp_path: Path) -> None:
    """Issue 45 (b): the same run with mixed precision, XLA and the device feed forced on (what
    a GPU node runs) learns: a test AUROC well above chance and within 0.15 of the float32
    run's. (0.1 was too tight for this small test set: float16 and XLA change the numerics, so
    the two runs end with different weights, and one run on b288f39's code read 0.861 against
    0.757.) The package's step is the lesson's (notebook 03 §3.5 and the gpu-smoke stand-in
    compare them bit for bit under the same switches; tests/tf/test_lesson_steps.py compares
    the lesson's with Keras' own)."""
    _, float32, _ = first_run
    gpu = T.train(config(tfr_dir, tmp_path / "gpu", mixed_precision=True, xla=True,
                         device_feed=True, tensorboard=False))
    print(f"test mean AUROC: float32 {float32.mean_auroc:.3f}, "
          f"mixed precision + XLA + device feed {gpu.mean_auroc:.3f}")
    assert gpu.model.get_layer("backbone").compute_dtype == "float16" and gpu.model.jit_compile
    assert gpu.mean_auroc > 0.6 and abs(gpu.mean_auroc - float32.mean_auroc) < 0.15, \
        (float32.mean_auroc, gpu.mean_auroc)


def test_outputs_on_disk(first_run: Any) -> None:
    cfg, result, cap = first_run
    out = Path(cfg.out_dir)
    ck = out / T.CHECKPOINT_DIR
    for name in (T.LAST_NAME, T.BEST_NAME, T.STATE_NAME):
        assert (ck / name).is_file(), name
    assert not list(ck.glob("*tmp*"))
    assert len(T.read_csv_log(out)) == EPOCHS
    assert any((out / T.TENSORBOARD_DIR).rglob("events.out.tfevents*"))
    text = (out / T.METRICS_NAME).read_text()
    metrics = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    for key in ("mean_auroc", "per_class_auroc", "img_per_s", "epochs", "config", "timing",
                "history", "best_epoch", "best_val_mean_auroc", "world_size"):
        assert key in metrics, key
    assert list(metrics["per_class_auroc"]) == list(PATHOLOGIES)
    assert metrics["mean_auroc"] == pytest.approx(result.mean_auroc)
    assert metrics["epochs"] == EPOCHS and metrics["world_size"] == 1
    assert metrics["config"]["arch"] == "small" and metrics["config"]["image_size"] == PX
    assert metrics["img_per_s"] == pytest.approx(result.img_per_s)
    assert metrics["timing"]["timed_epochs"] == EPOCHS - 1  # first epoch = warm-up
    # the best weights are the ones evaluated
    best = M.build_chexnet("small", PX, weights=ck / T.BEST_NAME)
    for a, b in zip(best.weights, result.model.weights, strict=False):
        np.testing.assert_array_equal(np.array(a), np.array(b))


def test_resume_restores_state_and_continues(first_run: Any, tmp_path: Path) -> None:
    cfg, result, cap = first_run
    out = tmp_path / "resumed"
    shutil.copytree(cfg.out_dir, out)
    # the checkpoint holds exactly the state at the end of the first run
    model, state = T.load_checkpoint(out)
    assert state["epoch"] == EPOCHS
    assert_same_state(snapshot(model), cap.end)
    steps = json.loads((out / T.METRICS_NAME).read_text())["steps_per_epoch"]
    assert cap.end["iterations"] == EPOCHS * steps
    # resuming trains from that state, at the next epoch, up to the new total
    cap2 = Capture()
    r2 = T.train(config(tfr_dir=cfg.tfrecords, out=out, epochs=EPOCHS + 1, resume=True),
                 callbacks=[cap2])
    assert_same_state(cap2.begin, cap.end)
    assert cap2.epochs == [EPOCHS]
    assert r2.initial_epoch == EPOCHS and r2.epochs == EPOCHS + 1
    assert cap2.end["iterations"] == (EPOCHS + 1) * steps
    assert len(r2.history["loss"]) == EPOCHS + 1
    assert r2.history["loss"][:EPOCHS] == pytest.approx(result.history["loss"])
    rows = T.read_csv_log(out)
    assert [int(r["epoch"]) for r in rows] == list(range(EPOCHS + 1))
    assert r2.timing["timed_epochs"] == 1
    # nothing left to do: no training, same epoch count, test evaluation still written
    cap3 = Capture()
    r3 = T.train(config(tfr_dir=cfg.tfrecords, out=out, epochs=EPOCHS + 1, resume=True),
                 callbacks=[cap3])
    assert cap3.epochs == [] and r3.epochs == EPOCHS + 1
    # a checkpoint of another configuration is refused
    with pytest.raises(ValueError, match="image_size"):
        T.train(config(tfr_dir=cfg.tfrecords, out=out, image_size=32, resume=True))


def test_train_is_bit_for_bit_repeatable_with_op_determinism(tfr_dir: Path,
                                                             tmp_path: Path) -> None:
    """What notebook 03 relies on to compare its own training with train(): the same
    starting weights, seed and batches give the same weights, bit for bit, once op
    determinism fixes the order of the new pipeline; and it can be switched off again."""
    import tensorflow as tf
    from tensorflow.python.framework import config as tf_config

    from chexnet_utils.model.accelerator import disable_op_determinism

    init = tmp_path / "init.weights.h5"
    keras.utils.set_random_seed(4)
    M.build_chexnet("small", PX).save_weights(init)
    short = dict(epochs=1, steps_per_epoch=3, weights=str(init), validate=False,
                 evaluate_test=False, tensorboard=False)
    tf.config.experimental.enable_op_determinism()
    try:
        runs = [T.train(config(tfr_dir, tmp_path / f"run{i}", **short)) for i in range(2)]
    finally:
        disable_op_determinism()
    assert not tf_config.is_op_determinism_enabled()
    assert runs[0].trained_checksum == runs[1].trained_checksum
    assert T.weights_sha256(runs[0].model.weights) == T.weights_sha256(runs[1].model.weights)


def test_config_validation(tfr_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="arch"):
        T.train(config(tfr_dir, tmp_path, arch="vgg"))
    with pytest.raises(ValueError, match="pipeline"):
        T.train(config(tfr_dir, tmp_path, pipeline="fast"))
    with pytest.raises(ValueError, match="warmup_epochs"):
        T.train(config(tfr_dir, tmp_path, warmup_epochs=-1))
    assert T.init_world(False) == (0, 1)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------

def test_cli_train_end_to_end(tfr_dir: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    rc = main(["train", "--tfrecords", str(tfr_dir), "--arch", "small", "--epochs", "1",
               "--out", str(out), "--image-size", "32", "--batch-size", "8",
               "--steps-per-epoch", "3", "--pipeline", "old", "--seed", "1", "--quiet"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "mean AUROC" in printed
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs"] == 1 and metrics["steps_per_epoch"] == 3
    assert metrics["config"]["pipeline"] == "old"
    assert (out / "checkpoints" / "last.keras").is_file()


def test_cli_missing_weights_is_a_clear_error(tfr_dir: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "densenet121_weights_tf_dim_ordering_tf_kernels_notop.h5"
    rc = main(["train", "--tfrecords", str(tfr_dir), "--arch", "densenet121", "--epochs", "1",
               "--out", str(tmp_path / "x"), "--weights", str(missing)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "not found" in err and str(missing) in err
