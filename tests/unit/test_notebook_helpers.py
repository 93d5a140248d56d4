"""Helpers moved out of the notebooks into the package (no TensorFlow needed here)."""

from __future__ import annotations

import pytest

from chexnet_utils.input import feeding


def test_sleeping_step_sleeps_the_given_seconds_per_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(feeding.time, "sleep", slept.append)
    step = feeding.sleeping_step(0.025)
    assert step(("images", "labels")) is None
    step(None)
    assert slept == [0.025, 0.025]


def test_sleeping_step_rejects_a_negative_duration() -> None:
    with pytest.raises(ValueError, match="seconds"):
        feeding.sleeping_step(-1.0)
