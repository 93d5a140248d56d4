"""ipyparallel MPI cluster options, without starting a cluster: mpiexec's arguments. The
clusters started and torn down from Python are in tests/mpi/test_cluster.py."""

import pytest

from chexnet_utils.distributed import MPICluster


def test_mpiexec_options_are_passed_through():
    c = MPICluster(n=4, map_by="socket", bind_to="core", hostfile="hosts", mpi_args=["-x", "A"])
    assert c._mpiexec_args() == ["--map-by", "socket", "--bind-to", "core", "--hostfile",
                                 "hosts", "-x", "A"]
    assert "--oversubscribe" in MPICluster(n=64)._mpiexec_args()
    with pytest.raises(ValueError):
        MPICluster(n=0)
