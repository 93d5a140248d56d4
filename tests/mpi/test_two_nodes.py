"""Two "nodes" on one machine: network namespaces joined by a veth, Horovod across them.

Builds the namespaces of :mod:`chexnet_utils.cluster.netns` (names with a unique prefix per run),
runs Horovod ranks on both "nodes" with ``mpirun`` (namespace launch agent) and with
``horovodrun --gloo`` (fake ``ssh``), checks with the veth's byte counters that the
allreduce traffic crossed the link in the amount ring-allreduce implies, and that ``tc``
shaping brings raw TCP throughput down to the set rate. Every test checks by name that
nothing is left (``ip netns list``, ``ip link``), also after a failure inside the block.
Skips without root or ``ip netns``.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest

from chexnet_utils.bench.link import expected_link_bytes, run_probe, tcp_throughput
from chexnet_utils.cluster.netns import (
    TwoNodes,
    leftovers,
    namespaces,
    new_prefix,
    root_links,
    two_nodes,
    unavailable_reason,
)
from chexnet_utils.comm.collectives import MIB
from chexnet_utils.platform.processes import alive

pytestmark = pytest.mark.mpi



@pytest.fixture(scope="module")
def netns_reason() -> str | None:
    """Why namespaces cannot be built here (asked once per module, when the first test
    runs: collecting the tests creates no probe namespace), or None."""
    return unavailable_reason()


@pytest.fixture
def needs_netns(netns_reason: str | None) -> None:
    if netns_reason:
        pytest.skip(f"two namespaces: {netns_reason}")

COUNT_BYTES = 16 * MIB
COUNT_ITERS = 3


def assert_gone(prefix: str) -> None:
    """Nothing named ``prefix*`` in ``ip netns list`` / ``ip link`` / ``/etc/netns``."""
    assert leftovers(prefix) == []
    assert not [n for n in namespaces() if n.startswith(prefix)]
    assert not [n for n in root_links() if n.startswith(prefix)]


@pytest.fixture(scope="module")
def nodes(netns_reason: str | None) -> Iterator[TwoNodes]:
    """One pair of nodes for the module; torn down at the end, checked by name (and no
    process left inside them: :func:`two_nodes` raises naming any survivor)."""
    if netns_reason:
        pytest.skip(f"two namespaces: {netns_reason}")
    prefix = new_prefix()
    try:
        with two_nodes(prefix) as built:
            yield built
            assert built.pids() == []   # every rank, orted and receiver has exited
    finally:
        assert_gone(prefix)


@pytest.mark.usefixtures("needs_netns")
def test_nodes_built_and_torn_down() -> None:
    prefix = new_prefix()
    with two_nodes(prefix) as n:
        assert set(n.namespaces) <= set(namespaces())
        for i, other in ((0, 1), (1, 0)):
            addr = n.run(i, ["ip", "-o", "-4", "addr", "show", "dev", n.iface]).stdout
            assert f"{n.ips[i]}/24" in addr
            assert n.run(i, ["hostname"]).stdout.strip() == n.names[i]
            resolved = n.run(i, ["getent", "hosts", n.names[other]]).stdout.split()[0]
            assert resolved == n.ips[other]
        # the veth ends live only inside the namespaces, not in the root namespace
        assert n.iface not in root_links()
        # the launch agent (also `ssh`) runs a command on the named node, ssh options
        # before and after the host name as horovodrun writes them
        out = subprocess.run([str(n.bin_dir / "ssh"), "-o", "StrictHostKeyChecking=no",
                              "nodeB", "-o", "ConnectTimeout=5", "hostname;",
                              f"cat /sys/class/net/{n.iface}/address"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        mac_b = n.run(1, ["cat", f"/sys/class/net/{n.iface}/address"]).stdout.strip()
        assert out.stdout.split() == ["nodeB", mac_b]
        bad = subprocess.run([str(n.agent), "nodeC", "true"], capture_output=True, text=True)
        assert bad.returncode == 255 and "unknown host" in bad.stderr
    assert_gone(prefix)


@pytest.mark.usefixtures("needs_netns")
def test_teardown_after_an_error_kills_what_runs_inside() -> None:
    prefix = new_prefix()
    with pytest.raises(ZeroDivisionError):
        with two_nodes(prefix) as n:
            sleeper = subprocess.Popen(n.exec_argv(1, ["sleep", "300"]))
            deadline = time.monotonic() + 10   # until `sleep` is inside the namespace
            while not n.pids() and time.monotonic() < deadline:
                time.sleep(0.02)
            inside = n.pids()
            n.shape(100e6)
            raise ZeroDivisionError("an error while the nodes are up")
    assert inside, "the sleeper never showed up inside the namespace"
    assert sleeper.wait(timeout=10) != 0  # killed, not finished
    assert alive(inside) == []
    assert_gone(prefix)


def _check_counts(ranks: list[dict], launcher: str) -> None:
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert r["size"] == 2 and r["local_size"] == 1, r
        assert r["sum_ok"], r
        assert r["mpi" if launcher == "mpirun" else "gloo"], r
        expected = COUNT_ITERS * expected_link_bytes(COUNT_BYTES)  # = 3 x 16 MiB each way
        # payload plus TCP/IP headers (~3 %) and Horovod's small control messages
        for key in ("tx_bytes", "rx_bytes"):
            assert expected <= r[key] <= 1.10 * expected, (key, r[key], expected)
    # what node A sent is what node B received (each rank reads its counters after the
    # closing barrier on its own, so a small control message may be counted on one side)
    assert ranks[0]["tx_bytes"] == pytest.approx(ranks[1]["rx_bytes"], rel=1e-3)
    assert ranks[1]["tx_bytes"] == pytest.approx(ranks[0]["rx_bytes"], rel=1e-3)


@pytest.mark.parametrize("launcher", ["mpirun", "gloo"])
def test_allreduce_crosses_the_link(nodes: TwoNodes, launcher: str) -> None:
    before = [nodes.counters(i) for i in (0, 1)]
    ranks = run_probe(nodes, launcher, sizes=[], count_bytes=COUNT_BYTES,
                      count_iters=COUNT_ITERS, timeout=240)
    after = [nodes.counters(i) for i in (0, 1)]
    _check_counts(ranks, launcher)
    assert alive([r["pid"] for r in ranks]) == []   # the launcher's ranks are gone
    # seen from outside the ranks too: the whole run (start-up, warm-up, counted
    # allreduces) moved at least the counted bytes each way over the veth
    for i in (0, 1):
        assert after[i]["tx_bytes"] - before[i]["tx_bytes"] >= ranks[i]["tx_bytes"]


def test_tc_shaping_limits_tcp_to_the_rate(nodes: TwoNodes) -> None:
    rate = 200e6
    free = tcp_throughput(nodes, 32 * MIB).bytes_per_s * 8
    nodes.shape(rate)
    try:
        assert "tbf" in nodes.qdisc(0) and "tbf" in nodes.qdisc(1)
        shaped = tcp_throughput(nodes, 8 * MIB).bytes_per_s * 8
    finally:
        nodes.unshape()
    assert "tbf" not in nodes.qdisc(0)
    assert abs(shaped - rate) <= 0.3 * rate, (shaped, rate)
    assert free > 2 * rate, (free, rate)
