"""#30 item 1, #46 items 1-2: in a network namespace of the learner's own (``make lab``,
``make tutorial``, ``make test``; made without root), the servers a notebook starts are out of
every other account's and host's reach: an MPI cluster (whose ``mpiexec`` listens on every
interface of its namespace), the tf.data service and the MultiWorkerMirroredStrategy server
(unauthenticated, on ``[::]``) started inside are not listening in the namespace outside, and
another account's connections to their ports are refused (``ss -ltnp`` and ``connect`` from
outside): the security review's experiment e (another account reading root's files through
root's service) cannot connect."""

from __future__ import annotations

import http.client
import json
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import time

import psutil
import pytest

from chexnet_utils.platform.exposure import namespace_problem, private_network_command
from chexnet_utils.platform.processes import alive
from tests.support.listeners import Listener, ss_listeners

pytestmark = pytest.mark.mpi

OTHER_UID = 4242

# Runs inside the namespace: a 2-engine MPI cluster with MultiWorkerMirroredStrategy's servers
# (notebook 06) and a one-worker tf.data service (notebook 07), then
# reports their pids, what they listen on (ss, inside) and who can reach the service, and
# waits for the test to look from outside before it stops both.
INSIDE = r"""
import json, subprocess, sys
from chexnet_utils.bench import engine_steps
from chexnet_utils.cluster.distributed import MPICluster
from chexnet_utils.input.tfdata_service import TFDataService
from chexnet_utils.platform.ports import free_ports
from tests.support.listeners import ss_listeners

with MPICluster(n=2) as cluster, TFDataService(num_workers=1) as svc:
    mwms_ports = free_ports(2)
    mwms = cluster.run(engine_steps.mwms_setup_on_engine, mwms_ports)[0]  # first TF work there
    ranks = cluster.run(lambda: __import__("os").environ.get("OMPI_COMM_WORLD_RANK"))
    pids = sorted(cluster.pids() | set(svc.pids))
    print(json.dumps({"pids": pids, "ranks": ranks, "exposure": svc.exposure,
                      "service_ports": svc.ports, "mwms_ports": mwms_ports,
                      "mwms_exposure": mwms["exposure"],
                      "inside": [list(l) for l in ss_listeners(pids)]}), flush=True)
    sys.stdin.readline()          # the test has looked from outside
"""

# Runs in the host's namespace as another account: try every port, print what happened.
KNOCK = r"""
import json, socket, sys
result = {}
for port in json.loads(sys.argv[1]):
    for host in ("127.0.0.1", "::1"):
        try:
            socket.create_connection((host, port), timeout=3).close()
            result[f"{host} {port}"] = "connected"
        except OSError as e:
            result[f"{host} {port}"] = type(e).__name__
print(json.dumps(result))
"""


def _namespace_or_skip() -> None:
    problem = namespace_problem()
    if problem is not None:
        pytest.skip(f"no private network namespace here: {problem}")


def test_nobody_outside_a_private_namespace_reaches_its_cluster_or_tf_data_service():
    _namespace_or_skip()
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [repo, *filter(None, [os.environ.get("PYTHONPATH")])])}
    other = None
    if os.geteuid() == 0:   # another account with a process: outside, the gate would refuse
        other = subprocess.Popen(["sleep", "300"], user=OTHER_UID, group=OTHER_UID,
                                 stdin=subprocess.DEVNULL)
    inner = subprocess.Popen(private_network_command([sys.executable, "-c", INSIDE]),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=env, cwd=repo)
    try:
        line = inner.stdout.readline()
        assert line, f"the namespace's program ended early (exit {inner.wait(timeout=60)})"
        seen = json.loads(line)
        inside = [Listener(*entry) for entry in seen["inside"]]
        outside = ss_listeners(seen["pids"])
        host_ports = {lst.port for lst in ss_listeners(
            int(p) for p in os.listdir("/proc") if p.isdigit())}
        ports = sorted({lst.port for lst in inside} - host_ports)  # same number out here: skip
        # the other account runs the system's Python (this venv's may live in root's home)
        python = "/usr/bin/python3" if other and os.path.exists("/usr/bin/python3") \
            else sys.executable
        knock = subprocess.run(
            [python, "-c", KNOCK, json.dumps(ports)], capture_output=True, text=True,
            timeout=120, **({"user": OTHER_UID, "group": OTHER_UID} if other else {}))
        inner.stdin.write("done\n")
        inner.stdin.flush()
        assert inner.wait(timeout=120) == 0
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.wait()
        if other is not None:
            other.kill()
            other.wait()
    assert seen["ranks"] == ["0", "1"]
    assert "private network namespace" in seen["exposure"]
    names = {lst.name for lst in inside}
    assert "mpiexec" in names and any(not lst.loopback for lst in inside if
                                      lst.name == "mpiexec")    # "every interface", inside
    assert set(seen["service_ports"]) <= {lst.port for lst in inside}
    assert set(seen["mwms_ports"]) <= {lst.port for lst in inside}   # the MWMS gRPC servers
    assert "private network namespace" in seen["mwms_exposure"]
    assert set(seen["mwms_ports"]) | set(seen["service_ports"]) <= set(ports)
    assert outside == []                   # none of them listens in the host's namespace
    assert ports and knock.returncode == 0, knock.stderr
    tried = json.loads(knock.stdout)
    assert tried and set(tried.values()) <= {"ConnectionRefusedError", "OSError"}, tried
    assert alive(seen["pids"]) == []


class _UnixHTTP(http.client.HTTPConnection):
    """HTTP over a Unix socket (what ``ssh -L 8888:<socket>`` forwards the browser to)."""

    def __init__(self, path: str) -> None:
        super().__init__("127.0.0.1", timeout=10)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.unix_path)


def test_make_lab_private_serves_jupyterlab_on_a_socket_only_its_user_can_open(tmp_path):
    """``make lab PRIVATE=1``'s own recipe (from ``make -n``): JupyterLab in a private
    namespace answers on its Unix socket (0600) with the token, listens on no TCP port of the
    host's namespace, and SIGTERM stops it and everything it started."""
    _namespace_or_skip()
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sock, token = str(tmp_path / "lab.sock"), secrets.token_hex(16)
    plan = subprocess.run(["make", "-n", "lab", "PRIVATE=1", f"LAB_SOCKET={sock}",
                           f"VENV={sys.prefix}", "LAB_ARGS=--no-browser"], cwd=repo,
                          capture_output=True, text=True, timeout=60, check=True).stdout
    recipe = plan[plan.index("mkdir -p"):]
    assert "chexnet_utils.platform.exposure private --" in recipe and "--ServerApp.sock=" in recipe
    lab = subprocess.Popen(["bash", "-c", recipe], cwd=repo, start_new_session=True,
                           env={**os.environ, "JUPYTER_TOKEN": token},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        status = None
        for _ in range(240):
            if os.path.exists(sock):
                try:
                    conn = _UnixHTTP(sock)
                    conn.request("GET", f"/api/status?token={token}")
                    status = conn.getresponse().status
                    break
                except OSError:
                    pass
            time.sleep(0.5)
        assert status == 200
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        tree = [lab.pid, *(p.pid for p in psutil.Process(lab.pid).children(recursive=True))]
        assert ss_listeners(tree) == []       # no TCP port in the host's namespace
        conn = _UnixHTTP(sock)
        conn.request("GET", "/api/status")   # without the token
        assert conn.getresponse().status == 403
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=60)
    assert alive(tree) == []


def test_make_lab_by_default_runs_the_lab_privately_behind_a_loopback_port():
    """#46 item 1: ``make lab``'s default (``python -m chexnet_utils.lab --private``): the
    browser's URL is ``http://127.0.0.1:PORT/lab?token=...`` as always, but JupyterLab and all
    it starts run in a network namespace of the learner's own; here only this command's
    forwarder listens (on loopback), the token is asked, SIGTERM leaves nothing."""
    _namespace_or_skip()
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    plan = subprocess.run(["make", "-n", "lab", f"VENV={sys.prefix}"], cwd=repo,
                          capture_output=True, text=True, timeout=60, check=True).stdout
    assert "-m chexnet_utils.lab --private" in plan
    lab = subprocess.Popen([sys.executable, "-m", "chexnet_utils.lab", "--private",
                            "--notebook-dir", os.path.join(repo, "notebooks"), "--port", "0"],
                           cwd=repo, start_new_session=True, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
    try:
        said = ""
        while "token=" not in said:
            said = lab.stdout.readline()
            assert said, f"the lab ended early (exit {lab.wait(timeout=60)})"
        url = said.split("http://", 1)[1].split()[0]
        host_port, token = url.split("/lab?token=")
        host, port = host_port.split(":")
        status = None
        for _ in range(240):
            try:
                conn = http.client.HTTPConnection(host, int(port), timeout=10)
                conn.request("GET", f"/api/status?token={token}")
                status = conn.getresponse().status
                break
            except OSError:
                time.sleep(0.5)
        assert (host, status) == ("127.0.0.1", 200)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", "/api/status")       # without the token
        assert conn.getresponse().status == 403
        tree = [lab.pid, *(p.pid for p in psutil.Process(lab.pid).children(recursive=True))]
        listening = ss_listeners(tree)
        assert [(lst.pid, lst.port, lst.loopback) for lst in listening] == \
            [(lab.pid, int(port), True)], listening   # only the forwarder, on loopback
        inside = [p for p in psutil.Process(lab.pid).children(recursive=True)  # watchdogs:
                  if "chexnet_utils.platform.processes" not in p.cmdline()]  # here, by design
        here = os.readlink("/proc/self/ns/net")
        assert any("jupyter" in " ".join(p.cmdline()) for p in inside)
        assert all(os.readlink(f"/proc/{p.pid}/ns/net") != here for p in inside)
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=90)
    assert alive(tree) == []
