"""Argument checks shared by the package's public functions.

One place for the "must be >= N" guard that data-set generation, input pipelines and the like
apply to counts and sizes, so every such error reads the same:
``ValueError: batch_size must be >= 1, got 0``.
"""

from __future__ import annotations

__all__ = ["require_at_least"]


def require_at_least(minimum: int, **values: int) -> None:
    """Raise :class:`ValueError` for the first of ``values`` (name=value) below ``minimum``.

    ``require_at_least(1, batch_size=batch_size, num_workers=num_workers)`` checks in the
    order given; the message names the argument: ``"batch_size must be >= 1, got 0"``.
    """
    for name, value in values.items():
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")
