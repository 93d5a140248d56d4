"""What every answer check shares: the verdict it prints and the reading of an answer.

A check prints ``Correct: ...`` or ``Not yet: <a hint>`` (:func:`verdict`) and returns
``True`` or ``False``; it never raises on a wrong or missing answer. The placeholder
``answer = None`` gets a hint of its own (:func:`missing`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing.TypeIs from Python 3.13

SAME = "same"
"""The answer of :func:`check_which_is_faster` when neither is clearly faster."""


def verdict(ok: bool, correct: str, hint: str) -> bool:
    """Print ``Correct: ...`` or ``Not yet: ...`` and return ``ok``."""
    print(f"Correct: {correct}" if ok else f"Not yet: {hint}")
    return ok


def missing(answer: object, hint: str) -> TypeIs[None]:
    """``True`` (after printing a hint) when the answer is still the ``None`` placeholder."""
    if answer is None:
        print(f"Not yet: replace `answer = None` with your answer. Hint: {hint}")
        return True
    return False


def number(x: Any) -> float | None:
    """``x`` as a float, or ``None`` when it is not a number."""
    if isinstance(x, bool):
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def close(answer: Any, expected: float, rel: float = 0.0, abs_: float = 0.0) -> bool:
    """``answer`` is a number within ``rel`` (relative) or ``abs_`` of ``expected``."""
    value = number(answer)
    return value is not None and math.isclose(value, expected, rel_tol=rel, abs_tol=abs_)


def pair(answer: Any) -> tuple[float, float] | None:
    """``(a, b)`` from a 2-sequence of numbers, else ``None``."""
    if isinstance(answer, str) or not isinstance(answer, Sequence) or len(answer) != 2:
        return None
    a, b = number(answer[0]), number(answer[1])
    return None if a is None or b is None else (a, b)
