"""``tfrecords.wire`` without TensorFlow: the ``tf.train.Example`` messages built from our own
descriptor pool, their bytes (pinned against the former hand-written encoder, which
TensorFlow's parser read), decoding and its errors. TensorFlow's side is in
tests/tf/test_wire.py."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import descriptor_pool
from google.protobuf.message import DecodeError

from chexnet_utils.data.tfrecords import wire
from tests.support.datasets import write_records

# What the hand-written encoder wrote (and tf.train.Example parses) for these inputs.
GOLDEN_FEATURES = {"a": ("int64", [-1, 300]), "b": ("float", [0.5]),
                   "c": ("bytes", [b"x", b""]), "d": ("float", [])}
GOLDEN_BYTES = (b"\n=\n\x15\n\x01a\x12\x10\x1a\x0e\n\x0c\xff\xff\xff\xff\xff\xff\xff\xff\xff"
                b"\x01\xac\x02\n\r\n\x01b\x12\x08\x12\x06\n\x04\x00\x00\x00?\n\x0c\n\x01c"
                b"\x12\x07\n\x05\n\x01x\n\x00\n\x07\n\x01d\x12\x02\x12\x00")
GOLDEN_EXAMPLE_HEX = (
    "0ad5010a180a0d696d6167652f656e636f64656412070a050a03504e470a170a0c696d6167652f666f726d"
    "617412070a050a03706e670a150a0c696d6167652f68656967687412051a030a01020a170a0a696d616765"
    "2f6e616d6512090a070a056e2e706e670a140a0b696d6167652f776964746812051a030a01030a450a056c"
    "6162656c123c123a0a3800000000000000000000000000000000000000000000000000000000000000000000"
    "0000000000000000000000000000000000000000803f0a130a0a70617469656e745f696412051a030a0107")


def test_messages_are_tensorflow_example_in_a_pool_of_their_own():
    assert wire.Example.DESCRIPTOR.full_name == "tensorflow.Example"
    assert wire.Example.DESCRIPTOR.file.pool is not descriptor_pool.Default()
    feature = wire.Feature.DESCRIPTOR
    assert [f.name for f in feature.oneofs_by_name["kind"].fields] == [
        "bytes_list", "float_list", "int64_list"]
    assert wire.Features.DESCRIPTOR.fields_by_name["feature"].message_type.GetOptions().map_entry


def test_encoding_is_byte_identical_to_the_former_encoder():
    assert wire.encode_example(GOLDEN_FEATURES) == GOLDEN_BYTES
    # insertion order does not matter: deterministic serialization sorts the keys
    assert wire.encode_example(dict(reversed(GOLDEN_FEATURES.items()))) == GOLDEN_BYTES
    label = np.zeros(14, np.float32)
    label[13] = 1.0
    assert wire.make_example(b"PNG", "png", 2, 3, label, "n.png", 7).hex() == GOLDEN_EXAMPLE_HEX


def test_decode_round_trip_values():
    features = {"ü/key": ("int64", [2**63 - 1, -2**63, 0]), "f": ("float", [0.25, -1.5]),
                "b": ("bytes", [b"\x00" * 1000, b""]), "e": ("bytes", []), "g": ("int64", [])}
    decoded = wire.decode_example(wire.encode_example(features))
    assert decoded == {k: v for k, (_, v) in features.items()}
    assert list(decoded) == sorted(features)  # keys in the order they are written
    assert wire.decode_example(GOLDEN_BYTES) == {"a": [-1, 300], "b": [0.5], "c": [b"x", b""],
                                                 "d": []}
    assert wire.decode_example(b"") == {}  # an empty Example is valid protobuf
    ex = wire.decode_example(wire.make_example(b"\x89PNG", "png", 64, 48, [1.0] + [0.0] * 13,
                                               "00000007_001.png", 123456789))
    assert ex == {"image/encoded": [b"\x89PNG"], "image/format": [b"png"],
                  "image/height": [64], "image/width": [48], "label": [1.0] + [0.0] * 13,
                  "image/name": [b"00000007_001.png"], "patient_id": [123456789]}


@pytest.mark.parametrize("bad", [
    b"\xff",                             # a truncated varint key
    b"\x0a\x05abc",                      # a length running past the end
    GOLDEN_BYTES[:-3],                   # a truncated record
    b"\x0a\x07\x0a\x05\x0a\x01\xff\x12\x00",  # a key that is not UTF-8
])
def test_decoding_malformed_bytes_raises_value_error(bad):
    with pytest.raises(ValueError, match="not a serialized tf.train.Example") as info:
        wire.decode_example(bad)
    assert isinstance(info.value.__cause__, DecodeError)


def test_encoding_rejects_unknown_kinds_and_wrong_labels():
    with pytest.raises(ValueError, match="unknown kind 'str'"):
        wire.encode_example({"a": ("str", ["x"])})
    with pytest.raises(ValueError, match="14 values"):
        wire.make_example(b"", "png", 1, 1, [0.0] * 13, "n.png", 1)


def test_read_examples_from_written_records(tmp_path):
    path = tmp_path / "x.tfrecord"
    label = np.zeros(14, np.float32)
    label[[2, 5]] = 1.0
    write_records(path, [wire.make_example(bytes(range(256)) * 4, "png", 32, 16, label,
                                                f"{i:08d}_000.png", i) for i in range(3)])
    found = list(wire.read_examples(path))
    assert [ex["name"] for ex in found] == [f"{i:08d}_000.png" for i in range(3)]
    assert [ex["patient_id"] for ex in found] == [0, 1, 2]
    ex = found[0]
    assert (ex["height"], ex["width"], ex["format"]) == (32, 16, "png")
    assert ex["image_bytes"] == bytes(range(256)) * 4
    assert ex["label"].dtype == np.float32
    np.testing.assert_array_equal(ex["label"], label)
