"""Two "nodes" on one machine: Linux network namespaces joined by a veth pair.

:func:`two_nodes` builds two network namespaces (``nodeA``, ``nodeB``), each with its
loopback up and one end of a veth pair carrying an address of a private range that exists
only inside these namespaces (default ``10.77.0.1`` / ``10.77.0.2``), and always tears them
down again. Both veth ends carry the same interface name, so ``btl_tcp_if_include`` /
``HOROVOD_GLOO_IFACE`` name one interface on every "host", as on a real cluster.

The :class:`TwoNodes` it yields knows how to

* run a command on a node (``ip netns exec``),
* read the link's byte counters as the node sees them (:meth:`TwoNodes.counters`),
* shape the link with ``tc`` (``tbf`` on both ends; ``netem`` is not available here),
* build an ``mpirun`` / ``horovodrun`` command across both nodes: a *launch agent* script
  that enters the target's namespace instead of ssh-ing to it is given to Open MPI
  (``--mca plm_rsh_agent``) and, named ``ssh``, first in ``PATH`` to ``horovodrun``.

The host names ``nodeA`` / ``nodeB`` resolve inside the namespaces through
``/etc/netns/<namespace>/hosts`` (``ip netns exec`` mounts it over ``/etc/hosts``), and
every command run on a node gets that name as its host name (a UTS namespace).
Every object created carries a unique per-run prefix (:func:`new_prefix`), so parallel runs
never collide, and :func:`leftovers` / :func:`remove_all` find them by that prefix.

Needs root and ``ip`` (iproute2); :func:`unavailable_reason` says why not otherwise.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from chexnet_utils.platform.processes import wait_pids_gone
from chexnet_utils.platform.root import ROOT_SWITCHES

NETNS_ETC = Path("/etc/netns")
"""Per-namespace files ``ip netns exec`` bind-mounts over ``/etc`` (here: ``hosts``)."""

HOST_NAMES = ("nodeA", "nodeB")

_AGENT = r"""#!/bin/sh
# Launch agent for two network namespaces, used instead of ssh:
#   <agent> [ssh options] <host> [-o|-p|-i value ...] <command...>
# Runs <command> in the namespace that plays <host>, with that node's host name
# (written by chexnet_utils.cluster.netns).
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-i|-l|-F|-E) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host="$1"; shift
# horovodrun puts ssh options after the host too
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-i) shift 2 ;;
    *) break ;;
  esac
done
case "$host" in
{cases}
  *) echo "netns agent: unknown host '$host'" >&2; exit 255 ;;
esac
# A node's own temporary folder: Open MPI's session directory (shared-memory segments named
# after the host name, which both "nodes" share) must not be shared with the other node.
TMPDIR="$tmp"; export TMPDIR
# The command is a string for a shell, as ssh passes it; the host name is an argument.
exec ip netns exec "$ns" unshare --uts /bin/sh -c 'hostname "$1" && exec /bin/sh -c "$2"' \
  sh "$name" "$*"
"""


def new_prefix() -> str:
    """A fresh name prefix for one run: ``cx`` + 6 hex digits (interface names are at most
    15 characters; every name this module creates is the prefix plus one or two more)."""
    return "cx" + uuid.uuid4().hex[:6]


def unavailable_reason() -> str | None:
    """Why namespaces cannot be built here (not root, no ``ip``, ``ip netns`` refused), or
    ``None`` when they can. Creates and deletes one probe namespace to be sure."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root (network namespaces, veth pairs and tc need CAP_NET_ADMIN)"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) not found: apt-get install iproute2"
    probe = new_prefix() + "-probe"
    out = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if out.returncode != 0:
        return f"`ip netns add` failed: {out.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


def namespaces() -> list[str]:
    """Names of the network namespaces of this machine (``ip netns list``)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def root_links() -> list[str]:
    """Interface names in the root namespace (``ip -o link``)."""
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True)
    names = []
    for line in out.stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            names.append(parts[1].strip().split("@")[0])
    return names


def leftovers(prefix: str) -> list[str]:
    """Everything with this prefix still present: namespaces, root-namespace links and
    ``/etc/netns`` folders (empty after a clean teardown)."""
    found = [f"netns {n}" for n in namespaces() if n.startswith(prefix)]
    found += [f"link {n}" for n in root_links() if n.startswith(prefix)]
    if NETNS_ETC.is_dir():
        found += [f"dir {p}" for p in NETNS_ETC.iterdir() if p.name.startswith(prefix)]
    return found


def namespace_pids(ns: str) -> list[int]:
    """Pids of the processes inside network namespace ``ns`` (``ip netns pids``)."""
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def remove_all(prefix: str, timeout: float = 10.0) -> list[int]:
    """Delete every namespace, root link and ``/etc/netns`` folder named ``prefix*``.

    Processes still inside such a namespace are killed (SIGKILL) and waited for first (a
    process keeps its namespace alive after ``ip netns del``). Never raises; returns the
    pids that were still alive ``timeout`` s after SIGKILL (``[]`` normally).
    """
    killed: list[int] = []
    for ns in namespaces():
        if ns.startswith(prefix):
            for pid in namespace_pids(ns):
                try:
                    os.kill(pid, 9)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
    survivors = wait_pids_gone(killed, timeout)
    for ns in namespaces():
        if ns.startswith(prefix):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    for link in root_links():
        if link.startswith(prefix):
            subprocess.run(["ip", "link", "del", link], capture_output=True)
    if NETNS_ETC.is_dir():
        for p in NETNS_ETC.iterdir():
            if p.name.startswith(prefix):
                shutil.rmtree(p, ignore_errors=True)
        try:
            NETNS_ETC.rmdir()  # only when empty: we may have created it
        except OSError:
            pass
    return survivors


def tbf_command(iface: str, rate_bit: float, burst_bytes: int | None = None,
                latency_ms: float = 50.0) -> list[str]:
    """``tc qdisc replace dev <iface> root tbf rate ... burst ... latency ...``.

    ``burst_bytes`` default: 1 ms of traffic at the rate, at least 64 KiB (above one GSO
    segment, or tbf drops it). ``latency_ms`` bounds the queue (tbf's ``limit``).
    """
    burst = burst_bytes or max(64 * 1024, int(rate_bit / 8 / 1000))
    return ["tc", "qdisc", "replace", "dev", iface, "root", "tbf", "rate",
            f"{int(rate_bit)}bit", "burst", str(burst), "latency", f"{latency_ms:g}ms"]


@dataclass
class TwoNodes:
    """Two namespaces joined by one veth pair (built by :func:`two_nodes`)."""

    prefix: str
    ips: tuple[str, str]
    workdir: Path
    prefix_len: int = 24
    names: tuple[str, str] = HOST_NAMES
    namespaces: tuple[str, str] = field(init=False)
    iface: str = field(init=False)

    def __post_init__(self) -> None:
        self.namespaces = (f"{self.prefix}-A", f"{self.prefix}-B")
        self.iface = f"{self.prefix}l"

    # -- naming ------------------------------------------------------------------------

    def ns(self, node: int | str) -> str:
        """Namespace of node ``0``/``1``, ``"nodeA"``/``"nodeB"`` or its address."""
        return self.namespaces[self._index(node)]

    def _index(self, node: int | str) -> int:
        if isinstance(node, int) and node in (0, 1):
            return node
        for i in (0, 1):
            if node in (self.names[i], self.ips[i]):
                return i
        raise ValueError(f"unknown node {node!r}: use 0/1, {self.names} or {self.ips}")

    @property
    def agent(self) -> Path:
        """The launch agent (also ``<workdir>/bin/ssh``)."""
        return self.workdir / "netns-agent"

    def tmpdir(self, node: int | str) -> Path:
        """``node``'s own ``TMPDIR`` (Open MPI's session directory lives there)."""
        return self.workdir / f"tmp-{self.names[self._index(node)]}"

    @property
    def bin_dir(self) -> Path:
        """Folder holding the fake ``ssh``: put it first in ``PATH`` for ``horovodrun``."""
        return self.workdir / "bin"

    # -- running -----------------------------------------------------------------------

    def exec_argv(self, node: int | str, argv: Sequence[str]) -> list[str]:
        """``argv`` run on ``node``: in its network namespace, and in a UTS namespace of
        its own whose host name is the node's name (Open MPI names its shared-memory
        segments after the host name: two "nodes" called alike would share them)."""
        i = self._index(node)
        return ["ip", "netns", "exec", self.namespaces[i], "unshare", "--uts", "/bin/sh",
                "-c", 'hostname "$0" && exec "$@"', self.names[i], *argv]

    def run(self, node: int | str, argv: Sequence[str], timeout: float = 60,
            check: bool = True, env: Mapping[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on ``node``, capture its output; ``check``: raise on failure."""
        out = subprocess.run(self.exec_argv(node, argv), capture_output=True, text=True,
                             timeout=timeout, env=None if env is None else dict(env))
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} on {self.names[self._index(node)]} exited "
                               f"{out.returncode}: {out.stderr.strip()[-2000:]}")
        return out

    def pids(self) -> list[int]:
        """Pids of every process inside either node's namespace right now."""
        return [pid for ns in self.namespaces for pid in namespace_pids(ns)]

    def counters(self, node: int | str) -> dict[str, int]:
        """``tx_bytes`` / ``rx_bytes`` (and packets) of ``node``'s veth end, read from
        ``/sys/class/net/<iface>/statistics`` inside its namespace."""
        stats = f"/sys/class/net/{self.iface}/statistics"
        keys = ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets")
        out = self.run(node, ["cat", *[f"{stats}/{k}" for k in keys]]).stdout.split()
        return dict(zip(keys, (int(v) for v in out), strict=True))

    # -- shaping -----------------------------------------------------------------------

    def shape(self, rate_bit: float, burst_bytes: int | None = None,
              latency_ms: float = 50.0) -> None:
        """Limit both directions to ``rate_bit`` bits/s: a ``tbf`` root qdisc on each end
        (:func:`tbf_command`). No added delay: ``netem`` does not exist in this kernel."""
        for node in (0, 1):
            self.run(node, tbf_command(self.iface, rate_bit, burst_bytes, latency_ms))

    def unshape(self) -> None:
        """Remove the ``tbf`` qdiscs again (back to the veth's default)."""
        for node in (0, 1):
            self.run(node, ["tc", "qdisc", "del", "dev", self.iface, "root"], check=False)

    def qdisc(self, node: int | str) -> str:
        """``tc qdisc show dev <iface>`` on ``node``."""
        return self.run(node, ["tc", "qdisc", "show", "dev", self.iface]).stdout.strip()

    # -- launchers ---------------------------------------------------------------------

    def hosts(self, slots: int = 1, by_name: bool = True) -> str:
        """``-H`` value: ``nodeA:<slots>,nodeB:<slots>`` (or the addresses)."""
        hs = self.names if by_name else self.ips
        return ",".join(f"{h}:{slots}" for h in hs)

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default ``os.environ``) with the fake ``ssh`` first in ``PATH``, this
        interpreter's folder next, nodeA's ``TMPDIR`` (launchers run there) and Open MPI's
        allow-root switches when root."""
        env = dict(os.environ if base is None else base)
        env["TMPDIR"] = str(self.tmpdir(0))
        env["PATH"] = os.pathsep.join([str(self.bin_dir), str(Path(sys.executable).parent),
                                       env.get("PATH", "/usr/bin:/bin")])
        if os.geteuid() == 0:
            env.update(ROOT_SWITCHES)
        return env

    def mpirun_argv(self, argv: Sequence[str], slots: int = 1, by_name: bool = True,
                    env_vars: Sequence[str] = (), extra: Sequence[str] = ()) -> list[str]:
        """``ip netns exec <nodeA> mpirun -H nodeA:s,nodeB:s ... argv``.

        ``mpirun`` runs inside nodeA's namespace (its own daemon is local), reaches nodeB
        through the launch agent, and Open MPI's TCP transport and out-of-band channel are
        restricted to the veth (ranks of one "host" use shared memory, ``vader``, as on a
        real node; ranks of different hosts TCP over the veth). ``env_vars`` are forwarded
        with ``-x``.
        """
        exe = shutil.which("mpirun")
        if exe is None:
            raise FileNotFoundError("mpirun not found: apt-get install openmpi-bin")
        cmd = [exe, "-np", str(2 * slots), "-H", self.hosts(slots, by_name),
               "--mca", "plm_rsh_agent", str(self.agent),
               "--mca", "btl", "self,vader,tcp",
               # shared memory between a node's ranks through its segments only (no
               # cross-process-memory-attach copies, which this sandbox may not allow)
               "--mca", "btl_vader_single_copy_mechanism", "none",
               "--mca", "btl_tcp_if_include", self.iface,
               "--mca", "oob_tcp_if_include", self.iface,
               "--bind-to", "none", "-x", "PATH"]
        for var in env_vars:
            cmd += ["-x", var]
        argv = list(argv)
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        return self.exec_argv(0, [*cmd, *extra, *argv])

    def horovodrun_argv(self, argv: Sequence[str], slots: int = 1, by_name: bool = False,
                        extra: Sequence[str] = ()) -> list[str]:
        """``ip netns exec <nodeA> horovodrun --gloo -np 2s -H ipA:s,ipB:s ... argv``.

        ``horovodrun`` starts remote workers with ``ssh``: the environment of
        :meth:`environment` puts the launch agent first in ``PATH`` under that name.
        ``--network-interface`` names the veth (the same name on both nodes), so the Gloo
        rendezvous and the workers' Gloo links use it.
        """
        exe = Path(sys.executable).parent / "horovodrun"
        argv = list(argv)
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        cmd = [str(exe), "--gloo", "-np", str(2 * slots), "-H", self.hosts(slots, by_name),
               "--network-interface", self.iface, *extra, *argv]
        return self.exec_argv(0, cmd)

    def launch(self, argv: Sequence[str], timeout: float = 300,
               env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a launcher command (from :meth:`mpirun_argv` / :meth:`horovodrun_argv`) with
        :meth:`environment`; ``RuntimeError`` with the tail of stderr when it fails."""
        full_env = self.environment()
        full_env.update(env or {})
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                             env=full_env, start_new_session=True)
        if out.returncode != 0:
            name = next((Path(a).name for a in argv
                         if Path(a).name in ("mpirun", "horovodrun")), argv[0])
            raise RuntimeError(f"{name} exited {out.returncode}:\n{out.stderr[-3000:]}\n"
                               f"{out.stdout[-1000:]}")
        return out


def agent_script(nodes: TwoNodes) -> str:
    """The launch agent's text for ``nodes``: every value written into it shell-quoted
    (``shlex.quote``), so a temporary folder with a space or a quote stays one word."""
    q = shlex.quote
    cases = "\n".join(f"  {q(name)}|{q(ip_addr)}) ns={q(ns)}; name={q(name)}; "
                      f"tmp={q(str(nodes.tmpdir(i)))} ;;"
                      for i, (name, ip_addr, ns)
                      in enumerate(zip(nodes.names, nodes.ips, nodes.namespaces, strict=True)))
    return _AGENT.replace("{cases}", cases)


def _build(nodes: TwoNodes) -> None:
    a, b = nodes.namespaces
    for ns in (a, b):
        _ip("netns", "add", ns)
    _ip("link", "add", nodes.iface, "netns", a, "type", "veth", "peer", "name",
        nodes.iface, "netns", b)
    for ns, ip_addr in zip((a, b), nodes.ips, strict=True):
        _ip("-n", ns, "addr", "add", f"{ip_addr}/{nodes.prefix_len}", "dev", nodes.iface)
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "link", "set", nodes.iface, "up")
    # Both nodes' hosts file: the node names (also each node's host name: Gloo looks it up).
    hosts = ("127.0.0.1 localhost\n::1 localhost\n"
             + "".join(f"{ip_addr} {name}\n"
                       for ip_addr, name in zip(nodes.ips, nodes.names, strict=True)))
    for ns in (a, b):
        d = NETNS_ETC / ns
        d.mkdir(parents=True, exist_ok=True)
        (d / "hosts").write_text(hosts, encoding="utf-8")
    for i in (0, 1):
        nodes.tmpdir(i).mkdir()
    nodes.agent.write_text(agent_script(nodes), encoding="utf-8")
    nodes.agent.chmod(0o755)
    nodes.bin_dir.mkdir(exist_ok=True)
    (nodes.bin_dir / "ssh").symlink_to(nodes.agent)


@contextmanager
def two_nodes(prefix: str | None = None, subnet: str = "10.77.0", prefix_len: int = 24
              ) -> Iterator[TwoNodes]:
    """Build nodeA / nodeB (``<subnet>.1`` / ``<subnet>.2``), yield them, always tear down.

    Teardown, also after an error, kills any process left inside either namespace,
    deletes both namespaces (which destroys the veth pair and its qdiscs), the
    ``/etc/netns`` hosts files and the agent's temporary folder; after a normal exit it
    then checks by name that nothing with the prefix is left (``RuntimeError``
    otherwise). ``RuntimeError`` when building fails (after cleaning up).
    """
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(f"cannot build two network namespaces: {reason}")
    if any(c.isspace() for c in tempfile.gettempdir()):  # the agent's path is split there
        raise RuntimeError(f"the temporary folder {tempfile.gettempdir()!r} contains "
                           "whitespace, which Open MPI's plm_rsh_agent cannot take: set "
                           "TMPDIR to a folder without")
    prefix = prefix or new_prefix()
    workdir = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
    nodes = TwoNodes(prefix, (f"{subnet}.1", f"{subnet}.2"), workdir, prefix_len)
    survivors: list[int] = []
    try:
        _build(nodes)
        yield nodes
    finally:
        survivors = remove_all(prefix)
        shutil.rmtree(workdir, ignore_errors=True)
    # reached only without an exception in flight (which must not be masked)
    left = leftovers(prefix) + [f"process {pid}" for pid in survivors]
    if workdir.exists():
        left.append(f"folder {workdir}")
    if left:
        raise RuntimeError(f"teardown left {', '.join(left)}")
