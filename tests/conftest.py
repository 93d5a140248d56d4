"""What every test layer shares: the layer markers and the synthetic TFRecords fixtures.

The tests are sorted by what they need to run (see the README's testing section):

- ``tests/unit``: pure Python; imports neither TensorFlow nor Horovod (checked by
  ``tests/unit/conftest.py``) and starts no MPI, ipyparallel or TensorFlow process (a rule
  of the folder, kept by review: the few subprocesses here run plain Python); ``make unit``.
- ``tests/tf``: imports TensorFlow in-process or runs TensorFlow subprocesses, no MPI.
- ``tests/mpi``: starts MPI, ipyparallel engines, Horovod ranks, tf.data service processes
  or daemons, and the kill tests of every command.
- ``tests/notebooks``: checks of the notebooks themselves (hygiene, the browser test).

Each test is marked with its folder's name (``unit``, ``tf``, ``mpi``, ``notebooks``), and
the notebooks run by nbval (``make test``) with ``notebooks``, so ``pytest -m "not mpi"``
selects by layer; ``slow`` keeps its meaning (more than a few seconds).

``make test`` runs ``tests/`` on two pytest-xdist workers (``-n 2``): most of a
test's time here is spent waiting (engines registering, daemons starting, a hang timeout, a
browser), so a second worker fills the waits. Each test file is a group of its own (its tests
run on one worker, in order, sharing its module fixtures), and files that must not run beside
each other share one :data:`XDIST_GROUPS` group.

The data sets: :func:`tests.support.datasets.synthetic_tfrecords` makes one for given parameters;
the fixtures below make each parameter set once per session, for the tests that share it
(they only read it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.datasets import synthetic_tfrecords

LAYERS = ("unit", "tf", "mpi", "notebooks")
_TESTS = Path(__file__).resolve().parent


def layer_of(path: Path) -> str | None:
    """The layer of a collected file: its folder under ``tests/``, ``notebooks`` for a
    notebook run by nbval, else None."""
    try:
        parts = path.resolve().relative_to(_TESTS).parts
    except ValueError:
        return "notebooks" if path.suffix == ".ipynb" else None
    return parts[0] if len(parts) > 1 and parts[0] in LAYERS else None


XDIST_GROUPS: dict[str, tuple[str, ...]] = {
    # Tests that run a process as another account (uid 4242: the exposure gate's refusal, the
    # private network namespace, the Slurm credential check) and the tests whose servers the
    # exposure gate refuses to start while such a process is alive (tf.data service, MWMS);
    # with them the one-machine Slurm (one per machine: the session's daemons).
    "other-accounts": ("unit/test_exposure.py", "mpi/test_private_network.py",
                       "mpi/test_slurm.py", "mpi/test_tfdata_service.py", "mpi/test_comm.py"),
    # Network namespaces, veth links and shaped links: the link figures are measured.
    "netns": ("mpi/test_two_nodes.py", "mpi/test_remote_engines.py"),
}
"""Test files (under ``tests/``) that share a pytest-xdist worker, one group per resource
that two tests must not use at once."""


def xdist_group_of(path: Path) -> str | None:
    """The pytest-xdist group of a test file: its :data:`XDIST_GROUPS` group, else the file
    itself (a file's tests share its module fixtures, a cluster, a JupyterLab, a browser
    session whose tests follow one another: one worker runs them all, in order). None for
    what is not under ``tests/`` (the notebooks, which never run under xdist)."""
    try:
        rel = path.resolve().relative_to(_TESTS).as_posix()
    except ValueError:
        return None
    return next((g for g, files in XDIST_GROUPS.items() if rel in files), rel)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist's scope scheduler, with :func:`xdist_group_of` as the scope: a group's
    tests go to one worker, in order. (xdist 3.8's own ``--dist loadgroup`` marks node ids
    with ``@group``, which pytest 9.2 no longer lets a plugin change: it ignored the groups.)"""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = Path(str(config.rootpath)) / nodeid.split("::", 1)[0]
            return xdist_group_of(path) or nodeid.split("::", 1)[0]

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its layer (by path), so ``-m`` selects layers."""
    for item in items:
        layer = layer_of(Path(str(item.path)))
        if layer is not None:
            item.add_marker(layer)


TfrecordsFactory = Callable[..., Path]


@pytest.fixture(scope="session")
def make_tfrecords(tmp_path_factory: pytest.TempPathFactory) -> TfrecordsFactory:
    """``make(n, size, shard_size, seed=0)``: :func:`~tests.support.datasets.synthetic_tfrecords`
    made once per session for each parameter set; the TFRecords folder (read it only)."""
    made: dict[tuple[int, int, int, int], Path] = {}

    def make(n: int, size: int, shard_size: int, seed: int = 0) -> Path:
        key = (n, size, shard_size, seed)
        if key not in made:
            root = tmp_path_factory.mktemp(f"tfrecords-{n}x{size}px-{shard_size}-{seed}")
            made[key] = synthetic_tfrecords(root, n, size, shard_size, seed)
        return made[key]

    return make


@pytest.fixture(scope="session")
def hvd_tfrecords(make_tfrecords: TfrecordsFactory) -> Path:
    """120 synthetic 64 px images in shards of 8: the Horovod tests' data (tests/mpi)."""
    return make_tfrecords(120, 64, 8)


@pytest.fixture(scope="session")
def tiny_tfrecords(make_tfrecords: TfrecordsFactory) -> Path:
    """64 synthetic 32 px images in shards of 16: the GPU-path tests' data (tf and mpi)."""
    return make_tfrecords(64, 32, 16)
