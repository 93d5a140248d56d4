"""The pure-Python parts of the Slurm support: slurm.conf text, the engines' batch template,
job-record parsing (no daemon started; tests/mpi/test_slurm.py runs the real thing)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from chexnet_utils.cluster import slurm as S
from chexnet_utils.cluster import slurm_access, slurm_local
from chexnet_utils.cluster.slurm_engines import SlurmCluster
from chexnet_utils.cluster.slurm_local import LocalSlurm, slurm_conf
from chexnet_utils.platform.ports import free_ports

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


# --- who can reach it, and where it writes (#30) ----------------------------------------------

def test_slurm_conf_runs_the_daemons_as_the_user_on_the_loopback_address(tmp_path):
    text = slurm_conf(tmp_path, 20001, 20002, HW, host="myhost", user="ada",
                      bind_address="127.0.1.1")
    lines = text.splitlines()
    assert "SlurmUser=ada" in lines and "SlurmdUser=ada" in lines
    assert "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny" in lines
    assert "SlurmctldHost=myhost(127.0.1.1)" in lines
    assert "NodeAddr=127.0.1.1" in next(line for line in lines if line.startswith("NodeName="))
    anywhere = slurm_conf(tmp_path, 20001, 20002, HW, host="myhost", user="ada")
    assert "CommunicationParameters" not in anywhere and "(127.0.0.1)" in anywhere


def test_the_bind_address_is_used_only_where_the_host_name_resolves_to_loopback(monkeypatch):
    def resolving_to(*addresses):
        return lambda *a, **k: [(0, 0, 0, "", (a, 0)) for a in addresses]

    monkeypatch.setattr(slurm_local.socket, "getaddrinfo", resolving_to("127.0.1.1"))
    assert slurm_access.loopback_bind_address("h") == "127.0.1.1"
    monkeypatch.setattr(slurm_local.socket, "getaddrinfo", resolving_to("::1", "127.0.0.1"))
    assert slurm_access.loopback_bind_address("h") == "127.0.0.1"
    monkeypatch.setattr(slurm_local.socket, "getaddrinfo", resolving_to("127.0.0.1", "10.1.2.3"))
    assert slurm_access.loopback_bind_address("h") is None   # it would listen on 10.1.2.3

    def unknown(*a, **k):
        raise socket.gaierror("Name or service not known")

    monkeypatch.setattr(slurm_local.socket, "getaddrinfo", unknown)
    assert slurm_access.loopback_bind_address("h") is None


def _no_daemons(monkeypatch):
    """LocalSlurm.start() up to the daemons, which must not start."""
    monkeypatch.setattr(S, "slurm_missing_reason", lambda **kwargs: None)
    monkeypatch.setattr(LocalSlurm, "_spawn",
                        lambda *a, **k: pytest.fail("a daemon would have started"))


def test_a_link_in_the_state_folder_is_refused_and_nothing_is_written_through_it(
        tmp_path, monkeypatch):
    _no_daemons(monkeypatch)
    state, elsewhere = tmp_path / "slurm", tmp_path / "theirs"
    state.mkdir()
    elsewhere.mkdir()
    (state / "munge").symlink_to(elsewhere)
    with pytest.raises(S.SlurmError) as info:
        LocalSlurm(state).start()
    assert str(info.value) == (f"{state / 'munge'} is a symbolic link: the Slurm state folder "
                               "may hold none (the daemons would write through it); remove "
                               "it, or choose a new state folder")
    assert os.listdir(elsewhere) == [] and sorted(os.listdir(state)) == ["munge"]
    state.rename(tmp_path / "moved")
    state.symlink_to(tmp_path / "moved")            # the state folder itself a link
    with pytest.raises(S.SlurmError, match="is a symbolic link"):
        slurm_access.check_state_dir(state)


def test_a_state_folder_below_a_folder_others_may_change_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(S.SlurmError) as info:
        slurm_access.check_state_dir(shared / "slurm")
    assert str(info.value) == (f"{shared}, above the Slurm state folder {shared / 'slurm'}, "
                               "is writable by other accounts (and not sticky): choose a "
                               "state folder under a folder only you may change")
    shared.chmod(0o1777)                            # sticky, like /tmp: nobody replaces ours
    slurm_access.check_state_dir(shared / "slurm")
    (shared / "slurm").mkdir(mode=0o777)
    (shared / "slurm").chmod(0o777)
    with pytest.raises(S.SlurmError, match="is writable by other accounts, so what is in it"):
        slurm_access.check_state_dir(shared / "slurm")
    with pytest.raises(S.SlurmError, match="must be an absolute path"):
        slurm_access.check_state_dir(Path("build/slurm"))


def test_a_state_folder_in_another_accounts_folder_is_refused(tmp_path, monkeypatch):
    """``make slurm`` as root in a checkout another user owns: that user could swap
    ``build/slurm/munge`` for a link between root's check and root's write."""
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another account needs root")
    _no_daemons(monkeypatch)
    checkout = tmp_path / "checkout"
    (checkout / "build").mkdir(parents=True)
    os.chown(checkout, 4242, 4242)
    with pytest.raises(S.SlurmError) as info:
        LocalSlurm(checkout / "build" / "slurm").start()
    assert str(info.value).startswith(
        f"{checkout}, above the Slurm state folder {checkout / 'build' / 'slurm'}, is owned "
        "by uid 4242, who could swap a folder on this path for a link to their own while "
        "the daemons (running as root (uid 0)) write there: start this Slurm as that user, "
        "or in a folder of your own (make slurm SLURM_DIR=...)")
    assert os.listdir(checkout / "build") == []
    os.chown(checkout, 0, 0)
    state = checkout / "build" / "slurm"
    (state / "log").mkdir(parents=True)
    os.chown(state / "log", 4242, 4242)
    with pytest.raises(S.SlurmError, match=r"log in the Slurm state folder belongs to uid "
                                           r"4242, not to root \(uid 0\)"):
        slurm_access.check_state_dir(state)


def test_the_state_folder_and_every_folder_in_it_are_private(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "slurm_missing_reason", lambda **kwargs: None)
    monkeypatch.setattr(slurm_local, "node_hardware", lambda: HW)

    class Started(Exception):
        pass

    def first_daemon(self, name, args, env):
        assert name == "munged" and "--force" in args
        raise Started

    monkeypatch.setattr(LocalSlurm, "_spawn", first_daemon)
    state = tmp_path / "slurm"
    state.mkdir(mode=0o755)
    state.chmod(0o755)                               # as an older version left it
    with pytest.raises(Started):
        LocalSlurm(state).start()
    modes = {p.name: p.stat().st_mode & 0o777 for p in [state, *state.iterdir()]}
    assert modes == {"slurm": 0o700, **{sub: 0o700 for sub in slurm_local.STATE_FOLDERS}}
    key = state / "munge" / "munge.key"
    assert key.stat().st_mode & 0o777 == 0o400 and key.stat().st_size == 1024


def test_inside_a_namespace_that_denies_setgroups_slurm_says_why_it_cannot_start(
        tmp_path, monkeypatch):
    """``make lab PRIVATE=1`` as a normal user: slurmd's ``setgroups`` is refused there, so
    notebook 08's cells say so instead of failing (measured: ``slurmd: fatal: Failed to drop
    supplementary groups, setgroups: Operation not permitted``)."""
    flag = tmp_path / "setgroups"
    flag.write_text("deny\n")
    assert S.setgroups_denied(str(flag))
    flag.write_text("allow\n")
    assert not S.setgroups_denied(str(flag)) and not S.setgroups_denied(str(tmp_path / "none"))
    monkeypatch.setattr(S.shutil, "which", lambda *a, **k: "/usr/bin/x")
    monkeypatch.setattr(S, "setgroups_denied", lambda: True)
    assert S.slurm_missing_reason().startswith("slurmd cannot start in this user namespace")
    assert S.slurm_missing_reason(daemons=False) is None
