"""``tfrecords.wire`` against TensorFlow: its protobuf messages give ``tf.train.Example``'s
bytes, a record it writes is parsed by ``tf.io.parse_single_example``, and its own descriptor
pool lives beside TensorFlow's registration of ``tensorflow.Example`` in one process."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from chexnet_utils.data.tfrecords import wire
from tests.support.datasets import write_records


@pytest.fixture(scope="module")
def tf():
    import tensorflow as tf

    return tf


def test_bytes_identical_to_tf_train_example(tf):
    label = [0.0] * 13 + [1.0]
    png = np.random.default_rng(0).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    feature = {
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[png])),
        "image/format": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"png"])),
        "image/height": tf.train.Feature(int64_list=tf.train.Int64List(value=[1024])),
        "image/width": tf.train.Feature(int64_list=tf.train.Int64List(value=[1024])),
        "label": tf.train.Feature(float_list=tf.train.FloatList(value=label)),
        "image/name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"00000001_000.png"])),
        "patient_id": tf.train.Feature(int64_list=tf.train.Int64List(value=[1])),
    }
    theirs = tf.train.Example(features=tf.train.Features(feature=feature))
    ours = wire.make_example(png, "png", 1024, 1024, label, "00000001_000.png", 1)
    assert ours == theirs.SerializeToString(deterministic=True)
    # the generic encoder too, empty lists and negative int64 included
    mixed = tf.train.Example(features=tf.train.Features(feature={
        "a": tf.train.Feature(int64_list=tf.train.Int64List(value=[-5, 0, 2**40])),
        "b": tf.train.Feature(float_list=tf.train.FloatList(value=[])),
        "c": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"x", b""])),
    }))
    assert wire.encode_example({"a": ("int64", [-5, 0, 2**40]), "b": ("float", []),
                                "c": ("bytes", [b"x", b""])}) == mixed.SerializeToString(
                                    deterministic=True)


def test_record_written_by_wire_parsed_by_parse_single_example(tmp_path, tf):
    label = np.zeros(14, np.float32)
    label[[0, 13]] = 1.0
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 100
    path = tmp_path / "one.tfrecord"
    write_records(path, [wire.make_example(png, "png", 1024, 512, label,
                                                "00030805_000.png", 30805)])
    (record,) = list(tf.data.TFRecordDataset(str(path)))
    ex = tf.io.parse_single_example(record, wire.feature_spec())
    assert ex["image/encoded"].numpy() == png
    assert ex["image/format"].numpy() == b"png"
    assert (int(ex["image/height"]), int(ex["image/width"])) == (1024, 512)
    assert ex["label"].dtype == tf.float32 and ex["label"].shape == (14,)
    np.testing.assert_array_equal(ex["label"].numpy(), label)
    assert ex["image/name"].numpy() == b"00030805_000.png"
    assert int(ex["patient_id"]) == 30805


COEXIST = """
import importlib, sys
from chexnet_utils.data.tfrecords import wire
assert "tensorflow" not in sys.modules
ours = wire.make_example(b"img", "png", 2, 3, [0.5] * 14, "n.png", 9)
import tensorflow as tf            # registers tensorflow.Example in the default pool
theirs = tf.train.Example.FromString(ours)
assert theirs.features.feature["patient_id"].int64_list.value == [9]
assert theirs.SerializeToString(deterministic=True) == ours
assert wire.decode_example(theirs.SerializeToString())["image/name"] == [b"n.png"]
importlib.reload(wire)             # our pool built again, now with TensorFlow's loaded
assert wire.make_example(b"img", "png", 2, 3, [0.5] * 14, "n.png", 9) == ours
assert wire.Example.DESCRIPTOR is not tf.train.Example.DESCRIPTOR
print("ok")
"""


def test_wire_and_tensorflow_in_one_process():
    out = subprocess.run([sys.executable, "-c", COEXIST], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")
