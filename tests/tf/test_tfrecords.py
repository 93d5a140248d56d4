"""NIH folder -> sharded TFRecords read by TensorFlow: framing and ``tf.train.Example`` wire
compatibility, the round trip through tf.data, resizing and JPEG. Fixtures are tiny NIH-layout
folders (tests/datasets.py); the pure tests are in tests/unit/test_tfrecords.py."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image

from chexnet_utils.cli import main
from chexnet_utils.data import tfrecords as T
from chexnet_utils.data.labels import labels_to_multihot
from chexnet_utils.data.nih import NIHDataset
from tests.support.datasets import image_path, make_dataset, read_all, split_lines, write_records


@pytest.fixture(scope="module")
def tf():
    import tensorflow as tf

    return tf


@pytest.fixture
def dataset(tmp_path):
    return make_dataset(tmp_path / "data")


# --------------------------------------------------------------------------------------------
# low level: record framing and Example encoding, read by TensorFlow
# --------------------------------------------------------------------------------------------

def test_records_with_long_data_read_by_tf(tmp_path, tf):
    # TFRecordDataset checks both CRCs of every record: it fails on a wrong one
    rng = np.random.default_rng(0)
    records = [rng.integers(0, 256, n, dtype=np.uint8).tobytes()
               for n in (0, 1, 3, 4, 5, 255, 256, 257, 1000, 4095, 65536, 100_003)]
    path = tmp_path / "crc.tfrecord"
    write_records(path, records)
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(path))] == records


def test_examples_are_wire_compatible_with_tensorflow(tf):
    label = labels_to_multihot("Effusion|Hernia")
    ours = T.make_example(b"\x89PNG...", "png", 64, 48, label, "00000007_001.png", 123456789)
    parsed = tf.train.Example.FromString(ours)
    f = parsed.features.feature
    assert f["image/encoded"].bytes_list.value == [b"\x89PNG..."]
    assert f["image/format"].bytes_list.value == [b"png"]
    assert (f["image/height"].int64_list.value, f["image/width"].int64_list.value) == ([64], [48])
    assert list(f["label"].float_list.value) == label.tolist()
    assert f["image/name"].bytes_list.value == [b"00000007_001.png"]
    assert f["patient_id"].int64_list.value == [123456789]
    # and the pure decoder reads what TensorFlow writes, negative int64 included
    theirs = tf.train.Example(features=tf.train.Features(feature={
        "a": tf.train.Feature(int64_list=tf.train.Int64List(value=[-5, 0, 2**40])),
        "b": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5, -1.0])),
        "c": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"x", b""])),
    })).SerializeToString()
    assert T.decode_example(theirs) == {"a": [-5, 0, 2**40], "b": [0.5, -1.0], "c": [b"x", b""]}


def test_record_framing_read_by_tf_and_corruption_detected(tmp_path, tf):
    path = tmp_path / "x.tfrecord"
    records = [b"", b"a", os.urandom(70_000)]
    write_records(path, records)
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(path))] == records
    assert list(T.read_records(path)) == records
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="CRC"):
        list(T.read_records(path))


# --------------------------------------------------------------------------------------------
# round trip, sharding, determinism
# --------------------------------------------------------------------------------------------

def test_round_trip_through_tf_data(dataset, tmp_path, tf):
    root, records = dataset
    out = tmp_path / "tfr"
    result = T.convert_dataset(root, out, shard_size=7, workers=1, progress=False)
    split = NIHDataset.load(root).split(0.1, 0)
    assert result.counts == {k: len(v) for k, v in split.parts().items()}
    assert result.num_images == len(records) and result.images_per_s > 0
    by_name = {r.image_index: r for r in records}
    seen = []
    for part, recs in split.parts().items():
        files = [str(p) for p in T.list_shards(out, part)]
        ds = tf.data.TFRecordDataset(files).map(T.parse_example)
        names = []
        for ex in ds:
            name = ex["name"].numpy().decode()
            names.append(name)
            rec = by_name[name]
            assert ex["label"].dtype == tf.float32 and ex["label"].shape == (14,)
            np.testing.assert_array_equal(ex["label"].numpy(), rec.labels)
            assert int(ex["patient_id"]) == rec.patient_id
            assert (int(ex["height"]), int(ex["width"])) == (64, 64)
            assert ex["format"].numpy() == b"png"
            # 8-bit grey PNG, no resize: the original bytes, untouched
            src = image_path(root, name).read_bytes()
            assert ex["image_bytes"].numpy() == src
            img = T.decode_image(ex["image_bytes"])
            assert img.dtype == tf.float32 and img.shape == (64, 64, 1)
            np.testing.assert_array_equal(np.round(img.numpy()[..., 0] * 255).astype(np.uint8),
                                          np.asarray(Image.open(image_path(root, name))))
        assert names == [r.image_index for r in recs]  # CSV order within the part
        seen += names
    assert sorted(seen) == sorted(by_name)  # every image exactly once
    # batched parsing with the same spec
    batch = next(iter(tf.data.TFRecordDataset(
        [str(p) for p in T.list_shards(out, "train")]).batch(5)))
    assert tf.io.parse_example(batch, T.FEATURE_SPEC)["label"].shape == (5, 14)
    parsed = T.parse_example(batch)
    assert parsed["label"].shape == (5, 14) and parsed["name"].shape == (5,)
    assert T.verify(out, root).ok


def test_default_conversion_of_synthetic_data_shards_over_workers(tmp_path, capsys, tf):
    # The user story end to end (smaller than 1500 x 256 px, same rule): synth -> tfrecords
    # with defaults -> file-level sharding over 2 workers (as `bench scaling --workers 1,2`).
    from chexnet_utils.input import pipelines

    data, out = tmp_path / "D", tmp_path / "T"
    assert main(["synth", "--out", str(data), "--n", "120", "--size", "128",
                 "--workers", "1"]) == 0
    assert main(["tfrecords", "--data-dir", str(data), "--out", str(out), "--workers", "1",
                 "--no-progress"]) == 0
    lines = split_lines(capsys.readouterr().out)
    assert set(lines) == set(T.SPLITS)
    manifest = T.load_manifest(out)
    for part, info in manifest["splits"].items():
        k = len(T.list_shards(out, part))
        assert k == info["shards"] and k == (info["images"] if info["images"] < 8 else 8)
        assert f" in {k} shard(s) (divisible among" in lines[part]
    files = T.list_shards(out, "train")
    assert len(files) == 8
    names = []
    for rank in range(2):  # what each of 2 Horovod workers reads
        ds = pipelines.new_approach(files, batch_size=16, image_size=32, training=False,
                                    num_workers=2, worker_index=rank, with_names=True)
        names.append({n.decode() for _, _, batch in ds.as_numpy_iterator() for n in batch})
    assert not names[0] & names[1]
    assert len(names[0]) + len(names[1]) == manifest["splits"]["train"]["images"]
    assert abs(len(names[0]) - len(names[1])) <= 4  # 4 files each, differing by <= 1 image


def test_resize_and_jpeg(dataset, tmp_path, tf):
    root, records = dataset
    out = tmp_path / "tfr"
    T.convert_dataset(root, out, image_size=32, encoding="jpeg", shard_size=50, workers=1,
                      progress=False)
    found = read_all(out)
    assert len(found) == len(records)
    for ex in found.values():
        assert ex["format"] == "jpeg" and (ex["height"], ex["width"]) == (32, 32)
        assert ex["image_bytes"][:2] == b"\xff\xd8"
        with Image.open(io.BytesIO(ex["image_bytes"])) as im:
            assert im.format == "JPEG" and im.size == (32, 32) and im.mode == "L"
    first = next(iter(found.values()))
    assert T.decode_image(first["image_bytes"]).shape == (32, 32, 1)
    small = T.decode_image(first["image_bytes"], image_size=16)
    assert small.shape == (16, 16, 1)
    assert 0.0 <= float(tf.reduce_min(small)) <= float(tf.reduce_max(small)) <= 1.0
    assert T.verify(out, root, decode_images=True).ok
