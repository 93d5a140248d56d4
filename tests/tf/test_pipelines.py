"""The old and new tf.data pipelines, their tf.data options, the benchmark helpers and the
``bench pipelines`` command. Fixtures: tiny TFRecord shards (64 px PNGs) written here with
the converter's own Example writer, so no NIH folder or conversion run is needed."""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from chexnet_utils.bench import benchmark as B
from chexnet_utils.cli import main
from chexnet_utils.data import tfrecords as T
from chexnet_utils.input import pipelines as P
from tests.support.datasets import write_records

tf = pytest.importorskip("tensorflow")

N_EXAMPLES = 40
N_SHARDS = 5
SOURCE_PX = 64
S = 32  # model input side in these tests


def png(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


def example_image(i: int) -> np.ndarray:
    """A different image per index: a gradient plus noise."""
    rng = np.random.default_rng(i)
    xx = np.linspace(0, 200, SOURCE_PX)[None, :]
    return np.clip(xx + rng.normal(0, 20, (SOURCE_PX, SOURCE_PX)), 0, 255).astype(np.uint8)


def name_of(i: int) -> str:
    return f"{i + 1:08d}_000.png"


def label_of(i: int) -> list[float]:
    lab = [0.0] * 14
    lab[i % 14] = 1.0
    if i % 3 == 0:
        lab[(i + 5) % 14] = 1.0
    return lab


@pytest.fixture(scope="module")
def tfr_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 examples in 5 train shards of 8, named like the converter names them."""
    root = tmp_path_factory.mktemp("tfrecords")
    per = N_EXAMPLES // N_SHARDS
    for s in range(N_SHARDS):
        records = [T.make_example(png(example_image(i)), "png", SOURCE_PX, SOURCE_PX,
                                  label_of(i), name_of(i), 1000 + i)
                   for i in range(s * per, (s + 1) * per)]
        write_records(root / T.shard_name("train", s, N_SHARDS), records)
    return root


@pytest.fixture(scope="module")
def files(tfr_dir: Path) -> list[Path]:
    fs = T.list_shards(tfr_dir, "train")
    assert len(fs) == N_SHARDS
    return fs


ALL_NAMES = sorted(name_of(i) for i in range(N_EXAMPLES))


def collect(ds: tf.data.Dataset) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{name: (image, label)} over a finite dataset of (image, label, name) batches; fails
    on a name seen twice."""
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for images, labels, names in ds:
        for img, lab, n in zip(images.numpy(), labels.numpy(), names.numpy(), strict=True):
            key = n.decode()
            assert key not in out, f"{key} delivered twice"
            out[key] = (img, lab)
    return out


def names_of(ds: tf.data.Dataset) -> list[str]:
    return [n.decode() for _, _, names in ds for n in names.numpy()]


# --------------------------------------------------------------------------------------------
# preprocessing
# --------------------------------------------------------------------------------------------

def test_normalisation_of_constant_grey() -> None:
    grey = 128
    raw = png(np.full((SOURCE_PX, SOURCE_PX), grey, np.uint8))
    image, label = P.preprocess(tf.constant(raw), tf.constant(label_of(1)), S, training=False)
    assert image.shape == (S, S, 3) and image.dtype == tf.float32
    assert label.shape == (14,) and label.dtype == tf.float32
    expected = (grey / 255.0 - np.array(P.IMAGENET_MEAN)) / np.array(P.IMAGENET_STD)
    np.testing.assert_allclose(image.numpy(), np.broadcast_to(expected, (S, S, 3)), atol=1e-5)
    np.testing.assert_allclose(expected, [0.0741, 0.2052, 0.4265], atol=1e-3)  # docstring


def test_preprocess_batch_equals_per_image() -> None:
    raws = [png(example_image(i)) for i in range(4)]
    labels = tf.constant([label_of(i) for i in range(4)])
    bi, bl = P.preprocess_batch(tf.constant(raws), labels, S, training=False)
    assert bi.shape == (4, S, S, 3) and bl.shape == (4, 14)
    for k, raw in enumerate(raws):
        one, _ = P.preprocess(tf.constant(raw), labels[k], S, training=False)
        np.testing.assert_allclose(bi[k].numpy(), one.numpy(), atol=1e-6)


@pytest.mark.parametrize("batched", [False, True])
def test_flip_only_in_training(batched: bool) -> None:
    # left half black, right half white: a flip is easy to see
    a = np.zeros((16, 16), np.uint8)
    a[:, 8:] = 255
    raw = tf.constant(png(a))
    lab = tf.constant(label_of(0))
    tf.random.set_seed(1)

    def left_is_dark(training: bool) -> list[bool]:
        if batched:
            imgs, _ = P.preprocess_batch(tf.stack([raw] * 24), tf.stack([lab] * 24), 16,
                                         training)
            return [bool(im[:, :4, 0].numpy().mean() < im[:, -4:, 0].numpy().mean())
                    for im in imgs]
        return [bool(img[:, :4, 0].numpy().mean() < img[:, -4:, 0].numpy().mean())
                for img, _ in (P.preprocess(raw, lab, 16, training) for _ in range(24))]

    assert all(left_is_dark(False)), "evaluation must never flip"
    seen = Counter(left_is_dark(True))
    assert seen[True] > 0 and seen[False] > 0, f"training should flip about half: {seen}"


# --------------------------------------------------------------------------------------------
# the two pipelines
# --------------------------------------------------------------------------------------------

def test_new_is_a_permutation_of_old_with_identical_preprocessing(files: list[Path]) -> None:
    old = collect(P.old_approach(files, 8, S, training=False, with_names=True))
    new = collect(P.new_approach(files, 8, S, training=False, with_names=True))
    assert sorted(old) == sorted(new) == ALL_NAMES
    for name in ALL_NAMES:
        np.testing.assert_array_equal(old[name][0], new[name][0])
        np.testing.assert_array_equal(old[name][1], new[name][1])
        i = int(name[:8]) - 1
        np.testing.assert_array_equal(old[name][1], label_of(i))
    # the old approach reads sequentially: file order, record order
    assert names_of(P.old_approach(files, 8, S, training=False, with_names=True)) == ALL_NAMES


@pytest.mark.parametrize("approach", ["old", "new"])
@pytest.mark.parametrize("num_workers", [2, 3])
def test_workers_get_disjoint_complete_parts(files: list[Path], approach: str,
                                             num_workers: int) -> None:
    parts = [names_of(P.build_pipeline(approach, files, 4, S, training=False,
                                       num_workers=num_workers, worker_index=w,
                                       with_names=True))
             for w in range(num_workers)]
    seen = Counter(n for part in parts for n in part)
    assert sorted(seen) == ALL_NAMES
    assert max(seen.values()) == 1, "a name went to two workers"
    assert all(parts), "every worker gets some examples"


@pytest.mark.parametrize("approach", ["old", "new"])
def test_training_batches_shapes_and_one_epoch(files: list[Path], approach: str) -> None:
    ds = P.build_pipeline(approach, files, 8, S, training=True, seed=3)
    images, labels = next(iter(ds))  # (image, label) only by default
    assert images.shape == (8, S, S, 3) and images.dtype == tf.float32
    assert labels.shape == (8, 14) and labels.dtype == tf.float32
    assert ds.element_spec[0].shape[1:] == (S, S, 3)
    # training repeats by default; without repeat one epoch is a shuffled permutation
    epoch = names_of(P.build_pipeline(approach, files, 8, S, training=True, repeat=False,
                                      seed=3, with_names=True))
    assert sorted(epoch) == ALL_NAMES
    assert epoch != ALL_NAMES, "training should shuffle"
    many = list(ds.take(N_EXAMPLES // 8 + 2))
    assert len(many) == N_EXAMPLES // 8 + 2, "training repeats by default"


def test_eval_keeps_last_partial_batch_training_new_drops_it(files: list[Path]) -> None:
    sizes = [int(b[0].shape[0]) for b in P.new_approach(files, 16, S, training=False)]
    assert sizes == [16, 16, 8]
    sizes = [int(b[0].shape[0]) for b in P.old_approach(files, 16, S, training=False)]
    assert sizes == [16, 16, 8]
    sizes = [int(b[0].shape[0]) for b in P.new_approach(files, 16, S, training=True,
                                                         repeat=False, seed=0)]
    assert sizes == [16, 16]
    assert P.new_approach(files, 16, S, training=True).element_spec[0].shape[0] == 16


def test_file_sharding_needs_enough_files(files: list[Path]) -> None:
    with pytest.raises(ValueError, match="more shards"):
        P.new_approach(files, 4, S, num_workers=N_SHARDS + 1, worker_index=0)
    # record-level sharding (the old approach) works with any N
    parts = [names_of(P.old_approach(files, 4, S, training=False, num_workers=N_SHARDS + 1,
                                     worker_index=w, with_names=True))
             for w in range(N_SHARDS + 1)]
    assert sorted(n for p in parts for n in p) == ALL_NAMES


def test_argument_checks(files: list[Path]) -> None:
    with pytest.raises(ValueError, match="no TFRecord files"):
        P.new_approach([], 4, S)
    with pytest.raises(ValueError, match="worker_index"):
        P.old_approach(files, 4, S, num_workers=2, worker_index=2)
    with pytest.raises(ValueError, match="pipeline must be one of .old., .new."):
        P.build_pipeline("newest", files, 4, S)


# --------------------------------------------------------------------------------------------
# TF's automatic rewrites: what the old approach switches off
# --------------------------------------------------------------------------------------------

def test_old_approach_keeps_its_map_sequential(files: list[Path]) -> None:
    """TF 2.x parallelises a stateless map by itself (``map_parallelization``, on by
    default); the old approach switches that off, in evaluation mode (stateless map) too."""
    ds = P.old_approach(files, 8, S, training=False)
    assert ds.options().experimental_optimization.map_parallelization is False
    assert tf.data.Options().experimental_optimization.map_parallelization is None  # = on
    # the new approach leaves TF's defaults alone
    new = P.new_approach(files, 8, S, training=False)
    assert new.options().experimental_optimization.map_parallelization is None


# --------------------------------------------------------------------------------------------
# benchmark helpers
# --------------------------------------------------------------------------------------------

def tiny_cnn(image_size: int):  # type: ignore[no-untyped-def]
    import keras

    model = keras.Sequential([
        keras.Input((image_size, image_size, 3)),
        keras.layers.Conv2D(4, 3, strides=2, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(14, activation="sigmoid"),
    ])
    model.compile(optimizer="adam", loss="binary_crossentropy")
    return model


def test_time_pipeline_and_compare(files: list[Path]) -> None:
    ds = P.new_approach(files, 8, S, training=True, shuffle_buffer=16, seed=0)
    r = B.time_pipeline(ds, n_batches=3, warmup_batches=1, repeats=2)
    assert len(r.images_per_s) == 2 and all(v > 0 for v in r.images_per_s)
    assert r.images == [24, 24] and r.mean > 0 and r.std >= 0
    assert json.dumps(r.as_dict())
    r2 = B.time_pipeline(ds, n_batches=2, warmup_batches=1, repeats=2, fresh_iterator=False)
    assert r2.images == [16, 16] and not r2.fresh_iterator
    both = B.compare_pipelines(
        {"old": P.old_approach(files, 8, S, training=True, shuffle_buffer=16, seed=0),
         "new": ds}, n_batches=2, warmup_batches=1, repeats=2)
    assert set(both) == {"old", "new"} and all(x.mean > 0 for x in both.values())
    # a finite dataset: timed for what it has, an error when nothing is left
    finite = P.old_approach(files, 16, S, training=False)  # 16, 16, 8
    assert B.time_pipeline(finite, n_batches=10, warmup_batches=1, repeats=1).images == [24]
    with pytest.raises(ValueError, match="no batches left"):
        B.time_pipeline(finite, n_batches=1, warmup_batches=3, repeats=1)


def test_decode_ceiling(files: list[Path]) -> None:
    c = B.decode_ceiling(files, S, n_images=16, repeats=1, min_seconds=0.05)
    assert isinstance(c, B.DecodeCeiling) and len(c.per_pass_img_per_s) == 1
    assert c.n_images == 16 and c.cores == B.available_cores() >= 1 and c.image_size == S
    assert c.img_per_s_single_core > 0
    assert c.ceiling_img_per_s == pytest.approx(c.img_per_s_single_core * c.cores)


def test_time_training_and_timeline(files: list[Path]) -> None:
    model = tiny_cnn(S)
    ds = P.new_approach(files, 8, S, training=True, shuffle_buffer=16, seed=0)
    r = B.time_training(model, ds, n_steps=3, warmup=1)
    assert r.real_img_per_s > 0 and r.synthetic_img_per_s > 0
    assert 0.0 <= r.idle_fraction <= 1.0 and r.batch_size == 8
    r2 = B.time_training(model, ds, n_steps=2, warmup=1, synthetic_img_per_s=1e9)
    assert r2.idle_fraction == pytest.approx(1.0, abs=1e-3) and r2.synthetic_seconds is None

    tl = B.record_timeline(ds, B.train_step_fn(model), n_steps=3)
    assert len(tl.t_request) == len(tl.t_batch_ready) == len(tl.t_step_done) == 3
    for q, r_, d in zip(tl.t_request, tl.t_batch_ready, tl.t_step_done, strict=True):
        assert 0 <= q <= r_ <= d
    assert all(a <= b for a, b in zip(tl.t_step_done, tl.t_request[1:], strict=False))
    assert 0 <= tl.wait_fraction <= 1 and len(tl.segments()["compute"]) == 3


def test_compare_training_side_by_side(files: list[Path]) -> None:
    model = tiny_cnn(S)
    datasets = {"old": P.old_approach(files, 8, S, training=True, shuffle_buffer=16, seed=0),
                "new": P.new_approach(files, 8, S, training=True, shuffle_buffer=16, seed=0)}
    res = B.compare_training(model, datasets, n_steps=2, warmup=1, repeats=2, progress=True)
    assert list(res) == ["old", "new"]
    for r in res.values():
        assert len(r.pipeline_img_per_s) == len(r.fed_img_per_s) == len(r.in_memory_img_per_s) == 2
        assert r.pipeline > 0 and r.fed > 0 and r.in_memory > 0 and r.batch_size == 8
        assert 0.0 <= r.idle_fraction <= 1.0
        assert r.idle_fraction == pytest.approx(max(0.0, 1 - r.fed / r.in_memory))
        assert r.pipelined_bound == min(r.pipeline, r.in_memory)
        assert r.sequential_bound < r.pipelined_bound
        assert json.dumps(r.as_dict())
    with pytest.raises(ValueError, match="ran out"):
        B.compare_training(model, {"finite": P.old_approach(files, 8, S, training=False)},
                           n_steps=1, warmup=5, repeats=1)


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_shard_counts_match_the_pipelines(files: list[Path], num_workers: int) -> None:
    counts = B.records_per_file(files)
    assert counts == [N_EXAMPLES // N_SHARDS] * N_SHARDS
    rows = B.shard_counts(files, num_workers)
    assert rows == B.shard_counts(files, num_workers, counts=counts)
    assert [r["worker"] for r in rows] == list(range(num_workers))
    assert sum(r["old_kept"] for r in rows) == sum(r["new_kept"] for r in rows) == N_EXAMPLES
    for r in rows:
        i = r["worker"]
        kw = dict(training=False, num_workers=num_workers, worker_index=i, with_names=True)
        assert r["old_decoded"] == N_EXAMPLES  # everybody decodes everything
        assert r["old_kept"] == len(names_of(P.old_approach(files, 8, S, **kw)))
        assert r["new_decoded"] == r["new_kept"] == len(
            names_of(P.new_approach(files, 8, S, **kw)))
        assert r["new_files"] == len(files[i::num_workers])
    with pytest.raises(ValueError):
        B.shard_counts(files, 0, counts=counts)
    with pytest.raises(ValueError):
        B.shard_counts(files, 2, counts=counts[:-1])


def test_probe_model_is_public_and_compiled() -> None:
    model = B.probe_model(S)
    assert not hasattr(B, "_probe_model")  # one public name, no private alias
    assert model.output_shape == (None, 14) and model.optimizer is not None


def test_compare_pipelines_with_progress_bar(files: list[Path]) -> None:
    ds = P.new_approach(files, 8, S, training=True, shuffle_buffer=16, seed=0)
    r = B.compare_pipelines({"a": ds, "b": ds}, n_batches=1, warmup_batches=1, repeats=2,
                            progress=True)
    assert [len(x.images_per_s) for x in r.values()] == [2, 2]


REQUIRED_KEYS = {"old_img_per_s", "new_img_per_s", "decode_ceiling_img_per_s", "new_over_old",
                 "new_over_ceiling", "idle_fraction_old", "idle_fraction_new", "cores",
                 "image_size", "batch_size", "n_batches", "split", "tfrecords_dir"}


def test_cli_bench_pipelines(tfr_dir: Path, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sub" / "bench.json"
    rc = main(["bench", "pipelines", "--tfrecords", str(tfr_dir), "--json", str(out),
               "--image-size", str(S), "--batch-size", "4", "--batches", "2", "--repeats", "2",
               "--warmup", "1", "--shuffle-buffer", "8", "--ceiling-images", "8",
               "--train-steps", "2"])
    assert rc == 0
    result = json.loads(out.read_text())
    assert REQUIRED_KEYS <= set(result)
    for key in ("old_img_per_s", "new_img_per_s", "decode_ceiling_img_per_s",
                "new_over_old", "new_over_ceiling"):
        assert result[key] > 0, key
    assert 0 <= result["idle_fraction_old"] <= 1 and 0 <= result["idle_fraction_new"] <= 1
    assert result["image_size"] == S and result["batch_size"] == 4 and result["cores"] >= 1
    text = capsys.readouterr().out
    assert "old approach" in text and "new approach" in text and "decode ceiling" in text
    assert "accel_wait_fraction_old" not in result and "emulated accelerator" not in text


def test_bench_pipelines_with_an_emulated_accelerator(tfr_dir: Path) -> None:
    r = B.bench_pipelines(tfr_dir, image_size=S, batch_size=4, n_batches=2, repeats=1,
                          warmup_batches=1, shuffle_buffer=8, ceiling_images=8, train_steps=2,
                          emulate_accelerator_ms=1.0)
    assert isinstance(r, B.PipelinesResult) and r.emulate_accelerator_ms == 1.0
    assert r.accel_wait_fraction is not None and set(r.accel_wait_fraction) == {"old", "new"}
    assert all(0 <= v <= 1 for v in r.accel_wait_fraction.values())
    assert len(r.img_per_s_runs["old"]) == 1 and r.img_per_s("old") == r.img_per_s_runs["old"][0]
    assert r.decode_ceiling_img_per_s == pytest.approx(r.decode_img_per_s_single_core * r.cores)
    assert r.ceiling_images == 8 and r.n_files == N_SHARDS and r.probe_model == "probe_cnn"
    assert {"accel_wait_fraction_old", "accel_wait_fraction_new",
            "emulate_accelerator_ms"} <= set(r.as_dict())
    assert "decode ceiling" in str(r)


@pytest.fixture
def new_plus_cache() -> Iterator[str]:
    """A third pipeline variant, registered as a new one would be (a module calling
    ``register_pipeline``), removed afterwards: the new approach with the decoded images
    cached in memory after the first pass (training mode needs the cache before the
    augmentation, so this variant caches batches: a stand-in, not advice)."""
    name = "new+cache"

    def build(files: Any, batch_size: int, image_size: int, **kwargs: Any) -> Any:
        return P.new_approach(files, batch_size, image_size, **kwargs).cache()

    P.register_pipeline(name, build)
    try:
        yield name
    finally:
        del P.PIPELINES[name]


def test_a_registered_variant_is_benchmarked_by_bench_pipelines(
        tfr_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        new_plus_cache: str) -> None:
    """Issue 50's acceptance: a variant added in one place (the fixture) appears in
    ``bench pipelines``' table and JSON, next to the old and the new approach."""
    out = tmp_path / "bench.json"
    assert main(["bench", "pipelines", "--tfrecords", str(tfr_dir), "--json", str(out),
                 "--image-size", str(S), "--batch-size", "4", "--batches", "2", "--repeats",
                 "1", "--warmup", "1", "--shuffle-buffer", "8", "--ceiling-images", "8",
                 "--train-steps", "2"]) == 0
    result = json.loads(out.read_text())
    for key in ("img_per_s", "img_per_s_std", "img_per_s_runs"):
        assert f"{new_plus_cache}_{key}" in result, key
    assert result[f"{new_plus_cache}_img_per_s"] > 0
    assert 0 <= result[f"idle_fraction_{new_plus_cache}"] <= 1
    assert result[f"train_{new_plus_cache}_img_per_s"] > 0
    text = capsys.readouterr().out
    assert f"{new_plus_cache} approach" in text and f"fed by {new_plus_cache}" in text
    assert "new / old" in text  # the two built-ins still compared
    with pytest.raises(ValueError, match="taken"):
        P.register_pipeline(new_plus_cache, P.new_approach)
    with pytest.raises(ValueError, match="'new\\+cache'"):
        P.build_pipeline("fast", [], 4, S)  # the error names every registered pipeline
    only = B.bench_pipelines(tfr_dir, image_size=S, batch_size=4, n_batches=1, repeats=1,
                             warmup_batches=1, shuffle_buffer=8, ceiling_images=8,
                             train_steps=1, pipelines=[new_plus_cache])
    assert only.pipelines == (new_plus_cache,) and "new / old" not in str(only)


def test_cli_bench_pipelines_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    rc = main(["bench", "pipelines", "--tfrecords", str(tmp_path / "empty"),
               "--json", str(tmp_path / "x.json")])
    assert rc == 2 and "no train shards" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench"])  # a sub-command is required
