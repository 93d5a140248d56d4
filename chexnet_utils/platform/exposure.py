"""Who can reach what this process listens on: the gate before an unauthenticated server.

The tf.data service (``DispatchServer``, ``WorkerServer``) and the gRPC server of
``MultiWorkerMirroredStrategy`` accept any graph a client sends, without authentication,
and TensorFlow graphs can read and write files ("TensorFlow itself is not a sandbox":
TensorFlow's ``SECURITY.md``). They listen on ``[::]`` (TensorFlow 2.21 offers no bind
address), and loopback is reachable by every account on the host, every other interface by
every host on its network. So :func:`require_private_network` **fails closed**: such a server
starts only

- inside a **network namespace this project made** (``exposure private``, below: ``make lab``,
  ``make tutorial`` and ``make test`` run the notebooks there), recognised by what cannot be
  faked from outside: the namespace's inode, recorded in ``CHEXNET_PRIVATE_NETNS`` by the
  process that made it, must be this process's namespace, and no interface but ``lo`` may be
  up in it (nobody else can join a namespace made through a user namespace of one's own, and
  with only loopback nothing reaches in);
- or with the explicit opt-in ``CHEXNET_ALLOW_SHARED_HOST=1``, whose line says what it means:
  other accounts and hosts can run graphs as you here.

Nothing else counts: not who else seems logged in (``/proc`` may hide them, their uids may be
outside any range, they may log in after the check), not a user namespace without a network
namespace of its own (Apptainer's default, rootless containers on the host network), not a
pid namespace. The refusal is one line saying what to do.

**A private network namespace without root** (:func:`private_network_command`; ``make lab
PRIVATE=1``): ``python -m chexnet_utils.platform.exposure private -- CMD ...`` runs ``CMD`` in a
network namespace of its own, made through a user namespace (``unshare --user
--map-root-user --net``; plain ``unshare --net`` as root), with only a loopback interface,
brought up (with one more address, :data:`LOOPBACK_ALIAS`, so that the host name resolves
for programs that ask ``getaddrinfo`` with ``AI_ADDRCONFIG``, as Slurm does). Whatever ``CMD``
starts (JupyterLab on a Unix socket, its kernels, ``mpiexec``
and its out-of-band listener on "every interface", the engines, the tf.data service, the
MultiWorkerMirroredStrategy server) listens on that namespace's interfaces only, which no
other account and no other host can reach (``tests/mpi/test_private_network.py`` checks it
with ``ss`` from outside). Inside, the user shows as root (uid 0 mapped to the real one):
files it writes belong to the real user.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Sequence

ALLOW_ENV = "CHEXNET_ALLOW_SHARED_HOST"
"""``1``: start unauthenticated servers outside a private network namespace, knowing that
other accounts and hosts can run graphs as you there."""


class SharedHostError(RuntimeError):
    """An unauthenticated server would be reachable by other accounts on this host."""


PRIVATE_NETNS_ENV = "CHEXNET_PRIVATE_NETNS"
"""Set by ``exposure inside`` (the first process in the namespace ``exposure private`` makes):
that namespace, as ``/proc/self/ns/net`` names it (``net:[inode]``)."""


def check_listen_address(ip: str) -> None:
    """``ValueError`` for a wildcard address (``0.0.0.0``, ``::``, ``*``, empty): a controller
    listens on one named interface, never on every network of the machine."""
    if ip.strip() in ("", "0.0.0.0", "*", "::", "[::]"):
        raise ValueError(f"controller_ip={ip!r} would listen on every interface: name the "
                         "address of the one the engines reach (127.0.0.1 on one machine)")


def _net_namespace(pid: int | str) -> str:
    """``net:[inode]``: the network namespace process ``pid`` is in (``OSError`` where
    that may not be read)."""
    return os.readlink(f"/proc/{pid}/ns/net")


def interfaces_up() -> list[str]:
    """The names of this network namespace's interfaces that are up (``SIOCGIFFLAGS`` on each
    one ``if_nameindex`` lists: both ask the kernel about this process's namespace, unlike
    ``/sys/class/net``, which shows the namespace the sysfs mount was made in)."""
    up = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            request = struct.pack("16sH14s", name.encode()[:15], 0, b"")
            try:
                flags = struct.unpack("16sH14s", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
            except OSError:
                continue  # gone meanwhile
            if flags & _IFF_UP:
                up.append(name)
    return up


_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def private_namespace() -> str | None:
    """``net:[inode]`` when this process is in a network namespace ``exposure private`` made
    and nothing but ``lo`` is up in it; ``None`` otherwise (see the module docstring)."""
    recorded = os.environ.get(PRIVATE_NETNS_ENV)
    if not recorded:
        return None
    try:
        current = _net_namespace("self")
    except OSError:
        return None
    if current != recorded or any(name != "lo" for name in interfaces_up()):
        return None
    return current


def who_can_reach(service: str) -> tuple[str, bool]:
    """One line saying who could reach a ``service`` listening on every interface if it
    started now, and whether anybody else could (True outside a private namespace of this
    project's). For listeners this project cannot move or authenticate but that run no graphs
    (``mpiexec``'s out-of-band listener): they start, and the line says so."""
    namespace = private_namespace()
    if namespace:
        return (f"{service}: in this project's private network namespace {namespace} (only "
                "lo up), reachable from inside it only"), False
    return (f"{service}: on every interface of this host's network: other accounts and hosts "
            "can connect to it (make lab, make tutorial and make test run the notebooks in a "
            "private network namespace; docs/facilitator.md, 'Shared hosts')"), True


def announce_reach(service: str, prefix: str) -> str:
    """:func:`who_can_reach` for a listener that starts anyway (``mpiexec``'s out-of-band
    listener is on every interface whatever ``oob_tcp_if_include`` says: Open MPI 4.1,
    ``orte/mca/oob/tcp/oob_tcp_listener.c``): the line is returned, and printed on stderr
    (once per process) where others could reach it."""
    line, shared = who_can_reach(service)
    if shared and service not in _ANNOUNCED:
        _ANNOUNCED.add(service)
        print(f"{prefix} {line}", file=sys.stderr, flush=True)
    return line


_ANNOUNCED: set[str] = set()


def require_private_network(service: str) -> str:
    """Check that an unauthenticated ``service`` started now is reachable from this private
    network namespace only, or that the learner opted in; return why (one line, for the
    notebook to print), or raise :class:`SharedHostError` saying what to do."""
    line, shared = who_can_reach(service)
    if not shared:
        return line
    if os.environ.get(ALLOW_ENV) == "1":
        return (f"{service}: started outside a private network namespace ({ALLOW_ENV}=1): "
                f"other accounts and hosts can run graphs as you here")
    raise SharedHostError(
        f"refusing to start the {service}: it runs any TensorFlow graph a client sends, without "
        f"authentication, on every interface, and outside a private network namespace other "
        f"accounts and hosts can reach it; run the notebooks with make lab or make tutorial "
        f"(private), this command under python -m chexnet_utils.platform.exposure private -- "
        f"COMMAND, or set {ALLOW_ENV}=1 to accept that other accounts and hosts can run graphs "
        f"as you here")


def private_network_command(argv: Sequence[str]) -> list[str]:
    """The command line that runs ``argv`` in a network namespace of its own with only a
    loopback interface, up (see the module's docstring). Raises ``FileNotFoundError`` when
    ``unshare`` (util-linux) is missing."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise FileNotFoundError("unshare not found (util-linux): apt-get install util-linux")
    namespaces = ["--net"] if os.geteuid() == 0 else ["--user", "--map-root-user", "--net"]
    return [unshare, *namespaces, "--", sys.executable, "-m", "chexnet_utils.platform.exposure",
            "inside", "--", *argv]


def bring_loopback_up() -> None:
    """Set the ``lo`` interface of this network namespace up (a new namespace starts with it
    down, and without it nothing can listen on 127.0.0.1). Needs ``CAP_NET_ADMIN`` here."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | _IFF_UP, b""))


LOOPBACK_ALIAS = "192.0.2.1"
"""An address the namespace's ``lo`` also carries (as ``lo:1``, /32): glibc's ``getaddrinfo``
with ``AI_ADDRCONFIG`` (Slurm's daemons use it) returns nothing for IPv4 on a machine whose only
IPv4 address is a loopback one, and the host name would not resolve. 192.0.2.0/24 is
TEST-NET-1 (RFC 5737): in a namespace with no other interface it leads nowhere."""


def add_loopback_alias(address: str = LOOPBACK_ALIAS) -> None:
    """Give this namespace's ``lo`` the extra address :data:`LOOPBACK_ALIAS` (``lo:1``, /32).
    Needs ``CAP_NET_ADMIN`` here."""
    siocsifaddr, siocsifnetmask = 0x8916, 0x891C
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for request, value in ((siocsifaddr, address), (siocsifnetmask, "255.255.255.255")):
            fcntl.ioctl(s, request, struct.pack("16sH2s4s8s", b"lo:1", socket.AF_INET, b"\0\0",
                                                socket.inet_aton(value), b"\0" * 8))


MPI_LOOPBACK = {"OMPI_MCA_oob_tcp_if_include": "lo", "OMPI_MCA_btl_tcp_if_include": "lo",
                "PRTE_MCA_oob_tcp_if_include": "lo"}
"""Set (where not set already) for everything in a private namespace: its only interface is
``lo``, which Open MPI leaves out of its out-of-band channel by default ("No network interfaces
were found for out-of-band communications"); ``PRTE_MCA_``: Open MPI 5's runtime. A command
line's ``--mca`` (``MPICluster``, the two-node runs) still wins."""


_NO_NAMESPACE_HINT = (
    "this host does not let your account make one (unprivileged user namespaces off: sysctl "
    "kernel.unprivileged_userns_clone, user.max_user_namespaces, or Ubuntu 24.04's "
    "kernel.apparmor_restrict_unprivileged_userns): ask the facilitator for a VM or "
    "container of your own")


def namespace_problem() -> str | None:
    """Why this account cannot make a private network namespace here (one line, with what to
    do), or ``None`` when it can: :func:`private_network_command` tried on ``true``."""
    try:
        probe = subprocess.run(private_network_command(["true"]), capture_output=True,
                               text=True, timeout=60)
    except FileNotFoundError as e:
        return str(e)
    if probe.returncode == 0:
        return None
    reason = (probe.stderr.strip().splitlines() or ["no reason given"])[-1]
    return reason if "cannot bring up" in reason else f"{reason}: {_NO_NAMESPACE_HINT}"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m chexnet_utils.platform.exposure private -- CMD ...``: run ``CMD`` in a network
    namespace of its own (``inside`` is the step that runs in it: loopback up, then
    ``exec CMD``). Exit status: ``CMD``'s; 2 for a usage error; 1 when no namespace can be
    made, with the reason."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[0] not in ("private", "inside") or args[1] != "--":
        print("usage: python -m chexnet_utils.platform.exposure private -- COMMAND [ARGS...]",
              file=sys.stderr)
        return 2
    action, command = args[0], args[2:]
    if action == "inside":
        try:
            bring_loopback_up()
            add_loopback_alias()
        except OSError as e:
            print(f"error: cannot bring up the loopback interface of the new network namespace "
                  f"({e.strerror}): {_NO_NAMESPACE_HINT}", file=sys.stderr)
            return 1
        try:
            os.environ[PRIVATE_NETNS_ENV] = _net_namespace("self")  # what the gate recognises
            for name, value in MPI_LOOPBACK.items():  # Open MPI skips lo unless told
                os.environ.setdefault(name, value)
            os.execvp(command[0], command)
        except OSError as e:
            print(f"error: {command[0]}: {e.strerror}", file=sys.stderr)
            return 127
    problem = namespace_problem()
    if problem is not None:
        print(f"error: no private network namespace: {problem}", file=sys.stderr)
        return 1
    cmd = private_network_command(command)
    os.execv(cmd[0], cmd)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
