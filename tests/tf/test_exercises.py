"""The exercise checks of notebook 03 that run the learner's code on a Keras model
(TensorFlow): CAM against Grad-CAM, resuming from a checkpoint. Each is tested with a right
answer and with the wrong answers a learner is likely to write. The other checks are in
tests/unit/test_exercises.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from chexnet_utils import exercises

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")


def verdict(capsys: pytest.CaptureFixture[str], result: bool) -> bool:
    """``result``, after checking that the printed verdict agrees with it."""
    out = capsys.readouterr().out
    assert out.startswith("Correct: " if result else "Not yet: "), out
    return result


# --- exercise 3: CAM -----------------------------------------------------------------------

def _cam(model, image, class_index, relu=True, resize=True):
    """The CAM of the solution, with switches for the usual mistakes."""
    backbone = model.get_layer("backbone")
    features = keras.Model(backbone.inputs, backbone.get_layer("block4_relu").output)
    f = np.asarray(features(image[None], training=False), dtype=np.float64)[0]
    w = np.asarray(model.get_layer("predictions").kernel, dtype=np.float64)[:, class_index]
    m = f @ w
    m = np.maximum(m, 0.0) if relu else np.abs(m)
    m = m / m.max() if m.max() > 0 else m
    if not resize:
        return m
    m = tf.image.resize(m[..., None].astype(np.float32), image.shape[:2], method="bilinear")
    return np.clip(m.numpy()[..., 0], 0.0, 1.0)


def test_cam_matches_grad_cam_and_the_usual_mistakes_do_not(capsys):
    from chexnet_utils.models import build_chexnet

    keras.utils.set_random_seed(3)
    model = build_chexnet("small", 64, weights=None)
    image = np.random.default_rng(0).normal(size=(64, 64, 3)).astype(np.float32)
    classes = (2, 9)
    assert verdict(capsys, exercises.check_cam(_cam, model, image, classes))
    assert not verdict(capsys, exercises.check_cam(
        lambda m, x, c: _cam(m, x, c, relu=False), model, image, classes))
    assert not verdict(capsys, exercises.check_cam(
        lambda m, x, c: _cam(m, x, (c + 1) % 14), model, image, classes))  # another class
    assert not verdict(capsys, exercises.check_cam(
        lambda m, x, c: _cam(m, x, c, resize=False), model, image, classes))
    assert not verdict(capsys, exercises.check_cam(
        lambda m, x, c: 1 / 0, model, image, classes))
    assert not verdict(capsys, exercises.check_cam("cam", model, image, classes))


# --- exercise 2: resume ---------------------------------------------------------------------

PLATEAU = dict(monitor="loss", factor=0.5, patience=5, min_delta=10.0)  # never improves


class _Plateau(keras.callbacks.ReduceLROnPlateau):
    def __init__(self, state, **kwargs):
        super().__init__(**kwargs)
        self.state = state

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self.best, self.wait, self.cooldown_counter = (
            self.state[k] for k in ("best", "wait", "cooldown_counter"))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A tiny model trained 3 epochs with a plateau that waits: last.keras, plateau.json."""
    run_dir = tmp_path_factory.mktemp("run")
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="sigmoid")])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy")
    plateau = keras.callbacks.ReduceLROnPlateau(**PLATEAU)
    x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    y = (x[:, :3] > 0).astype(np.float32)
    early = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: epoch == 0 and
                                           model.save_weights(run_dir / "early.weights.h5"))
    model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[plateau, early])
    model.save(run_dir / "last.keras")
    (run_dir / "plateau.json").write_text(json.dumps(
        {"epochs_done": 3, "best": float(plateau.best), "wait": plateau.wait,
         "cooldown_counter": plateau.cooldown_counter}))
    assert plateau.wait > 0 and int(model.optimizer.iterations.numpy()) == 12
    return run_dir, model, plateau


def _state(run_dir: Path) -> dict:
    return json.loads((run_dir / "plateau.json").read_text())


def test_resume_right_answer(capsys, finished_run):
    run_dir, model, plateau = finished_run

    def resume(d):
        state = _state(d)
        return (keras.saving.load_model(d / "last.keras"), _Plateau(state, **PLATEAU),
                state["epochs_done"])

    assert verdict(capsys, exercises.check_resume(resume, run_dir, model.optimizer, plateau, 3))


def test_resume_wrong_answers(capsys, finished_run):
    run_dir, model, plateau = finished_run

    def weights_only(d):  # a rebuilt, freshly compiled model with the weights: Adam restarts
        fresh = keras.models.clone_model(model)
        fresh.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy")
        fresh.set_weights(keras.saving.load_model(d / "last.keras").get_weights())
        return fresh, _Plateau(_state(d), **PLATEAU), 3

    def from_weights_file(d):  # a .weights.h5 of an earlier epoch: its optimizer state too
        fresh = keras.models.clone_model(model)
        fresh.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy")
        fresh.optimizer.build(fresh.trainable_variables)
        fresh.load_weights(d / "early.weights.h5")
        return fresh, _Plateau(_state(d), **PLATEAU), 3

    def plain_plateau(d):  # counters set before fit: on_train_begin resets them
        p = keras.callbacks.ReduceLROnPlateau(**PLATEAU)
        p.best, p.wait = _state(d)["best"], _state(d)["wait"]
        return keras.saving.load_model(d / "last.keras"), p, 3

    def next_epoch(d):  # the epoch to show, not fit's initial_epoch
        return keras.saving.load_model(d / "last.keras"), _Plateau(_state(d), **PLATEAU), 4

    def raises(d):
        raise FileNotFoundError(d / "missing.keras")

    for wrong, hint in ((weights_only, "optimizer.iterations is 0"),
                        (from_weights_file, "optimizer.iterations is 4"),
                        (plain_plateau, "reset by Keras' on_train_begin"),
                        (next_epoch, "initial_epoch is 4"), (raises, "FileNotFoundError")):
        assert exercises.check_resume(wrong, run_dir, model.optimizer, plateau, 3) is False
        out = capsys.readouterr().out
        assert out.startswith("Not yet: ") and hint in out, (wrong.__name__, out)
    assert not verdict(capsys, exercises.check_resume("resume", run_dir, model.optimizer,
                                                      plateau, 3))


def test_serial_decode_times_the_pipeline_beside_itself_on_one_thread(capsys, monkeypatch):
    """The check runs the learner's pipeline and the same pipeline confined to one thread,
    side by side; the verdict is their ratio (fixed here, so it does not depend on the
    machine), and a real run goes through the same path."""
    pytest.importorskip("tensorflow")
    import tensorflow as tf

    from chexnet_utils import benchmark

    batches = tf.data.Dataset.from_tensors((tf.zeros([4, 8, 8, 3]), tf.zeros([4, 14]))).repeat()
    seen = []

    def fake_compare(rates):
        def compare(datasets, *args, **kwargs):
            seen.append({name: ds.options().threading.private_threadpool_size
                         for name, ds in datasets.items()})
            return {name: benchmark.ThroughputResult([r], [1.0], [int(r)], 1, True)
                    for name, r in zip(datasets, rates)}
        return compare

    monkeypatch.setattr(benchmark, "compare_pipelines", fake_compare([105.0, 100.0]))
    assert verdict(capsys, exercises.check_serial_decode(batches, 100.0))      # serial
    monkeypatch.setattr(benchmark, "compare_pipelines", fake_compare([190.0, 100.0]))
    assert not verdict(capsys, exercises.check_serial_decode(batches, 100.0))  # parallel
    assert seen[0] == {"yours": None, "yours, one thread": 1}
    images_only = tf.data.Dataset.from_tensors(tf.zeros([8, 8, 3])).repeat()  # not batches
    assert not verdict(capsys, exercises.check_serial_decode(images_only, 100.0))
    monkeypatch.undo()
    result = exercises.check_serial_decode(batches, 100.0, n_batches=2, warmup_batches=1,
                                           repeats=1)
    assert verdict(capsys, result) in (True, False)
