"""Helpers moved out of the notebooks into the package that need TensorFlow."""

from __future__ import annotations

from pathlib import Path

import pytest

from chexnet_utils.bench import conversion


def test_decode_ms_times_every_read_record_after_one_warm_up(
        tiny_tfrecords: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from chexnet_utils.data.tfrecords import images

    calls: list[tuple[bytes, int | None]] = []
    clock = iter([10.0, 10.5])
    monkeypatch.setattr(images, "decode_image",
                        lambda b, size=None: calls.append((bytes(b.numpy()), size)))
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    ms = conversion.decode_ms(tiny_tfrecords, 24, n=5)
    assert ms == pytest.approx(0.5 / 5 * 1e3)
    assert len(calls) == 6 and calls[0] == calls[1]          # warm-up, then the 5 timed
    assert {size for _, size in calls} == {24}
    assert len({blob for blob, _ in calls[1:]}) == 5          # five different records


def test_decode_ms_really_decodes_and_checks_n(tiny_tfrecords: Path) -> None:
    assert conversion.decode_ms(tiny_tfrecords, 16, n=3) > 0.0
    with pytest.raises(ValueError, match="n must be"):
        conversion.decode_ms(tiny_tfrecords, 16, n=0)
