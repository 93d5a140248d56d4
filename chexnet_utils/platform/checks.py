"""Argument checks shared by the package's public functions.

One place for the "must be >= N" guard that data-set generation, input pipelines and the like
apply to counts and sizes, so every such error reads the same:
``ValueError: batch_size must be >= 1, got 0``; and one place for string options: a dataclass
field or parameter typed ``Literal["new", "old"]`` has its allowed values in the type
(:func:`literal_values`; :func:`literal_choices` for a dataclass's fields; what the CLI offers
as ``choices``), checked by :func:`require_choices`:
``ValueError: pipeline must be one of 'new', 'old'; got 'fast'``.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import types
import typing
from typing import Any, Literal

__all__ = ["literal_choices", "literal_values", "require_at_least", "require_choices"]


def require_at_least(minimum: int, **values: int) -> None:
    """Raise :class:`ValueError` for the first of ``values`` (name=value) below ``minimum``.

    ``require_at_least(1, batch_size=batch_size, num_workers=num_workers)`` checks in the
    order given; the message names the argument: ``"batch_size must be >= 1, got 0"``.
    """
    for name, value in values.items():
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")


def literal_values(hint: Any) -> tuple[Any, ...] | None:
    """The allowed values of a ``Literal`` type, also of ``Literal[...] | None`` and of the
    items of ``Sequence[Literal[...]]``; ``None`` for any other type."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        return typing.get_args(hint)
    if origin in (typing.Union, types.UnionType, collections.abc.Sequence, list, tuple):
        for member in typing.get_args(hint):
            values = literal_values(member)
            if values is not None:
                return values
    return None


def literal_choices(cls: type) -> dict[str, tuple[Any, ...]]:
    """The fields of dataclass ``cls`` typed with a ``Literal`` and their allowed values, in
    field order (``typing.get_type_hints`` resolves the annotations, postponed or not)."""
    hints = typing.get_type_hints(cls)
    return {f.name: typing.get_args(hints[f.name]) for f in dataclasses.fields(cls)
            if typing.get_origin(hints[f.name]) is Literal}


def require_choices(obj: Any) -> None:
    """Raise :class:`ValueError` for the first ``Literal``-typed field of dataclass instance
    ``obj`` whose value is not one of its type's values."""
    for name, allowed in literal_choices(type(obj)).items():
        value = getattr(obj, name)
        if value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; "
                             f"got {value!r}")
