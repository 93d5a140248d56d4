"""Engines on another (simulated) host: the controller listens on that link only, CurveZMQ
encrypts the traffic, and a client without the server key cannot connect.

The other host is a network namespace joined to this one by a veth pair with addresses from
a private range that exists only inside this machine; everything is removed at the end
(checked by name) and no engine or controller process is left (checked by pid).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from chexnet_utils.platform.processes import alive
from tests.support.remote_engines import RemoteEngines
from tests.support.sniff import PacketCapture

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="needs root and iproute2 (network namespaces)")

def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _free_link_net() -> ipaddress.IPv4Network:
    """A /30 of 10.78.0.0/16 that no route or address of this machine overlaps yet: the
    veth's two addresses exist only on this link (a /30 keeps the route as small as it
    gets), and a second run at the same time picks another one."""
    text = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True,
                          text=True).stdout + subprocess.run(
        ["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    taken = []
    for word in text.split():
        try:
            net = ipaddress.ip_network(word, strict=False)
        except ValueError:
            continue
        if net.prefixlen > 0:  # not the default route
            taken.append(net)
    for cand in ipaddress.ip_network("10.78.0.0/16").subnets(new_prefix=30):
        if not any(cand.overlaps(t) for t in taken):
            return cand
    raise RuntimeError("no free /30 in 10.78.0.0/16")


def _names() -> tuple[str, str, str]:
    tag = uuid.uuid4().hex[:6]
    return f"cvns{tag}", f"cvh{tag}", f"cvn{tag}"


@pytest.fixture
def other_host():
    """A namespace ``ns`` reachable at ``node_ip`` through veth ``host_if`` (``host_ip`` on
    this side), both in a free /30: yields ``(ns, host_if, host_ip)``."""
    ns, host_if, node_if = _names()
    host_ip, node_ip = (str(a) for a in _free_link_net().hosts())   # the /30's two hosts
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", node_if)
        _ip("link", "set", node_if, "netns", ns)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        for args in (["addr", "add", f"{node_ip}/30", "dev", node_if],
                     ["link", "set", node_if, "up"], ["link", "set", "lo", "up"]):
            _ip("netns", "exec", ns, "ip", *args)
        yield ns, host_if, host_ip
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert host_if not in links
        assert ns not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                        text=True).stdout


def _echo(text: str) -> str:
    return text + "!"


def _echo_through_the_link(rc: RemoteEngines, host_if: str, host_ip: str, curve: bool
                           ) -> tuple[PacketCapture, str]:
    """Check where the controller listens and its files, then send a marker to the engine and
    back while capturing the link; returns the capture and the marker."""
    listening = rc.controller_listening()
    # that interface only: no wildcard; loopback carries the controller's own processes
    assert {a for a in listening if not a.startswith("127.")} == {host_ip}
    assert (rc.server_key() is not None) == curve
    assert os.stat(rc.profile_dir).st_mode & 0o777 == 0o700
    for kind in ("engine", "client"):                       # the files that carry the key
        assert os.stat(rc.connection_file(kind)).st_mode & 0o777 == 0o600
    marker = f"MARKER-{uuid.uuid4().hex}"
    with PacketCapture(host_if) as cap:
        assert rc.view.apply_sync(_echo, marker) == [marker + "!"]
    assert cap.frames > 0                                   # the engine's traffic crossed the link
    return cap, marker


_CONNECT = ("import sys, ipyparallel as ipp\n"
            "c = ipp.Client(sys.argv[1], timeout=5)\n"
            "print('connected', c.ids, flush=True)\n")


def _try_client(connection_file) -> str:
    """Connect a client from ``connection_file`` in a separate process: ``"connected ..."``,
    or why not. Without the server key the CurveZMQ handshake never completes, and pyzmq may
    block in its first send instead of timing out: the process is killed after 20 s."""
    try:
        out = subprocess.run([sys.executable, "-c", _CONNECT, str(connection_file)],
                             capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "no answer within 20 s"
    return out.stdout.strip() or out.stderr.strip().splitlines()[-1]


def _all_pids(rc: RemoteEngines) -> list[int]:
    """The engines (as launched and as they report themselves) and the controller."""
    return [*rc.engine_pids, *(p.pid for p in rc.engines), rc.cluster.controller.process.pid]


def test_with_curve_no_plaintext_on_the_wire_and_no_client_without_the_key(other_host, tmp_path):
    ns, host_if, host_ip = other_host
    with RemoteEngines(host_ip, n=1, launch=["ip", "netns", "exec", ns], curve=True) as rc:
        cap, marker = _echo_through_the_link(rc, host_if, host_ip, curve=True)
        info = json.loads(open(rc.connection_file("client")).read())
        info.pop("curve_serverkey")
        stolen = tmp_path / "no-key.json"
        stolen.write_text(json.dumps(info))
        without_key = _try_client(stolen)
        with_key = _try_client(rc.connection_file("client"))   # the control: this one works
        pids = _all_pids(rc)
        left = rc.stop()
    assert not cap.contains(marker)
    # refused by the handshake: no answer, or ipyparallel's own connection time-out; never
    # connected, and not some other failure that would pass for a refusal
    assert (without_key == "no answer within 20 s"
            or "Hub connection request timed out" in without_key), without_key
    assert with_key == "connected [0]"
    assert left == [] and alive(pids) == []


def test_without_curve_the_marker_crosses_the_link_in_plain_text(other_host):
    """The control: the same capture sees the marker when encryption is off."""
    ns, host_if, host_ip = other_host
    with RemoteEngines(host_ip, n=1, launch=["ip", "netns", "exec", ns], curve=False) as rc:
        cap, marker = _echo_through_the_link(rc, host_if, host_ip, curve=False)
        pids = _all_pids(rc)
        left = rc.stop()
    assert cap.contains(marker)
    assert left == [] and alive(pids) == []


_HOLDER = """
import json, sys, time
from tests.support.remote_engines import RemoteEngines
rc = RemoteEngines(sys.argv[1], n=1, launch=["ip", "netns", "exec", sys.argv[2]]).start()
pids = [*rc.engine_pids, *(p.pid for p in rc.engines), rc.cluster.controller.process.pid]
print(json.dumps({"pids": pids, "profile": rc.profile_dir}), flush=True)
time.sleep(600)
"""


def test_a_killed_holder_leaves_no_controller_engine_or_key_behind(other_host):
    """Review N9: RemoteEngines starts a watchdog as MPICluster does; SIGKILL of the process
    that started them (a kernel) stops the controller and the engine and removes the
    connection files, checked by pid and path."""
    import time

    ns, _, host_ip = other_host
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, host_ip, ns],  # tests.support:
                              stdout=subprocess.PIPE, text=True, cwd=REPO)       # from the repo
    try:
        started = json.loads(holder.stdout.readline())
    finally:
        holder.kill()
        holder.wait(timeout=10)
    deadline = time.monotonic() + 20
    while (alive(started["pids"]) or os.path.exists(started["profile"])) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive(started["pids"]) == [] and not os.path.exists(started["profile"])
