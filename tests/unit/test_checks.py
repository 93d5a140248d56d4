"""Tests for chexnet_utils.platform.checks: the shared "must be >= N" argument guard."""

from __future__ import annotations

import pytest

from chexnet_utils.platform.checks import require_at_least


def test_values_at_or_above_the_minimum_pass():
    require_at_least(1, batch_size=1, num_workers=8)
    require_at_least(16, size=16)
    require_at_least(0)


def test_first_value_below_the_minimum_is_named():
    with pytest.raises(ValueError, match=r"^num_workers must be >= 1, got 0$"):
        require_at_least(1, batch_size=4, num_workers=0, image_size=-1)
    with pytest.raises(ValueError, match=r"^size must be >= 16, got 15$"):
        require_at_least(16, size=15)
