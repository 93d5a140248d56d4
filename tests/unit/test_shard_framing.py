"""#46 item 3: a crafted shard is caught before TensorFlow reads it. ``check_framing`` walks the
record headers (lengths against the bytes left, the lengths' CRCs) and every pipeline's file
list passes through it (``list_shards``); the commands and TensorFlow itself on such a shard
are in tests/tf/test_crafted_shard.py."""

from __future__ import annotations

import importlib
import struct
from pathlib import Path

import pytest

from chexnet_utils.data.tfrecords import list_shards
from chexnet_utils.data.tfrecords.wire import (
    ShardFramingError,
    check_framing,
    frame_record,
    masked_crc32c,
)


def crafted_header(length: int = 2 ** 62) -> bytes:
    """A record header announcing ``length`` bytes, with the length's valid masked CRC."""
    head = struct.pack("<Q", length)
    return head + struct.pack("<I", masked_crc32c(head))


def test_a_good_file_is_counted_and_an_empty_one_is_fine(tmp_path: Path) -> None:
    good = tmp_path / "good.tfrecord"
    good.write_bytes(b"".join(frame_record(bytes([i]) * (i * 7)) for i in range(5)))
    assert check_framing(good) == 5
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    assert check_framing(empty) == 0


@pytest.mark.parametrize("tail, where, what", [
    (crafted_header() + b"x" * 100, 30, "length field says 4611686018427387904 bytes"),
    (crafted_header()[:7], 30, "truncated record header"),
    (struct.pack("<Q", 4) + b"\0\0\0\0" + b"abcd" + b"\0\0\0\0", 30, "corrupt record length"),
    (crafted_header(10) + b"short", 30, "truncated record at byte 30"),
], ids=["2**62 with a valid CRC", "cut header", "bad length CRC", "cut data"])
def test_broken_framing_is_one_line_naming_the_file_and_offset(tmp_path: Path, tail: bytes,
                                                                 where: int, what: str) -> None:
    bad = tmp_path / "train-00000-of-00001.tfrecord"
    bad.write_bytes(frame_record(b"y" * 14) + tail)  # the first record is 30 bytes framed
    with pytest.raises(ShardFramingError) as e:
        check_framing(bad)
    message = str(e.value)
    assert message.startswith(f"{bad}: ") and f"byte {where}" in message and what in message
    assert "\n" not in message and isinstance(e.value, ValueError)


def test_list_shards_checks_every_shard_once_per_unchanged_file(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    for i in range(2):
        (tmp_path / f"train-0000{i}-of-00002.tfrecord").write_bytes(frame_record(b"ok"))
    walked: list[Path] = []
    verify = importlib.import_module("chexnet_utils.data.tfrecords.verify")  # the module

    monkeypatch.setattr(verify, "check_framing", lambda p: walked.append(p) or 1)
    monkeypatch.setattr(verify, "_FRAMED", set())
    assert len(list_shards(tmp_path, "train")) == 2 and len(walked) == 2
    list_shards(tmp_path, "train")
    assert len(walked) == 2  # unchanged files: not walked again
    (tmp_path / "train-00001-of-00002.tfrecord").write_bytes(crafted_header())
    monkeypatch.setattr(verify, "check_framing", check_framing)
    with pytest.raises(ShardFramingError, match="train-00001-of-00002.tfrecord: truncated"):
        list_shards(tmp_path, "train")


def test_verify_decode_reports_an_image_over_the_converters_limit_undecoded(tmp_path: Path
                                                                          ) -> None:
    """#46 item 3 / review N4: ``verify --decode`` uses the converter's pixel limit and lists
    a decompression bomb as a problem, before decoding it."""
    import io

    from PIL import Image, ImageFile

    from chexnet_utils.data import tfrecords as T
    from chexnet_utils.data.tfrecords.images import MAX_PIXELS
    from chexnet_utils.data.tfrecords.wire import make_example, read_examples
    from tests.support.datasets import make_dataset

    root, _ = make_dataset(tmp_path / "data", n_train_val=8, n_test=2, size=16)
    out = tmp_path / "tfr"
    T.convert_dataset(root, out, shard_size=4, workers=1, progress=False)
    shard = list_shards(out, "train")[0]
    side = 4200  # 17.6 Mpx: over MAX_PIXELS, under PIL's own limits (it warns at 89 Mpx)
    assert side * side > MAX_PIXELS
    buf = io.BytesIO()
    Image.new("1", (side, side)).save(buf, format="PNG")  # a few kB on disk
    examples = list(read_examples(shard))
    first = examples[0]
    records = [make_example(buf.getvalue(), "png", side, side, first["label"], first["name"],
                            first["patient_id"])]
    records += [make_example(e["image_bytes"], e["format"], e["height"], e["width"],
                             e["label"], e["name"], e["patient_id"]) for e in examples[1:]]
    shard.write_bytes(b"".join(frame_record(r) for r in records))
    loaded: list[str] = []
    real_load = ImageFile.ImageFile.load
    try:
        ImageFile.ImageFile.load = lambda self: loaded.append(self.size) or real_load(self)
        problems = T.verify(out, decode_images=True).problems
    finally:
        ImageFile.ImageFile.load = real_load
    bombs = [p for p in problems if "too large to decode" in p]
    assert len(bombs) == 1 and first["name"] in bombs[0] and str(MAX_PIXELS) in bombs[0]
    assert (side, side) not in loaded  # refused before decoding
