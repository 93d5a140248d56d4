"""ipyparallel MPI engines started and torn down from Python (what notebook 04 does)."""

import os
import signal
import sys
import stat
import threading
import time

import cloudpickle
import psutil
import pytest

from chexnet_utils.distributed import EngineFailure, MPICluster, rank_info

pytestmark = pytest.mark.mpi
# the engines cannot import this test module: send its functions by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _alive(pids):
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _hvd_allreduce_loop(seconds):
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    end = time.time() + seconds
    total = 0.0
    while time.time() < end:
        total += float(hvd.allreduce(tf.ones([1000]), op=hvd.Sum)[0])
        time.sleep(0.05)
    return total


def test_context_manager_runs_on_every_rank_and_leaves_nothing_behind():
    with MPICluster(n=2) as cluster:
        infos = cluster.run(rank_info)
        pids = cluster.pids()
        profile = cluster._profile_dir
        assert stat.S_IMODE(os.stat(profile).st_mode) == 0o700
        jsons = [os.path.join(r, f) for r, _, fs in os.walk(profile) for f in fs
                 if f.endswith(".json")]
        assert jsons and all(stat.S_IMODE(os.stat(j).st_mode) == 0o600 for j in jsons)
        # the controller and the engines listen on loopback only (mpiexec's own out-of-band
        # listener cannot be bound to one address in Open MPI 4.1: documented exception)
        listening = [c.laddr.ip for pid in pids if _alive([pid])
                     and "mpiexec" not in psutil.Process(pid).name()
                     for c in psutil.Process(pid).net_connections(kind="tcp")
                     if c.status == psutil.CONN_LISTEN]
        assert listening and set(listening) == {"127.0.0.1"}
    assert [i["rank"] for i in infos] == [0, 1]
    assert {i["pid"] for i in infos} <= pids
    assert len(pids) >= 4  # controller, mpiexec, two engines (and nannies)
    assert _alive(pids) == []
    assert not os.path.exists(profile)
    assert cluster.start_seconds < 60 and cluster.stop_seconds < 20


def test_exception_inside_with_block_still_tears_down():
    with pytest.raises(Exception, match="ZeroDivisionError"):
        with MPICluster(n=2) as cluster:
            pids = cluster.pids()
            cluster.run(lambda: 1 / 0)
    assert _alive(pids) == []


def test_killed_engine_fails_the_call_quickly_and_teardown_is_clean():
    with MPICluster(n=2) as cluster:
        pids = cluster.pids()
        victim = cluster.engine_pids[cluster._ranks.index(1)]
        threading.Timer(4.0, os.kill, (victim, signal.SIGKILL)).start()
        t0 = time.perf_counter()
        with pytest.raises(EngineFailure, match="died"):
            cluster.run(_hvd_allreduce_loop, 120)
        assert time.perf_counter() - t0 < 45
    assert _alive(pids) == []


def test_timeout_is_an_engine_failure():
    with MPICluster(n=1) as cluster:
        with pytest.raises(EngineFailure, match="did not finish within"):
            cluster.run(time.sleep, 30, timeout=2)


def test_mpiexec_options_are_passed_through():
    c = MPICluster(n=4, map_by="socket", bind_to="core", hostfile="hosts", mpi_args=["-x", "A"])
    assert c._mpiexec_args() == ["--map-by", "socket", "--bind-to", "core", "--hostfile",
                                 "hosts", "-x", "A"]
    assert "--oversubscribe" in MPICluster(n=64)._mpiexec_args()
    with pytest.raises(ValueError):
        MPICluster(n=0)
