"""The tf.data toolbox of :mod:`chexnet_utils.input.feeding`: the ``list_files(shuffle=True)``
before ``shard`` trap counted, its fix, cache correctness (same examples every epoch,
augmentation after the cache), a cache file, Options, the Keras PyDataset, and the emulated
accelerator's wait fraction of :mod:`chexnet_utils.bench.benchmark`."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from chexnet_utils.data import tfrecords as T
from chexnet_utils.input import feeding as F
from chexnet_utils.input import pydataset as P
from tests.support.datasets import write_records

tf = pytest.importorskip("tensorflow")

N_SHARDS, PER = 8, 4
PX, S = 48, 16
NAMES = [f"{i + 1:08d}_000.png" for i in range(N_SHARDS * PER)]


def png(i: int) -> bytes:
    rng = np.random.default_rng(i)
    a = rng.integers(0, 255, (PX, PX), dtype=np.uint8)
    a[:, : PX // 4] = 255  # left bright: a flip is visible
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def tfr_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("feeding")
    for s in range(N_SHARDS):
        lab = [0.0] * 14
        recs = [T.make_example(png(i), "png", PX, PX, lab, NAMES[i], i)
                for i in range(s * PER, (s + 1) * PER)]
        write_records(root / T.shard_name("train", s, N_SHARDS), recs)
    return root


@pytest.fixture(scope="module")
def files(tfr_dir: Path) -> list[Path]:
    return T.list_shards(tfr_dir, "train")


def pattern(tfr_dir: Path) -> str:
    return str(tfr_dir / "train-*.tfrecord")


def test_cache_bytes():
    assert F.cache_bytes(10, 128) == 10 * 128 * 128 * 3 * 4
    assert F.cache_bytes(1, 8, channels=1, dtype_bytes=1) == 64


def test_list_files_with_per_worker_shuffle_overlaps_and_misses(tfr_dir):
    r = F.list_files_shard_overlap(pattern(tfr_dir), 2, shuffle=True, seeds=[1, 2])
    assert r["total"] == len(NAMES)
    assert sum(r["per_worker"]) == len(NAMES)  # each reads its share of *a* permutation ...
    # ... of different permutations: what one reads twice, another file is never read
    assert r["duplicated"] == r["missed"] > 0
    assert r["distinct_read"] == len(NAMES) - r["missed"]
    assert r["duplicated"] % PER == 0  # whole files


def test_the_fix_reads_every_example_exactly_once(tfr_dir):
    for seeds in ([1, 2], [None, None]):
        r = F.list_files_shard_overlap(pattern(tfr_dir), 2, shuffle=False, seeds=seeds)
        assert r["duplicated"] == r["missed"] == 0
        assert r["distinct_read"] == len(NAMES)
    same = F.list_files_shard_overlap(pattern(tfr_dir), 2, shuffle=True, seeds=[7, 7])
    assert same["duplicated"] == same["missed"] == 0  # one shared seed is a fix too


def test_list_files_pipeline_decodes_batches(tfr_dir):
    ds = F.list_files_pipeline(pattern(tfr_dir), 4, S, training=False, with_names=True)
    names = [n.decode() for _, _, b in ds.as_numpy_iterator() for n in b]
    assert sorted(names) == NAMES
    x, y, _ = next(iter(ds))
    assert x.shape == (4, S, S, 3) and y.shape == (4, 14)


def epoch_images(ds) -> list[dict[str, np.ndarray]]:
    out = []
    for _ in range(2):
        out.append({n.decode(): x for xb, _, nb in ds.as_numpy_iterator()
                    for x, n in zip(xb, nb, strict=True)})
    return out


def test_cache_serves_the_same_examples_and_flips_after_the_cache(files, tmp_path):
    ds = F.cached_pipeline(files, 4, S, training=True, seed=0, with_names=True)
    e1, e2 = epoch_images(ds)
    assert sorted(e1) == sorted(e2) == NAMES
    flipped = [n for n in NAMES if not np.allclose(e1[n], e2[n])]
    assert flipped  # a fresh flip each epoch ...
    for n in flipped:  # ... of the same cached image
        assert np.allclose(e1[n], e2[n][:, ::-1]) or np.allclose(e1[n][:, ::-1], e2[n])
    # uncached reference decode equals the cached values (up to the flip)
    ref = F.cached_pipeline(files, 4, S, training=False, with_names=True)
    r = {n.decode(): x for xb, _, nb in ref.as_numpy_iterator()
         for x, n in zip(xb, nb, strict=True)}
    for n in NAMES:
        assert np.allclose(r[n], e1[n]) or np.allclose(r[n], e1[n][:, ::-1])


def test_cache_to_a_file_is_reused(files, tmp_path):
    ds = F.cached_pipeline(files, 4, S, cache_file=str(tmp_path / "c"), training=False)
    assert F.epoch_seconds(ds, 2)[1] >= 0
    assert list(tmp_path.glob("c*"))


def test_with_options_sets_what_it_says(files):
    ds = F.with_options(F.cached_pipeline(files, 4, S, training=False), ram_budget_mb=64,
                        private_threads=1)
    o = ds.options()
    assert o.threading.private_threadpool_size == 1
    assert o.autotune.ram_budget == 64 * 1024 * 1024
    assert sum(int(x.shape[0]) for x, _ in ds) == len(NAMES)


@pytest.mark.parametrize("workers,mp", [(1, False), (2, True)])
def test_pydataset_decodes_the_same_images(files, workers, mp):
    pds = P.DecodePyDataset(files, 4, S, workers=workers, use_multiprocessing=mp)
    assert len(pds) == len(NAMES) // 4
    x, y = pds[0]
    assert x.shape == (4, S, S, 3) and y.shape == (4, 14)
    from chexnet_utils.input.pipelines import decode_resize, normalize

    blobs = [ex["image_bytes"] for ex in T.read_examples(files[0])]
    # PIL's bilinear shrink low-pass filters first: TF's antialiased resize is its twin
    ref = np.stack([normalize(decode_resize(b, S, antialias=True)).numpy() for b in blobs])
    assert np.abs(x - ref).mean() < 0.05
    r = P.pydataset_rate(pds)
    assert r["images"] == len(NAMES) and r["img_per_s"] > 0 and r["cpu_cores_used"] > 0


def test_accel_wait_fraction_is_high_for_a_slow_pipeline_and_low_for_a_fast_one():
    from chexnet_utils.bench.benchmark import accel_wait_fraction

    def slow(i):
        import time
        time.sleep(0.03)
        return i

    slow_ds = tf.data.Dataset.range(100).map(lambda i: tf.py_function(slow, [i], tf.int64))
    fast_ds = tf.data.Dataset.range(100).prefetch(4)
    assert accel_wait_fraction(slow_ds, 5, n_steps=8) > 0.5
    assert accel_wait_fraction(fast_ds, 5, n_steps=8) < 0.5
    with pytest.raises(ValueError):
        accel_wait_fraction(fast_ds, 0)
