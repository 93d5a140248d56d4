"""MPI processes started by mpirun: a failing run reports its stderr, two ranks get distinct
ranks and a share of the cores and receive the yield setting. The pure helpers are in
tests/unit/test_devices_mpi.py."""

import pytest

from chexnet_utils.cluster import distributed
from chexnet_utils.hardware import devices


def test_failing_mpirun_raises_with_stderr():
    with pytest.raises(RuntimeError, match="mpirun exited with"):
        distributed.run_mpi_json(1, ["python", "-c", "import sys; sys.exit('boom')"], timeout=60)


@pytest.mark.mpi
def test_two_processes_get_distinct_ranks_and_a_share_of_the_cores():
    infos = distributed.run_mpi_json(2, ["python", "-m", "chexnet_utils", "whoami"], timeout=120)
    assert sorted(i["rank"] for i in infos) == [0, 1]
    assert all(i["size"] == 2 and i["local_size"] == 2 for i in infos)
    assert sorted(i["local_rank"] for i in infos) == [0, 1]
    assert len({i["pid"] for i in infos}) == 2
    assert all(i["device"] == "CPU" and i["threads"] == devices.cpu_thread_budget(2)
               for i in infos)


@pytest.mark.skipif(devices.usable_cores() > 2, reason="needs the processes to fill the cores")
def test_mpi_processes_receive_the_yield_setting():
    code = ("import json, os; print(json.dumps({'rank': int(os.environ['OMPI_COMM_WORLD_RANK']),"
            " 'yield': os.environ.get('OMPI_MCA_mpi_yield_when_idle')}))")
    infos = distributed.run_mpi_json(2, ["python", "-c", code], timeout=60)
    assert sorted(i["rank"] for i in infos) == [0, 1]
    assert all(i["yield"] == "1" for i in infos)


def test_report_bindings_shows_open_mpis_default_is_not_unbound():
    """#25 item 4: with no --bind-to, Open MPI 4.1 binds each of 2 processes to a core;
    ``"none"`` leaves them free; oversubscribed, it does not bind."""
    from chexnet_utils.cluster.distributed import report_bindings
    from chexnet_utils.hardware.devices import usable_cores

    default = report_bindings(2)
    assert [line.split(":")[0] for line in default] == ["rank 0", "rank 1"]
    if usable_cores() >= 2:
        assert all("bound to" in line and "core" in line for line in default), default
    assert all("not bound" in line for line in report_bindings(2, bind_to="none"))
    over = report_bindings(usable_cores() + 1)
    assert len(over) == usable_cores() + 1 and all("not bound" in line for line in over)
