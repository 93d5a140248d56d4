"""The exercise checks that run the learner's TensorFlow code: notebook 03's CAM against
Grad-CAM and resuming from a checkpoint, notebook 02's serial pipeline, notebook 07's
``list_files`` fix and cache placement. Each is tested with a right answer and with the wrong
answers a learner is likely to write. The other checks are in tests/unit/test_exercises.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from chexnet_utils.notebook import exercises
from tests.support.datasets import write_records

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
    from chexnet_utils.model.models import build_chexnet

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

    from chexnet_utils.bench import benchmark

    batches = tf.data.Dataset.from_tensors((tf.zeros([4, 8, 8, 3]), tf.zeros([4, 14]))).repeat()
    seen = []

    def fake_compare(rates):
        def compare(datasets, *args, **kwargs):
            seen.append({name: ds.options().threading.private_threadpool_size
                         for name, ds in datasets.items()})
            return {name: benchmark.ThroughputResult([r], [1.0], [int(r)], 1, True)
                    for name, r in zip(datasets, rates, strict=True)}
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


# --- notebook 07, exercises 3 and 4: the list_files fix, where the cache goes -----------------

N_SHARDS, PER_SHARD, PX = 8, 4, 32


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Eight shards of four small PNGs whose left quarter is bright (a flip is visible)."""
    import io

    from PIL import Image

    from chexnet_utils.data import tfrecords as T

    root = tmp_path_factory.mktemp("feeding-exercises")
    for s in range(N_SHARDS):
        records = []
        for i in range(s * PER_SHARD, (s + 1) * PER_SHARD):
            a = np.random.default_rng(i).integers(0, 255, (PX, PX), dtype=np.uint8)
            a[:, : PX // 4] = 255
            buf = io.BytesIO()
            Image.fromarray(a).save(buf, format="PNG")
            records.append(T.make_example(buf.getvalue(), "png", PX, PX, [0.0] * 14,
                                          f"{i + 1:08d}_000.png", i))
        write_records(root / T.shard_name("train", s, N_SHARDS), records)
    return T.list_shards(root, "train")


def test_list_files_fix_right_and_wrong(capsys, shards):
    pattern = str(shards[0].parent / "train-*.tfrecord")
    files = tf.data.Dataset.list_files

    def fixed(p, rank, n):                      # the solution
        return files(p, shuffle=False).shard(n, rank).shuffle(64, reshuffle_each_iteration=True)

    def shared_seed(p, rank, n):                # one seed for every worker: the same order
        return files(p, seed=7).shard(n, rank)

    assert verdict(capsys, exercises.check_list_files_fix(fixed, pattern, 2))
    assert verdict(capsys, exercises.check_list_files_fix(shared_seed, pattern, 4))
    wrong = {
        "read by more than one worker": lambda p, rank, n: files(p).shard(n, rank),  # the trap
        "same order in all": lambda p, rank, n: files(p, shuffle=False).shard(n, rank),
        "every worker read every file": lambda p, rank, n: files(p, shuffle=False),
        "raised ValueError": lambda p, rank, n: (_ for _ in ()).throw(ValueError("x")),
    }
    for hint, answer in wrong.items():
        assert exercises.check_list_files_fix(answer, pattern, 2) is False
        out = capsys.readouterr().out
        assert out.startswith("Not yet: ") and hint in out, (hint, out)
    assert not verdict(capsys, exercises.check_list_files_fix(None, pattern))


def test_cache_placement_right_and_wrong(capsys, shards):
    from chexnet_utils.input import pipelines

    decode = pipelines.example_fn(16, training=False, seed=None, with_names=False,
                                  antialias=False, batched=False)

    def flip(image, label):
        return tf.image.random_flip_left_right(image), label

    def decoded(files):                         # notebook 07's deterministic part
        ds = tf.data.Dataset.from_tensor_slices([str(f) for f in files])
        return ds.interleave(tf.data.TFRecordDataset, cycle_length=4,
                             deterministic=True).map(decode)

    some = shards[:2]
    right = {"in record order": lambda f: decoded(f).cache().map(flip),
             "shuffled and batched": lambda f: decoded(f).cache().shuffle(8).map(flip).batch(3)}
    for answer in right.values():
        assert verdict(capsys, exercises.check_cache_placement(answer, some, decode))
    wrong = {
        "drawn once and cached": lambda f: decoded(f).map(flip).cache(),
        "no cache()": lambda f: decoded(f).map(flip),
        "undecoded records": lambda f: tf.data.TFRecordDataset(
            [str(x) for x in f]).cache().map(decode).map(flip),
        "no random flip after the cache": lambda f: decoded(f).cache(),
        "each once": lambda f: decoded(f).cache().map(flip).repeat(2),
        "full pass": lambda f: decoded(f).cache().map(flip).take(3),
        "raised TypeError": lambda f: decoded(f).cache().map(lambda image: image),
    }
    for hint, answer in wrong.items():
        assert exercises.check_cache_placement(answer, some, decode) is False
        out = capsys.readouterr().out
        assert out.startswith("Not yet: ") and hint in out, (hint, out)
    assert not verdict(capsys, exercises.check_cache_placement(None, some, decode))
    assert all(f.exists() for f in some)        # the check worked on copies
    # a global seed makes a map's random op repeat its draws every epoch, even after the
    # cache: the placement is still right, and the verdict says why the flips repeat
    tf.random.set_seed(0)
    try:
        assert verdict(capsys, exercises.check_cache_placement(right["in record order"], some,
                                                               decode))
    finally:
        tf.random.set_seed(None)
