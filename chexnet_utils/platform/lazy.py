"""Heavy libraries named at a module's top and imported on first use.

TensorFlow, Keras and Horovod take seconds to import (TensorFlow about 4 CPU-seconds on the
CI machine, ``docs/benchmarks.md``). Many modules use them in some functions but must stay
cheap to import: the command line, the unit layer, and the notebook kernels that only drive
engines (notebook 04's kernel never imports TensorFlow; its engines do). Such a module names
the library once, at its top, where a reader and ``grep`` find it::

    tf = lazy_module("tensorflow")
    hvd = lazy_module("horovod.tensorflow")

and ``tf.constant(...)`` in a function imports TensorFlow then, once (``sys.modules``
caches it, as for a plain ``import``). Nothing else changes: the stand-in forwards every
attribute read to the real module. A module whose annotations name the library's types
(``keras.Model``) keeps ``import keras`` under ``TYPE_CHECKING`` for mypy and binds the
stand-in only at run time.

The same mechanism as TensorFlow's own ``LazyLoader`` (``tensorflow/python/util/lazy_loader.py``)
and the standard library's ``importlib.util.LazyLoader``, reduced to attribute forwarding: no
import hook, so an import error is raised where the library is first used, with its usual
message.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class LazyModule:
    """Stands for the module ``name``: the first attribute read imports it, every read is
    forwarded to it."""

    __slots__ = ("_module", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attr)

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<lazy module {self._name!r} ({state})>"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return lazy_module, (self._name,)


def lazy_module(name: str) -> Any:
    """A stand-in for ``import name``, imported on its first attribute read
    (:class:`LazyModule`); typed ``Any``, as the untyped libraries it stands for are."""
    return LazyModule(name)
