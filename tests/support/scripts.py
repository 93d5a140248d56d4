"""The repository's scripts (``scripts/*.py``, not a package) loaded as modules, so the unit
tests can call their functions: one place that loads them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` executed as a module named ``name`` (its ``__main__`` block not
    run)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None, f"no script {name}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
