"""The exercise check of notebook 03 that needs a built model (TensorFlow): the feature map
side of a DenseNet block. The other checks are in tests/unit/test_exercises.py."""

from __future__ import annotations

import pytest

from chexnet_utils import exercises


def verdict(capsys: pytest.CaptureFixture[str], result: bool) -> bool:
    """``result``, after checking that the printed verdict agrees with it."""
    out = capsys.readouterr().out
    assert out.startswith("Correct: " if result else "Not yet: "), out
    return result


def test_feature_map_side(capsys):
    pytest.importorskip("tensorflow")
    from chexnet_utils.models import build_chexnet

    model = build_chexnet("small", 64, weights=None)
    side = model.get_layer("backbone").get_layer("block2_relu").output.shape[1]
    assert verdict(capsys, exercises.check_feature_map_side(side, model, "block2_relu"))
    assert verdict(capsys, exercises.check_feature_map_side(
        side, model, "backbone/block2_relu"))
    assert not verdict(capsys, exercises.check_feature_map_side(64, model, "block2_relu"))
    last = model.get_layer("backbone").get_layer("block4_relu").output.shape[1]
    assert not verdict(capsys, exercises.check_feature_map_side(last, model, "block2_relu"))
