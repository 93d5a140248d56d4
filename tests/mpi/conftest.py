"""Fixtures of the MPI layer: a real one-machine Slurm (``local_slurm``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chexnet_utils.cluster.slurm import slurm_missing_reason
from chexnet_utils.cluster.slurm_local import LocalSlurm
from chexnet_utils.platform.processes import alive


@pytest.fixture(scope="session")
def local_slurm() -> Iterator[LocalSlurm]:
    """``munged``, ``slurmctld`` and ``slurmd`` of this user in a temporary state folder, the
    node idle; stopped at the end of the session with no daemon (or job process) left,
    checked by pid. Skips with the install command when Slurm is missing."""
    reason = slurm_missing_reason()
    if reason:
        pytest.skip(reason)
    slurm = LocalSlurm().start()
    try:
        yield slurm
    finally:
        pids = slurm.processes()
        state = slurm.state
        slurm.stop()
        assert alive(pids) == [], f"Slurm processes left: {alive(pids)}"
        assert state is not None and not state.exists()
