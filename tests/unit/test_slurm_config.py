"""The pure-Python parts of the Slurm support: slurm.conf text, the engines' batch template,
job-record parsing (no daemon started; tests/mpi/test_slurm.py runs the real thing)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from chexnet_utils import slurm as S
from chexnet_utils.slurm_engines import SlurmCluster
from chexnet_utils.slurm_local import LocalSlurm, free_ports, slurm_conf

HW = "CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=1000"


def test_slurm_conf_keeps_everything_in_the_state_folder(tmp_path):
    text = slurm_conf(tmp_path, 20001, 20002, HW, host="myhost")
    lines = dict(line.split("=", 1) for line in text.splitlines()
                 if line and not line.startswith(("#", "NodeName", "PartitionName")))
    assert lines["SlurmctldHost"] == "myhost(127.0.0.1)"
    assert (lines["SlurmctldPort"], lines["SlurmdPort"]) == ("20001", "20002")
    for key in ("StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdPidFile",
                "SlurmctldLogFile", "SlurmdLogFile", "JobCompLoc"):
        assert lines[key].startswith(str(tmp_path) + "/"), key
    assert lines["AuthInfo"] == f"socket={tmp_path}/munge-run/munge.socket"
    node = next(line for line in text.splitlines() if line.startswith("NodeName="))
    assert "NodeAddr=127.0.0.1" in node and HW in node


def test_free_ports_are_distinct_and_bindable():
    import socket

    ports = free_ports(3)
    assert len(set(ports)) == 3
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_engine_batch_script_srun_and_mpirun():
    srun = SlurmCluster(n=2, sbatch_options=["--partition=gpu", "--comment={x}"]).batch_template()
    lines = srun.splitlines()
    assert lines[0] == "#!/bin/sh" and "#SBATCH --ntasks={n}" in lines
    assert "#SBATCH --partition=gpu" in lines
    assert "#SBATCH --comment={{x}}" in lines  # literal braces survive ipyparallel's format
    assert lines[-1] == "exec srun --mpi=pmix {program_and_args} --mpi"
    mpirun = SlurmCluster(n=2, launcher="mpirun", map_by="socket").batch_template()
    assert mpirun.splitlines()[-1] == \
        "exec mpiexec -n {n} --map-by socket --bind-to none {program_and_args} --mpi"
    with pytest.raises(ValueError, match="launcher"):
        SlurmCluster(launcher="ssh")


def test_slurm_conf_reaches_sbatch_and_scancel_through_the_environment():
    cluster = SlurmCluster(n=2, slurm_conf="/x/slurm.conf")
    assert cluster.env_overrides()["SLURM_CONF"] == "/x/slurm.conf"
    assert cluster.slurm_env()["SLURM_CONF"] == "/x/slurm.conf"
    from traitlets.config import Config

    cfg = Config()
    cluster._profile_dir = "/private/profile"
    assert cluster._engine_launcher(cfg, {"A": "1"}) == "slurm"
    assert cfg.SlurmEngineSetLauncher.batch_file_name == "/private/profile/slurm_engine.sbatch"
    assert cfg.SlurmEngineSetLauncher.delete_command == \
        ["env", "SLURM_CONF=/x/slurm.conf", "scancel"]


def _fake_tool(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_job_info_and_wait_read_scontrol(tmp_path, monkeypatch):
    _fake_tool(tmp_path, "scontrol", 'echo "JobId=$4 JobName=x JobState=FAILED Reason=NonZero'
                                     'ExitCode ExitCode=2:0 StdOut=/w/chexnet-$4.out"')
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    info = S.job_info("17", env)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "2:0"
    assert info["StdOut"] == "/w/chexnet-17.out"
    assert S.wait_for_job("17", timeout=5, env=env) == "FAILED"


def test_jobcomp_records_by_job_id(tmp_path):
    slurm = LocalSlurm(tmp_path)
    (tmp_path / "jobcomp.txt").write_text(
        "JobId=3 UserId=root(0) JobState=COMPLETED ExitCode=0:0\n"
        "JobId=4 UserId=root(0) JobState=FAILED ExitCode=2:0\n")
    records = slurm.jobcomp()
    assert records["3"]["JobState"] == "COMPLETED" and records["4"]["ExitCode"] == "2:0"


def test_missing_reason_names_the_install_command(monkeypatch):
    monkeypatch.setattr(S.shutil, "which", lambda *a, **k: None)
    reason = S.slurm_missing_reason()
    assert reason is not None and "apt-get install -y slurm-wlm munge" in reason
    assert "sbatch" in reason and "munged" in reason
