"""#46 item 1: the unauthenticated servers (tf.data service, MultiWorkerMirroredStrategy) fail
closed: they start only in a network namespace this project made (its inode recorded by the
process that made it, nothing but ``lo`` up), or with an opt-in that says what it means. Every
way past the earlier gate the security review measured (its table's cases a-f, other hosts,
time of check vs use) is a test that expects the refusal; the cases that need another account,
a mount or a namespace of their own run as root, on a host-like network (a namespace with an
interface up besides ``lo``: ``make test`` itself runs in a private one)."""

import os
import shutil
import subprocess
import sys

import psutil
import pytest

from chexnet_utils.platform import exposure
from chexnet_utils.platform.exposure import SharedHostError, require_private_network

GATE = ("import sys\n"
        "from chexnet_utils.platform.exposure import SharedHostError, require_private_network\n"
        "try:\n    print(require_private_network('tf.data service'))\n"
        "except SharedHostError as e:\n    print(e); sys.exit(3)\n")
"""The gate in a fresh process: exit 3 and the refusal, or 0 and why it started."""


@pytest.fixture
def outside(monkeypatch):
    """This process as if outside any private namespace, without the opt-in."""
    monkeypatch.delenv(exposure.PRIVATE_NETNS_ENV, raising=False)
    monkeypatch.delenv(exposure.ALLOW_ENV, raising=False)


def test_refuses_outside_a_private_namespace_in_one_line_saying_what_to_do(outside):
    with pytest.raises(SharedHostError) as e:
        require_private_network("tf.data service")
    message = str(e.value)
    assert "\n" not in message and message.startswith("refusing to start the tf.data service")
    for way in ("make lab or make tutorial", "exposure private -- COMMAND",
                "CHEXNET_ALLOW_SHARED_HOST=1 to accept that other accounts and hosts can run "
                "graphs as you here"):
        assert way in message


def test_the_opt_in_says_what_it_means(outside, monkeypatch):
    monkeypatch.setenv(exposure.ALLOW_ENV, "1")
    line = require_private_network("tf.data service")
    assert "other accounts and hosts can run graphs as you here" in line


def test_only_the_recorded_namespace_with_nothing_but_loopback_up(outside, monkeypatch):
    monkeypatch.setattr(exposure, "_net_namespace", lambda pid: "net:[4026532999]")
    monkeypatch.setattr(exposure, "interfaces_up", lambda: ["lo"])
    with pytest.raises(SharedHostError):          # no record: not a namespace of ours
        require_private_network("x")
    monkeypatch.setenv(exposure.PRIVATE_NETNS_ENV, "net:[4026531840]")
    with pytest.raises(SharedHostError):          # a record of another namespace (leaked)
        require_private_network("x")
    monkeypatch.setenv(exposure.PRIVATE_NETNS_ENV, "net:[4026532999]")
    assert "net:[4026532999] (only lo up)" in require_private_network("x")
    monkeypatch.setattr(exposure, "interfaces_up", lambda: ["lo", "eth0"])
    with pytest.raises(SharedHostError):          # another interface up: other hosts
        require_private_network("x")


def test_who_can_reach_a_listener_it_cannot_refuse(outside, monkeypatch):
    """mpiexec's listener cannot be moved off every interface (Open MPI 4.1): MPICluster
    starts anyway and says who could reach it; inside a private namespace, nobody else."""
    line, shared = exposure.who_can_reach("mpiexec's out-of-band listener")
    assert shared and "other accounts and hosts can connect" in line
    monkeypatch.setattr(exposure, "private_namespace", lambda: "net:[1]")
    line, shared = exposure.who_can_reach("x")
    assert not shared and "reachable from inside it only" in line


def test_the_first_process_inside_records_its_namespace(tmp_path):
    """``exposure private`` itself: the command runs with the namespace recorded, and the gate
    lets the service start there (and only there)."""
    problem = exposure.namespace_problem()
    if problem is not None:
        pytest.skip(f"no private network namespace here: {problem}")
    out = subprocess.run(exposure.private_network_command([sys.executable, "-c", GATE]),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "private network namespace net:[" in out.stdout, out


# ---- the review's cases, each refused (root: other accounts, mounts, the host's namespace) --

needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="needs root and iproute2 (a network namespace)")
HOST_NET = ["unshare", "--net", "--", "sh", "-c",
            "ip link add chexnet0 type veth peer name chexnet1 && ip link set chexnet0 up && "
            "ip link set lo up "
            '&& exec "$@"', "sh"]
"""A stand-in for a host's network: a namespace with an interface up besides ``lo`` (``make
test`` itself runs in a private namespace, and sandboxes may hide pid 1's)."""


def gate_in(prefix, env=None):
    """The gate run under ``prefix`` (a command that sets up the case), on a host-like network
    (:data:`HOST_NET`), with this process's environment (its private namespace's record
    included)."""
    return subprocess.run([*HOST_NET, *prefix, sys.executable, "-c", GATE], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})


def refused(run):
    return run.returncode == 3 and run.stdout.startswith("refusing to start the tf.data service")


@needs_root
@pytest.mark.parametrize("case, prefix", [
    ("a: a user namespace without a network namespace (Apptainer, rootless podman)",
     ["unshare", "--user", "--map-root-user", "--"]),
    ("b: /proc mounted hidepid=2 (nobody else visible)",
     ["unshare", "--mount", "--pid", "--fork", "--mount-proc", "--", "sh", "-c",
      'mount -o remount,hidepid=2 /proc && exec "$@"', "sh"]),
    ("f: a pid namespace of its own on the host network (docker --net=host)",
     ["unshare", "--pid", "--fork", "--mount-proc", "--"]),
    ("the host's network itself", []),
])
def test_the_reviews_cases_are_refused(case, prefix):
    """Whatever the earlier gate looked at (a namespace that differs from pid 1's or a user
    namespace; who else runs processes) no longer decides: each case is refused, even with
    a private namespace's record in the environment (a leaked variable)."""
    run = gate_in(prefix, {exposure.PRIVATE_NETNS_ENV: "net:[4026532999]"})
    assert refused(run), (case, run.returncode, run.stdout, run.stderr)
    run = gate_in(prefix, {exposure.PRIVATE_NETNS_ENV: ""})
    assert refused(run), (case, run.stdout, run.stderr)


@needs_root
@pytest.mark.parametrize("uid", [1234567, 33, 65534],
                         ids=["c: a directory-service uid", "d: www-data", "d: nobody"])
def test_other_accounts_outside_any_uid_range_change_nothing(uid):
    """c, d: accounts the earlier gate did not count (uids >= 65534 or < UID_MIN) may run
    processes: refused as always, outside a private namespace."""
    other = subprocess.Popen(["sleep", "60"], user=uid, group=uid, stdin=subprocess.DEVNULL)
    try:
        assert refused(gate_in([])), uid
    finally:
        other.kill()
        other.wait(timeout=10)
    assert not psutil.pid_exists(other.pid) or psutil.Process(other.pid).status() == "zombie"


@needs_root
def test_time_of_check_is_time_of_use_nobody_else_needed(outside):
    """e: the earlier gate let root start the service while no other account had a process,
    and an account that logged in afterwards read root's files through it. Now nobody else
    needs to be there: outside a private namespace it does not start, and nothing is started
    (tests/mpi/test_private_network.py replays the read from another account against a
    service and an MWMS server started inside one)."""
    from chexnet_utils.input.tfdata_service import TFDataService

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    svc = TFDataService(num_workers=1)
    with pytest.raises(SharedHostError):
        svc.start()
    assert {p.pid for p in psutil.Process().children(recursive=True)} - before == set()
    assert svc.dispatcher is None and svc.workers == []


@needs_root
def test_another_interface_up_in_a_private_namespace_is_refused():
    """Other hosts: a namespace of ours that gains an interface (a veth, a dummy) is no longer
    private; the gate looks at what is up when the server starts."""
    script = ("ip link add chexnet0 type veth peer name chexnet1 && ip link set chexnet0 up && "
              f'exec {sys.executable} -c "$0"')
    run = subprocess.run(exposure.private_network_command(["sh", "-c", script, GATE]),
                         capture_output=True, text=True, timeout=60)
    assert refused(run), (run.returncode, run.stdout, run.stderr)


def test_mwms_server_refuses_before_tensorflow_starts_it(outside, monkeypatch):
    from chexnet_utils.bench import engine_steps

    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(SharedHostError, match="MultiWorkerMirroredStrategy server"):
        engine_steps.mwms_setup_on_engine([12345, 12346])
    assert "TF_CONFIG" not in os.environ and not engine_steps._MWMS


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


def test_make_lab_without_user_namespaces_runs_the_lab_on_loopback_saying_why(monkeypatch,
                                                                              capsys):
    """Where the account cannot make a namespace (Ubuntu 24.04's AppArmor default), ``make
    lab``'s private route says so in one line and runs the lab as before, on loopback; the
    servers of 06 and 07 are then refused by the gate, not by a lab that will not start."""
    from chexnet_utils import lab

    monkeypatch.setattr(exposure, "namespace_problem",
                        lambda: "unshare: write failed /proc/self/uid_map: Operation not "
                                "permitted: this host does not let your account make one")
    ran = []
    monkeypatch.setattr(lab, "main", lambda args: ran.append(list(args)) or 0)
    assert lab.run_private(["--notebook-dir=notebooks"]) == 0
    assert ran == [["--notebook-dir=notebooks"]]            # the loopback lab, same options
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no network namespace of your own here" in err
    assert "06 and 07" in err and "refuse" in err
