"""A real Slurm on this machine: daemons up and down, the batch script, engines as a Slurm job.

Every test needs ``munged``/``slurmctld``/``slurmd`` (``apt-get install slurm-wlm munge``),
not root (the daemons run as the user of the test; the non-root CI leg runs the first test
as a normal user); without them they skip with that reason. The shared Slurm is the session
fixture ``local_slurm`` (tests/mpi/conftest.py), which checks by pid at the end that nothing
is left.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import cloudpickle
import pytest

from chexnet_utils.cluster import slurm_local
from chexnet_utils.cluster.slurm import slurm_missing_reason
from chexnet_utils.cluster.slurm_access import invoking_user, loopback_bind_address
from chexnet_utils.cluster.slurm_local import LocalSlurm
from chexnet_utils.platform.processes import alive, wait_pids_gone
from tests.support.listeners import ss_listeners

pytestmark = pytest.mark.mpi
cloudpickle.register_pickle_by_value(sys.modules[__name__])

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm_horovod.sbatch"
# a 2-core, GPU-less node: the #SBATCH lines (2 nodes x 4 GPUs) overridden on the command line
CPU_NODE = ["--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1",
            "--time=10"]
CI_TRAIN = ["--arch", "small", "--image-size", "32", "--batch-size", "8", "--epochs", "1",
            "--steps-per-epoch", "2"]


@pytest.fixture(scope="module")
def tfr(make_tfrecords) -> Path:  # noqa: ANN001  (tests/conftest.py)
    """64 synthetic 32 px images in shards of 4 (9 training shards: both ranks get some)."""
    return make_tfrecords(64, 32, 4)


@pytest.fixture
def submit_dir(tmp_path: Path, tfr: Path) -> Path:
    """A submit directory laid out like the repository, as the script expects: ``.venv``
    and ``build/tfrecords-full`` (links to this environment and the test data)."""
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "tfrecords-full").symlink_to(tfr)
    return tmp_path


def _require_slurm() -> None:
    reason = slurm_missing_reason()
    if reason:
        pytest.skip(reason)


def test_local_slurm_runs_as_its_user_on_loopback_only_and_stops_every_daemon():
    """The daemons run as the user who starts them, listen on loopback only (``ss -ltnp``)
    where the host name resolves to it, keep their state in 0700 folders, run jobs, and
    stop with no process left (run as root here and as a normal user in the non-root leg)."""
    _require_slurm()
    me = invoking_user()
    with LocalSlurm() as slurm:
        conf = slurm.conf_path.read_text()
        pids = slurm.processes()
        daemons = dict(slurm.daemon_pids)
        listeners = ss_listeners(daemons.values())
        assert slurm.node_state() == "idle"
        assert "SLURM_CONF" not in os.environ  # clients get it through slurm.env only
        for line in (f"SlurmUser={me}", f"SlurmdUser={me}", "ProctrackType=proctrack/linuxproc",
                     "TaskPlugin=task/none", "JobCompType=jobcomp/filetxt"):
            assert line in conf.splitlines()
        ports = {int(line.split("=")[1]) for line in conf.splitlines()
                 if line.startswith(("SlurmctldPort=", "SlurmdPort="))}
        assert len(ports) == 2 and not ports & {6817, 6818}  # not the system Slurm's
        assert f"AuthInfo=socket={slurm.state}/munge-run/munge.socket" in conf
        for pid in daemons.values():       # every daemon runs as this user
            assert os.stat(f"/proc/{pid}").st_uid == os.geteuid()
        assert {(lst.name, lst.port) for lst in listeners} == \
            {("slurmctld", slurm.ports[0]), ("slurmd", slurm.ports[1])}
        if loopback_bind_address() is not None:   # the host name resolves to loopback
            assert all(lst.loopback for lst in listeners), listeners
            assert f"listen on {slurm.bind_address} only" in slurm.exposure
        else:
            assert "listen on every interface" in slurm.exposure
        assert {p.name: p.stat().st_mode & 0o777 for p in [slurm.state, *(
            slurm.state / sub for sub in slurm_local.STATE_FOLDERS[:4])]} == \
            {slurm.state.name: 0o700, "munge-run": 0o700, "munge": 0o700, "log": 0o700,
             "ctld-state": 0o700}
        srun = subprocess.run(["srun", "-n2", "sh", "-c", "echo $SLURM_PROCID $(id -u)"],
                              env=slurm.env, capture_output=True, text=True, timeout=30)
        assert sorted(srun.stdout.splitlines()) == [f"0 {os.geteuid()}", f"1 {os.geteuid()}"], \
            srun.stderr
        state = slurm.state
    assert set(daemons) == {"munged", "slurmctld", "slurmd"}
    assert set(daemons.values()) <= set(pids)
    assert alive(pids) == []
    assert not state.exists()


def test_another_account_cannot_get_a_credential_nor_use_this_slurm(local_slurm):
    """munge's socket folder is 0700: another account cannot get a credential, so it can
    not submit a job (nor send any other request), even with a copy of slurm.conf it can
    read."""
    if os.geteuid() != 0:
        pytest.skip("running a command as another account needs root")
    socket_path = local_slurm.state / "munge-run" / "munge.socket"
    readable = Path(tempfile.mkdtemp(prefix="chexnet-slurm-conf-"))   # under /tmp: 0755
    try:
        readable.chmod(0o755)
        shutil.copy(local_slurm.conf_path, readable / "slurm.conf")
        (readable / "slurm.conf").chmod(0o644)
        env = {"PATH": os.environ["PATH"], "SLURM_CONF": str(readable / "slurm.conf")}
        runs = {cmd[0]: subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                                       user=4242, group=4242, env=env, cwd=readable)
                for cmd in (["munge", "-n", f"--socket={socket_path}"],
                            ["sbatch", "--wrap", "true"])}
    finally:
        shutil.rmtree(readable)
    for name, run in runs.items():
        assert run.returncode != 0, (name, run.stdout)
        assert f'Failed to access "{socket_path}": Permission denied' in run.stderr, run.stderr
    assert local_slurm.node_state() == "idle"       # its owner still can


def test_two_local_slurms_run_side_by_side_even_when_a_port_is_taken(local_slurm,
                                                                    monkeypatch):
    """Another engineer's LocalSlurm on the same machine: its own state folder, socket, key
    and ports. Here the second one is made to choose the first one's controller port: it sees
    the port taken, chooses again, and both run jobs; stopping one leaves the other."""
    real, choices = slurm_local.free_ports, []

    def first_choice_taken(n, host="127.0.0.1"):
        choices.append(n)
        return [local_slurm.ports[0], *real(n - 1)] if len(choices) == 1 else real(n)

    monkeypatch.setattr(slurm_local, "free_ports", first_choice_taken)
    with LocalSlurm() as second:
        assert len(choices) == 2 and not set(second.ports) & set(local_slurm.ports)
        assert second.state != local_slurm.state
        for slurm in (local_slurm, second):
            out = subprocess.run(["srun", "-n1", "sh", "-c", "echo $SLURM_JOB_ID"],
                                 env=slurm.env, capture_output=True, text=True, timeout=30)
            assert out.returncode == 0 and out.stdout.strip().isdigit(), out.stderr
        others = set(local_slurm.processes())
        assert others.isdisjoint(second.processes())
    assert local_slurm.node_state() == "idle" and sorted(alive(others)) == sorted(others)


def test_a_second_start_in_the_same_state_folder_is_refused(local_slurm):
    with pytest.raises(slurm_local.S.SlurmError) as info:
        LocalSlurm(local_slurm.state).start()
    assert str(info.value).startswith(f"{local_slurm.state} has a running Slurm already "
                                      "(pids.json): stop it first")
    assert local_slurm.node_state() == "idle"


def test_local_slurm_an_error_leaves_running_is_stopped_when_python_exits():
    """A notebook cell that raises after ``LocalSlurm().start()`` skips ``stop()``: the
    interpreter's exit (the kernel's shutdown) still stops every daemon."""
    _require_slurm()
    prog = ("import json, sys\n"
            "from chexnet_utils.cluster.slurm_local import LocalSlurm\n"
            "s = LocalSlurm().start()\n"
            "print(json.dumps({'pids': s.processes(), 'state': str(s.state)}), flush=True)\n"
            "raise RuntimeError('a cell failed')\n")
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1 and "a cell failed" in out.stderr
    started = json.loads(out.stdout.splitlines()[-1])
    assert len(started["pids"]) >= 3          # munged, slurmctld, slurmd were running
    assert alive(started["pids"]) == []
    assert not Path(started["state"]).exists()


def test_a_killed_kernel_leaves_no_slurm_daemon(tmp_path):
    """SIGKILL (the out-of-memory killer) skips every atexit: the daemons carry the Slurm's
    lifeline token and its watchdog stops them when the process that started them dies."""
    _require_slurm()
    prog = ("import json, os, signal\n"
            "from chexnet_utils.cluster.slurm_local import LocalSlurm\n"
            f"s = LocalSlurm({str(tmp_path / 'slurm')!r}).start()\n"
            "print(json.dumps(s.processes()), flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == -9, out.stderr
    pids = json.loads(out.stdout.splitlines()[-1])
    assert len(pids) >= 3 and wait_pids_gone(pids, 15) == []


def test_make_slurm_up_status_down_by_hand(tmp_path):
    """``make slurm SLURM_ARGS=up|status|down``: ``up`` returns with the daemons running (they
    outlive the command) and says who can reach them, ``status`` finds them, ``down`` stops
    every one of them."""
    _require_slurm()
    cmd = [sys.executable, "-m", "chexnet_utils.cluster.slurm_local"]
    base = tmp_path
    state, pids = base / "slurm", []
    try:
        up = subprocess.run([*cmd, "up", "--dir", str(state)], capture_output=True, text=True,
                            timeout=120)
        assert up.returncode == 0, up.stderr
        assert f"export SLURM_CONF={state / 'slurm.conf'}" in up.stdout
        assert f"Who can reach it: slurmctld and slurmd run as {invoking_user()}" in up.stdout
        pids = LocalSlurm.attach(state).processes()
        assert len(pids) >= 3 and alive(pids) == pids      # still running after `up` exited
        status = subprocess.run([*cmd, "status", "--dir", str(state)], capture_output=True,
                                text=True, timeout=60)
        assert status.returncode == 0 and "idle" in status.stdout, status.stdout
    finally:
        down = subprocess.run([*cmd, "down", "--dir", str(state)], capture_output=True,
                              text=True, timeout=120)
        again = subprocess.run([*cmd, "status", "--dir", str(state)], capture_output=True,
                               text=True, timeout=60)
    assert down.returncode == 0 and "no Slurm process left" in down.stdout, down.stderr
    assert alive(pids) == []
    assert again.returncode == 1 and "no Slurm started" in again.stderr


def test_batch_script_trains_on_two_tasks_to_completed(local_slurm, submit_dir):
    """The script's ``mpirun`` launcher over ``$SLURM_NTASKS`` (notebook 04 runs the default
    ``srun`` one to COMPLETED, and :class:`SlurmCluster` starts its engines with ``srun``)."""
    job = local_slurm.submit(SCRIPT, CI_TRAIN, options=CPU_NODE, cwd=submit_dir,
                             env={"LAUNCHER": "mpirun"})
    state = local_slurm.wait_for_job(job, timeout=240)
    log = submit_dir / f"chexnet-{job}.out"  # the script's --output, in the submit dir
    assert state == "COMPLETED", log.read_text() if log.exists() else "no log"
    info = local_slurm.job_info(job)
    assert info["ExitCode"] == "0:0" and info["NumTasks"] == "2"
    text = log.read_text()
    assert f"job {job}: 2 tasks" in text and "(mpirun)" in text and "mean AUROC" in text
    metrics = json.loads((submit_dir / "build" / "runs" / f"slurm-{job}" / "metrics.json")
                         .read_text())
    assert metrics["world_size"] == 2 and metrics["global_batch_size"] == 16
    assert local_slurm.jobcomp()[job]["JobState"] == "COMPLETED"


def test_batch_script_with_a_bad_argument_fails_with_the_error_in_its_log(local_slurm,
                                                                         submit_dir):
    job = local_slurm.submit(SCRIPT, ["--arch", "nosuchnet"], options=CPU_NODE, cwd=submit_dir)
    assert local_slurm.wait_for_job(job, timeout=90) == "FAILED"
    assert local_slurm.job_info(job)["ExitCode"] != "0:0"
    assert "invalid choice: 'nosuchnet'" in (submit_dir / f"chexnet-{job}.out").read_text()
    assert local_slurm.jobcomp()[job]["JobState"] == "FAILED"


def _rank_and_allreduce() -> dict:
    """rank_info (hvd.init, pinning) and the sum of rank + 1 over all ranks."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from chexnet_utils.cluster.distributed import rank_info

    info = rank_info()
    return {**info, "sum": float(hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum))}


def test_engines_as_a_slurm_job_run_horovod_training_and_are_cancelled(local_slurm, tfr,
                                                                       tmp_path, monkeypatch):
    from chexnet_utils.cluster.slurm_engines import SlurmCluster
    from chexnet_utils.training import train_on_engine

    monkeypatch.chdir(tmp_path)  # nothing may be written to the current directory
    cfg = dict(tfrecords=str(tfr), out_dir=str(tmp_path / "run"), arch="small", image_size=32,
               batch_size=8, epochs=1, steps_per_epoch=2, verbose=0, tensorboard=False)
    with SlurmCluster(n=2, slurm_conf=local_slurm.conf_path, engine_timeout=120,
                      sbatch_options=["--cpus-per-task=1", "--time=10"]) as cluster:
        job = cluster.job_id
        assert cluster.job_state() == "RUNNING"
        infos = cluster.run(_rank_and_allreduce, timeout=90)
        under_slurm = local_slurm.processes()  # below slurmstepd: started by Slurm
        results = cluster.run(train_on_engine, cfg, timeout=180)
        engine_pids = list(cluster.engine_pids)
        pids = cluster.pids()
    assert [i["rank"] for i in infos] == [0, 1] and {i["size"] for i in infos} == {2}
    assert set(engine_pids) <= set(under_slurm)
    assert [i["sum"] for i in infos] == [3.0, 3.0]  # 1 + 2: Horovod allreduce over both
    # the notebook-04 training, unchanged: lockstep ranks, rank 0 writes the files
    assert [r["size"] for r in results] == [2, 2]
    assert results[0]["weights_checksum"] == results[1]["weights_checksum"]
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["world_size"] == 2
    # teardown: the job was cancelled and no engine (or controller) process is left
    assert cluster.final_state == "CANCELLED"
    assert local_slurm.job_info(job)["JobState"] == "CANCELLED"
    assert alive(engine_pids) == [] and alive(pids) == []
    assert set(local_slurm.processes()) <= set(local_slurm.daemon_pids.values()) | \
        {p for d in local_slurm.daemon_pids.values() for p in _children(d)}
    assert os.listdir(tmp_path) == ["run"]  # the batch script stayed in the private profile


def _children(pid: int) -> list[int]:
    from chexnet_utils.platform.processes import descendants

    return descendants(pid)


def test_a_killed_kernel_s_engines_job_is_cancelled(local_slurm, tmp_path):
    """#27: the process that started a ``SlurmCluster`` is SIGKILLed (a kernel killed by
    the out-of-memory killer, or left by its Jupyter server): its watchdog runs the
    ``scancel`` it was given before the job was submitted, so the job ends CANCELLED (on a
    real cluster its engines run on other nodes, out of reach of any local signal) and no
    local process of the cluster is left. (Without the scancel the job ends FAILED: its
    local engines carry the lifeline token and are killed; checked by hand.)"""
    import selectors

    from chexnet_utils.cluster import slurm as S
    from chexnet_utils.platform.processes import wait_pids_gone

    script = ("import json, time\n"
              "from chexnet_utils.cluster.slurm_engines import SlurmCluster\n"
              f"c = SlurmCluster(n=2, slurm_conf={str(local_slurm.conf_path)!r}, "
              "engine_timeout=120, sbatch_options=['--cpus-per-task=1', '--time=10']).start()\n"
              "print(json.dumps({'job': c.job_id, 'pids': sorted(c.pids())}), flush=True)\n"
              "time.sleep(600)\n")
    kernel = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL, cwd=tmp_path, start_new_session=True)
    pids: list[int] = []
    try:
        sel = selectors.DefaultSelector()
        sel.register(kernel.stdout, selectors.EVENT_READ)
        assert sel.select(timeout=180), "the Slurm cluster did not start within 180 s"
        info = json.loads(kernel.stdout.readline())
        pids = info["pids"]
        assert local_slurm.job_info(info["job"])["JobState"] == "RUNNING" and len(pids) >= 3
        kernel.kill()
        kernel.wait()
        assert S.wait_until_gone(info["job"], 30, local_slurm.env) == "CANCELLED"
        assert wait_pids_gone(pids, timeout=20) == []
    finally:
        if kernel.poll() is None:
            kernel.kill()
            kernel.wait()
        kernel.stdout.close()
        for pid in alive(pids):
            os.kill(pid, 9)
