"""The unit layer's promise, checked: no test here imports TensorFlow or Horovod.

A test that does fails at its teardown, naming the module; it belongs in ``tests/tf`` (or
the import in the package should be lazy). The check sees imports made during the test, so
it holds whatever ran before (``make unit`` runs this folder alone).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

HEAVY = ("tensorflow", "horovod")


def heavy_modules() -> set[str]:
    """Which of :data:`HEAVY` are imported in this process."""
    return {name for name in HEAVY if name in sys.modules}


@pytest.fixture(autouse=True)
def imports_no_tensorflow() -> Iterator[None]:
    """Fail the test if it imported TensorFlow or Horovod."""
    before = heavy_modules()
    yield
    new = heavy_modules() - before
    if new:
        pytest.fail(f"a unit test imported {', '.join(sorted(new))}: move it to tests/tf "
                    "(or tests/mpi)", pytrace=False)
