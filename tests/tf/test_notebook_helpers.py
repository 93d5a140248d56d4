"""Helpers moved out of the notebooks into the package that need TensorFlow."""

from __future__ import annotations

from pathlib import Path

import pytest
import tensorflow as tf

from chexnet_utils import pipelines, tfrecords


def test_file_names_are_base_names_in_dataset_order(tmp_path: Path) -> None:
    paths = [str(tmp_path / "sub" / f"train-{i:05d}-of-00003.tfrecord") for i in (2, 0, 1)]
    names = tf.data.Dataset.from_tensor_slices(paths)
    assert pipelines.file_names(names) == ["train-00002-of-00003.tfrecord",
                                           "train-00000-of-00003.tfrecord",
                                           "train-00001-of-00003.tfrecord"]
    assert pipelines.file_names(names.shard(2, 1)) == ["train-00000-of-00003.tfrecord"]
    assert pipelines.file_names(names.take(0)) == []


def test_decode_ms_times_every_read_record_after_one_warm_up(
        tiny_tfrecords: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from chexnet_utils.tfrecords import images

    calls: list[tuple[bytes, int | None]] = []
    clock = iter([10.0, 10.5])
    monkeypatch.setattr(images, "decode_image",
                        lambda b, size=None: calls.append((bytes(b.numpy()), size)))
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    ms = tfrecords.decode_ms(tiny_tfrecords, 24, n=5)
    assert ms == pytest.approx(0.5 / 5 * 1e3)
    assert len(calls) == 6 and calls[0] == calls[1]          # warm-up, then the 5 timed
    assert {size for _, size in calls} == {24}
    assert len({blob for blob, _ in calls[1:]}) == 5          # five different records


def test_decode_ms_really_decodes_and_checks_n(tiny_tfrecords: Path) -> None:
    assert tfrecords.decode_ms(tiny_tfrecords, 16, n=3) > 0.0
    with pytest.raises(ValueError, match="n must be"):
        tfrecords.decode_ms(tiny_tfrecords, 16, n=0)
