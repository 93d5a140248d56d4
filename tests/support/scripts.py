"""The repository's scripts (``scripts/*.py``, not a package) loaded as modules, so the unit
tests can call their functions: one place that loads them; and the launcher commands the MPI
tests run a script under (``mpirun`` or ``horovodrun``)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from chexnet_utils.cluster.distributed import mpirun_command

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` executed as a module named ``name`` (its ``__main__`` block not
    run)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None, f"no script {name}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def launcher_command(launcher: str, n_procs: int, argv: Sequence[str]) -> list[str]:
    """The command that runs ``argv`` on ``n_procs`` processes of this machine under
    ``"mpirun"`` (:func:`mpirun_command`) or ``"horovodrun"`` (this environment's, with
    ``-H localhost:N``); ``argv`` starting with ``python`` runs this interpreter."""
    if launcher == "mpirun":
        return mpirun_command(n_procs, argv)
    if launcher != "horovodrun":
        raise ValueError(f"launcher must be 'mpirun' or 'horovodrun', got {launcher!r}")
    args = [sys.executable, *argv[1:]] if argv and argv[0] == "python" else list(argv)
    return [str(Path(sys.executable).parent / "horovodrun"), "-np", str(n_procs), "-H",
            f"localhost:{n_procs}", *args]
