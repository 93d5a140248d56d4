"""#30 item 1: the unauthenticated servers (tf.data service, MultiWorkerMirroredStrategy) are
started only where no other account can reach them, and refuse on a shared host."""

import os
import subprocess

import psutil
import pytest

from chexnet_utils.platform import exposure
from chexnet_utils.platform.exposure import SharedHostError, require_private_network

OTHER_UID = 4242  # a person's uid (>= UID_MIN) that no account here has


def test_uid_min_is_read_from_login_defs(tmp_path):
    defs = tmp_path / "login.defs"
    defs.write_text("# comment\nUID_MIN\t\t 2000\nUID_MAX 60000\n")
    assert exposure.uid_min(defs) == 2000
    assert exposure.uid_min(tmp_path / "missing") == 1000


def test_refuses_on_a_shared_host_and_says_how_to_opt_in(monkeypatch):
    monkeypatch.setattr(exposure, "in_private_network_namespace", lambda: False)
    monkeypatch.setattr(exposure, "other_accounts_running", lambda: {OTHER_UID: 3})
    monkeypatch.delenv(exposure.ALLOW_ENV, raising=False)
    with pytest.raises(SharedHostError) as e:
        require_private_network("tf.data service")
    message = str(e.value)
    assert "refusing to start the tf.data service" in message
    assert f"{OTHER_UID} (3 processes)" in message and "CHEXNET_ALLOW_SHARED_HOST=1" in message
    assert "make lab PRIVATE=1" in message
    monkeypatch.setenv(exposure.ALLOW_ENV, "1")
    assert "started anyway" in require_private_network("tf.data service")


def test_who_can_reach_a_listener_it_cannot_refuse(monkeypatch):
    """mpiexec's listener cannot be moved off every interface (Open MPI 4.1): MPICluster
    starts anyway and says who could reach it, with the way to keep them out."""
    monkeypatch.setattr(exposure, "in_private_network_namespace", lambda: False)
    monkeypatch.setattr(exposure, "other_accounts_running", lambda: {OTHER_UID: 2})
    line, shared = exposure.who_can_reach("mpiexec's out-of-band listener")
    assert shared and f"{OTHER_UID} (2 processes)" in line and "make lab PRIVATE=1" in line
    monkeypatch.setattr(exposure, "other_accounts_running", lambda: {})
    assert exposure.who_can_reach("x") == ("x: no other account runs a process on this host",
                                           False)
    monkeypatch.setattr(exposure, "in_private_network_namespace", lambda: True)
    monkeypatch.setattr(exposure, "other_accounts_running", lambda: {OTHER_UID: 1})
    line, shared = exposure.who_can_reach("x")
    assert not shared and "private network namespace" in line


def test_says_why_it_is_safe(monkeypatch):
    monkeypatch.setattr(exposure, "in_private_network_namespace", lambda: False)
    monkeypatch.setattr(exposure, "other_accounts_running", lambda: {})
    assert "no other account" in require_private_network("x")
    monkeypatch.setattr(exposure, "in_private_network_namespace", lambda: True)
    monkeypatch.setattr(exposure, "other_accounts_running", lambda: {OTHER_UID: 1})
    assert "private network namespace" in require_private_network("x")


@pytest.fixture
def other_account_process():
    """A process of another person's account on this host, for the test's length (root
    only: it starts ``sleep`` as uid 4242); stopped and checked gone by pid."""
    if os.geteuid() != 0:
        pytest.skip("starting a process as another account needs root")
    if exposure.in_private_network_namespace():
        pytest.skip("this test runs in a private network namespace: nothing to refuse")
    proc = subprocess.Popen(["sleep", "120"], user=OTHER_UID, group=OTHER_UID,
                            stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)
        assert not psutil.pid_exists(proc.pid) or psutil.Process(proc.pid).status() == "zombie"


def test_tf_data_service_refuses_before_starting_anything(other_account_process, monkeypatch):
    from chexnet_utils.input.tfdata_service import TFDataService

    monkeypatch.delenv(exposure.ALLOW_ENV, raising=False)
    assert OTHER_UID in exposure.other_accounts_running()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    svc = TFDataService(num_workers=1)
    with pytest.raises(SharedHostError, match=str(OTHER_UID)):
        svc.start()
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after - before == set() and svc.dispatcher is None and svc.workers == []


def test_mwms_server_refuses_before_tensorflow_starts_it(other_account_process, monkeypatch):
    from chexnet_utils.bench import steptimer

    monkeypatch.delenv(exposure.ALLOW_ENV, raising=False)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(SharedHostError, match="MultiWorkerMirroredStrategy server"):
        steptimer.mwms_setup_on_engine([12345, 12346])
    assert "TF_CONFIG" not in os.environ and not steptimer._MWMS


def test_a_namespace_of_its_own_is_seen_even_where_pid_1_is_hidden(monkeypatch):
    """Sandboxes (and every non-root account) may not read pid 1's namespace: a process
    whose namespace differs from an ancestor's is in one of its own; one that shares its
    ancestors' namespace is not."""
    spaces = {"self": "net:[2]", 1: OSError, 10: "net:[1]", 11: "net:[2]"}

    def read(pid):
        if spaces.get(pid) is OSError:
            raise PermissionError(13, "Permission denied")
        return spaces[pid]

    monkeypatch.setattr(exposure, "_net_namespace", read)
    monkeypatch.setattr(exposure.os, "getppid", lambda: 11)
    monkeypatch.setattr(exposure, "_parent", {11: 10, 10: 1}.__getitem__)
    real_read_text = exposure.Path.read_text
    monkeypatch.setattr(exposure.Path, "read_text", lambda self, *a, **k: (
        "0 0 4294967295\n" if str(self) == "/proc/self/uid_map"
        else real_read_text(self, *a, **k)))
    assert exposure.in_private_network_namespace()          # 11 in net:[2], 10 in net:[1]
    spaces[10] = "net:[2]"
    assert not exposure.in_private_network_namespace()      # all the way up: the same one


def test_the_private_network_command_needs_root_only_for_nothing(monkeypatch):
    monkeypatch.setattr(exposure.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(exposure.os, "geteuid", lambda: 1000)
    cmd = exposure.private_network_command(["make", "lab"])
    assert cmd[:5] == ["/usr/bin/unshare", "--user", "--map-root-user", "--net", "--"]
    assert cmd[6:] == ["-m", "chexnet_utils.platform.exposure", "inside", "--", "make", "lab"]
    monkeypatch.setattr(exposure.os, "geteuid", lambda: 0)
    assert exposure.private_network_command(["true"])[:3] == ["/usr/bin/unshare", "--net", "--"]


def test_without_user_namespaces_the_private_command_says_why_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(exposure.shutil, "which", lambda name: f"/usr/bin/{name}")
    refused = subprocess.CompletedProcess([], 1, "", "unshare: unshare failed: Operation not "
                                                     "permitted\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: refused)
    monkeypatch.setattr(exposure.os, "execv", lambda *a: pytest.fail("ran without a namespace"))
    assert exposure.main(["private", "--", "make", "lab"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no private network namespace: unshare: unshare failed: "
                          "Operation not permitted: this host does not let your account make "
                          "one (unprivileged user namespaces off") and err.count("\n") == 1
    assert exposure.main(["private", "make"]) == 2
    assert ("usage: python -m chexnet_utils.platform.exposure private -- COMMAND"
            in capsys.readouterr().err)
