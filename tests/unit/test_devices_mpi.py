"""Thread budgets, the MPI environment and mpirun command lines, without starting MPI. The
runs under mpirun are in tests/mpi/test_devices_mpi.py."""

import os
import sys

import pytest

from chexnet_utils.cluster import distributed
from chexnet_utils.hardware import devices


def test_thread_budget():
    assert devices.cpu_thread_budget(1, cores=8) == 8
    assert devices.cpu_thread_budget(3, cores=8) == 2
    assert devices.cpu_thread_budget(16, cores=8) == 1
    with pytest.raises(ValueError):
        devices.cpu_thread_budget(0)


def test_mpi_environment_is_root_safe_and_budgets_threads():
    env = distributed.mpi_environment(2, base={"PATH": "/bin"})
    if os.geteuid() == 0:
        assert (env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
                and env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1")
    else:
        assert "OMPI_ALLOW_RUN_AS_ROOT" not in env
    assert env["OMP_NUM_THREADS"] == str(devices.cpu_thread_budget(2))
    # a user's own setting wins
    assert distributed.mpi_environment(2, base={"OMP_NUM_THREADS": "7"})["OMP_NUM_THREADS"] == "7"


def test_mpirun_command_options():
    cmd = distributed.mpirun_command(4, ["python", "train.py"], map_by="socket",
                                     bind_to="core", hostfile="hosts")
    assert cmd[1:3] == ["-np", "4"]
    assert cmd[cmd.index("--map-by") + 1] == "socket"
    assert cmd[cmd.index("--bind-to") + 1] == "core"
    assert cmd[cmd.index("--hostfile") + 1] == "hosts"
    assert cmd[-2:] == [sys.executable, "train.py"]
    with pytest.raises(ValueError):
        distributed.mpirun_command(0, ["x"])


def test_json_objects_survive_merged_lines():
    text = 'noise {"rank": 1, "x": [1, 2]}{"rank": 0}\nwarning: {not json}\n{"rank": 2}\n'
    assert distributed.json_objects(text) == [{"rank": 1, "x": [1, 2]}, {"rank": 0}, {"rank": 2}]


def test_mpi_yields_the_core_only_when_the_processes_fill_every_core(monkeypatch):
    key = "OMPI_MCA_mpi_yield_when_idle"
    monkeypatch.setattr(distributed, "usable_cores", lambda: 2)
    assert distributed.mpi_env_overrides(2, base={})[key] == "1"
    assert distributed.mpi_env_overrides(3, base={})[key] == "1"  # oversubscribed
    assert key not in distributed.mpi_env_overrides(1, base={})  # nobody to wait for
    # a user's choice wins (0: spin for the lowest latency)
    assert key not in distributed.mpi_env_overrides(2, base={key: "0"})
    assert distributed.mpi_environment(2, base={key: "0"})[key] == "0"
    monkeypatch.setattr(distributed, "usable_cores", lambda: 40)  # a GPU node: spare cores
    assert key not in distributed.mpi_env_overrides(4, base={})
    assert key not in distributed.mpi_env_overrides(4, base={}, bind_to="socket")
    # bound to one core each, a rank has no spare core however many the machine has
    assert distributed.mpi_env_overrides(2, base={}, bind_to="core")[key] == "1"
    assert key not in distributed.mpi_env_overrides(1, base={}, bind_to="core")
