"""ipyparallel MPI cluster options, without starting a cluster: mpiexec's arguments. The
clusters started and torn down from Python are in tests/mpi/test_cluster.py."""

import subprocess

import psutil
import pytest

from chexnet_utils.cluster.distributed import MPICluster


def test_mpiexec_options_are_passed_through():
    c = MPICluster(n=4, map_by="socket", bind_to="core", hostfile="hosts", mpi_args=["-x", "A"])
    assert c._mpiexec_args() == ["--map-by", "socket", "--bind-to", "core", "--hostfile",
                                 "hosts", "-x", "A"]
    assert "--oversubscribe" in MPICluster(n=64)._mpiexec_args()
    with pytest.raises(ValueError):
        MPICluster(n=0)


def test_engines_are_unbound_by_default_as_horovodrun_leaves_them():
    """#25 item 4: the default binding is explicit (horovodrun's -bind-to none); None means
    Open MPI's own default (no --bind-to); a --bind-to in mpi_args (a GPU binding plan) wins."""
    from chexnet_utils.cluster.distributed import HOROVODRUN_BIND_TO, mpirun_option_given

    assert HOROVODRUN_BIND_TO == "none"
    assert MPICluster(n=2)._mpiexec_args()[:2] == ["--bind-to", "none"]
    assert "--bind-to" not in MPICluster(n=2, bind_to=None)._mpiexec_args()
    plan = ["--map-by", "ppr:1:socket", "--bind-to", "socket"]
    args = MPICluster(n=2, mpi_args=plan)._mpiexec_args()
    assert args.count("--bind-to") == 1 and args[-4:] == plan
    assert mpirun_option_given(["-bind-to=core"], "bind-to")
    assert not mpirun_option_given(["-x", "bind-to"], "bind-to")


def test_curve_is_on_exactly_when_the_controller_leaves_loopback():
    from chexnet_utils.cluster.distributed import MPICluster

    assert MPICluster(n=2).curve is False
    assert MPICluster(n=2, controller_ip="10.77.0.1").curve is True
    assert MPICluster(n=2, controller_ip="10.77.0.1", curve=False).curve is False


def test_make_private_closes_the_folder_and_its_files(tmp_path):
    import os
    import stat

    from chexnet_utils.platform.atomic import make_private

    (tmp_path / "security").mkdir(mode=0o755)
    key = tmp_path / "security" / "ipcontroller-client.json"
    key.write_text("{}")
    key.chmod(0o644)
    make_private(tmp_path)
    assert stat.S_IMODE(os.stat(tmp_path).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "security").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600


@pytest.mark.parametrize("ip", ["0.0.0.0", "::", "*", ""])
def test_controllers_refuse_to_listen_on_every_interface(ip: str) -> None:
    from tests.support.remote_engines import RemoteEngines

    with pytest.raises(ValueError, match="every interface"):
        MPICluster(n=1, controller_ip=ip)
    with pytest.raises(ValueError, match="every interface"):
        RemoteEngines(ip, n=1)
    assert MPICluster(n=1, controller_ip="10.77.0.1").curve   # a named interface: encrypted


# --- pids held as process handles (#30 item 5) -------------------------------------------------

def _reused_pid_handle() -> tuple[subprocess.Popen, psutil.Process]:
    """A running process, and a handle with its pid that was captured from an *earlier*
    process of that pid (its start time differs): what a stored pid turns into after reuse."""
    bystander = subprocess.Popen(["sleep", "60"])
    handle = psutil.Process(bystander.pid)
    earlier = handle.create_time() - 1000.0                # the earlier process's start
    handle._create_time, handle._ident = earlier, (bystander.pid, earlier)  # noqa: SLF001
    return bystander, handle


def test_mpicluster_stop_never_signals_a_process_that_reused_a_tracked_pid():
    bystander, handle = _reused_pid_handle()
    try:
        cluster = MPICluster(n=1, stop_timeout=0.3)
        cluster._tracked = {bystander.pid: handle}
        cluster.stop()
        assert bystander.poll() is None       # still running: not ours any more
    finally:
        bystander.kill()
        bystander.wait()


def test_remote_engines_signal_only_what_they_captured_on_this_machine(monkeypatch):
    from tests.support import remote_engines

    bystander, handle = _reused_pid_handle()
    try:
        rc = remote_engines.RemoteEngines("10.0.0.5", n=1)
        monkeypatch.setattr(remote_engines, "boot_id", lambda: "this-host")
        rc._capture_local([("other-host", bystander.pid)])   # an engine elsewhere, same pid
        assert rc._local == []
        rc._capture_local([("this-host", bystander.pid)])
        assert [p.pid for p in rc._local] == [bystander.pid]
        rc._local = [handle]                                  # ... later reused
        assert rc.stop(timeout=0.3) == []
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


# --- engine errors by ipyparallel's types, not by matching their text --------------------------

def test_engine_death_is_told_by_ipyparallel_error_types():
    from ipyparallel import error

    from chexnet_utils.cluster.distributed import engine_died

    died = error.EngineError("Engine 1 died while running task 'abc'")
    assert engine_died(died)
    assert engine_died(error.RemoteError("EngineError", "gone", ""))
    assert engine_died(error.CompositeError("one or more exceptions", [
        ("ValueError", "bad", "", {}), ("EngineError", "gone", "", {})]))
    assert not engine_died(error.CompositeError("one or more exceptions", [
        ("ValueError", "the word died in a message is not a death", "", {})]))
    assert not engine_died(RuntimeError("an engine died"))  # no text matching


def test_error_line_names_the_remote_error_asked_for():
    from ipyparallel import error

    from chexnet_utils.training.experiments import error_line

    composite = error.CompositeError("one or more exceptions", [
        ("RanksDiverged", "the workers hold different weights after step 2", "tb", {}),
        ("RanksDiverged", "the workers hold different weights after step 2", "tb", {})])
    assert error_line(composite, "RanksDiverged") == (
        "RanksDiverged: the workers hold different weights after step 2")
    remote = error.RemoteError("FloatingPointError", "not finite", "tb")
    assert error_line(remote, "FloatingPointError") == "FloatingPointError: not finite"
    assert error_line(ValueError("first\nsecond"), "RanksDiverged") == "first"
