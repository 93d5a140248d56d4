"""Who can reach what this process listens on: the gate before an unauthenticated server.

The tf.data service (``DispatchServer``, ``WorkerServer``) and the gRPC server of
``MultiWorkerMirroredStrategy`` accept any graph a client sends, without authentication,
and TensorFlow graphs can read and write files ("TensorFlow itself is not a sandbox":
TensorFlow's ``SECURITY.md``). They listen on ``[::]`` (TensorFlow 2.21 offers no bind
address), and loopback is reachable by every account on the host. So before one is started,
:func:`require_private_network` decides whether anybody else could reach it:

- in a **private network namespace** (this process's differs from the one pid 1 is in, or
  this process runs in a user namespace of its own), nobody outside the namespace can;
- on a host where **no other account runs a process** (a laptop, a container, a VM of one's
  own, a CI machine), nobody else is there to;
- otherwise (a shared workshop host) it raises :class:`SharedHostError`, naming the accounts
  seen and the ways out: a per-learner VM or container, a private network namespace, or the
  explicit opt-in ``CHEXNET_ALLOW_SHARED_HOST=1`` for a facilitator who has made the host
  safe.

**A private network namespace without root** (:func:`private_network_command`; ``make lab
PRIVATE=1``): ``python -m chexnet_utils.platform.exposure private -- CMD ...`` runs ``CMD`` in a
network namespace of its own, made through a user namespace (``unshare --user
--map-root-user --net``; plain ``unshare --net`` as root), with only a loopback interface,
brought up. Whatever ``CMD`` starts (JupyterLab on a Unix socket, its kernels, ``mpiexec``
and its out-of-band listener on "every interface", the engines, the tf.data service, the
MultiWorkerMirroredStrategy server) listens on that namespace's interfaces only, which no
other account and no other host can reach (``tests/mpi/test_private_network.py`` checks it
with ``ss`` from outside). Inside, the user shows as root (uid 0 mapped to the real one):
files it writes belong to the real user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

ALLOW_ENV = "CHEXNET_ALLOW_SHARED_HOST"
"""``1``: start unauthenticated servers even where other accounts run processes."""

_UID_MIN_DEFAULT = 1000


class SharedHostError(RuntimeError):
    """An unauthenticated server would be reachable by other accounts on this host."""


def uid_min(login_defs: Path = Path("/etc/login.defs")) -> int:
    """The smallest uid of a person's account (``UID_MIN`` of ``login.defs``, else 1000)."""
    try:
        for line in login_defs.read_text(encoding="utf-8", errors="replace").splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[0] == "UID_MIN" and fields[1].isdigit():
                return int(fields[1])
    except OSError:
        pass
    return _UID_MIN_DEFAULT


def other_accounts_running(proc: Path = Path("/proc"), me: int | None = None) -> dict[int, int]:
    """``{uid: processes}`` of the people's accounts (uid >= ``UID_MIN``, not ``nobody``)
    other than this one that have a process running now."""
    me = os.getuid() if me is None else me
    floor = uid_min()
    counts: dict[int, int] = {}
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            uid = entry.stat().st_uid
        except OSError:          # gone meanwhile
            continue
        if uid != me and floor <= uid < 65534:
            counts[uid] = counts.get(uid, 0) + 1
    return counts


def _net_namespace(pid: int | str) -> str:
    """``net:[inode]``: the network namespace process ``pid`` is in (``OSError`` where
    that may not be read)."""
    return os.readlink(f"/proc/{pid}/ns/net")


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2:].split()[1])


def in_private_network_namespace() -> bool:
    """True where this process's network namespace is not the host's: it differs from pid
    1's, or (where pid 1's may not be read, as in some sandboxes) from that of one of this
    process's ancestors (it was moved into a namespace of its own, by ``unshare --net`` or
    ``ip netns exec``), or this process is in a user namespace of its own (a namespace made
    without root with ``unshare --user --net``). Other accounts cannot enter a namespace
    made this way (that takes ``CAP_SYS_ADMIN`` over it)."""
    try:
        mine = _net_namespace("self")
    except OSError:
        return False
    try:
        return mine != _net_namespace(1)
    except OSError:
        pass
    try:
        first = Path("/proc/self/uid_map").read_text().split()
        if first[:3] != ["0", "0", "4294967295"]:
            return True
    except OSError:
        pass
    pid = os.getppid()
    while pid > 1:
        try:
            if _net_namespace(pid) != mine:
                return True
            pid = _parent(pid)
        except (OSError, ValueError, IndexError):
            break
    return False


def _account(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def who_can_reach(service: str) -> tuple[str, bool]:
    """One line saying who could reach a ``service`` listening on every interface if it
    started now, and whether other accounts could (True on a shared host outside a private
    network namespace). For listeners this collection cannot move or authenticate but that do
    not run arbitrary graphs either (``mpiexec``'s out-of-band listener): they start, and the
    line says what :func:`require_private_network` would have refused."""
    if in_private_network_namespace():
        return f"{service}: in a private network namespace, reachable from inside it only", False
    others = other_accounts_running()
    if not others:
        return f"{service}: no other account runs a process on this host", False
    names = ", ".join(f"{_account(uid)} ({n} processes)" for uid, n in sorted(others.items()))
    return (f"{service}: open on every interface, and other accounts run processes here "
            f"({names}); to keep them out, run the notebooks in a network namespace of your own "
            f"(make lab PRIVATE=1) or a VM or container of your own "
            f"(docs/facilitator.md, 'Shared hosts')"), True


def announce_reach(service: str, prefix: str) -> str:
    """:func:`who_can_reach` for a listener that starts anyway (``mpiexec``'s out-of-band
    listener is on every interface whatever ``oob_tcp_if_include`` says: Open MPI 4.1,
    ``orte/mca/oob/tcp/oob_tcp_listener.c``): the line is returned, and printed on stderr
    where other accounts could reach it."""
    line, shared = who_can_reach(service)
    if shared:
        print(f"{prefix} {line}", file=sys.stderr, flush=True)
    return line


def require_private_network(service: str) -> str:
    """Check that an unauthenticated ``service`` started now is reachable by this account
    only; return why (one line, for the notebook to print), or raise
    :class:`SharedHostError` saying why not and what to do."""
    if in_private_network_namespace():
        return f"{service}: in a private network namespace, reachable from inside it only"
    others = other_accounts_running()
    if not others:
        return f"{service}: no other account runs a process on this host"
    if os.environ.get(ALLOW_ENV) == "1":
        return (f"{service}: other accounts run processes here, started anyway "
                f"({ALLOW_ENV}=1: the facilitator has firewalled this host)")
    names = ", ".join(f"{_account(uid)} ({n} processes)" for uid, n in sorted(others.items()))
    raise SharedHostError(
        f"refusing to start the {service}: it runs any TensorFlow graph a client sends, "
        f"without authentication, and other accounts on this host ({names}) could reach it "
        f"(loopback too). Run the notebooks in a VM or container of your own, or in a network "
        f"namespace of your own (make lab PRIVATE=1), or, if the facilitator has made this "
        f"host safe, set {ALLOW_ENV}=1 (docs/facilitator.md, 'Shared hosts').")


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
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, siocgifflags, request))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH14s", b"lo", flags | iff_up, b""))


_NO_NAMESPACE_HINT = (
    "this host does not let your account make one (unprivileged user namespaces off: sysctl "
    "kernel.unprivileged_userns_clone, user.max_user_namespaces, or Ubuntu 24.04's "
    "kernel.apparmor_restrict_unprivileged_userns): ask the facilitator for a VM or "
    "container of your own")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m chexnet_utils.platform.exposure private -- CMD ...``: run ``CMD`` in a network
    namespace of its own (``inside`` is the step that runs in it: loopback up, then
    ``exec CMD``). Exit status: ``CMD``'s; 2 for a usage error; 1 when no namespace can be
    made, with the reason."""
    import subprocess

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[0] not in ("private", "inside") or args[1] != "--":
        print("usage: python -m chexnet_utils.platform.exposure private -- COMMAND [ARGS...]",
              file=sys.stderr)
        return 2
    action, command = args[0], args[2:]
    if action == "inside":
        try:
            bring_loopback_up()
        except OSError as e:
            print(f"error: cannot bring up the loopback interface of the new network namespace "
                  f"({e.strerror}): {_NO_NAMESPACE_HINT}", file=sys.stderr)
            return 1
        try:
            os.execvp(command[0], command)
        except OSError as e:
            print(f"error: {command[0]}: {e.strerror}", file=sys.stderr)
            return 127
    try:
        probe = subprocess.run(private_network_command(["true"]), capture_output=True,
                               text=True, timeout=60)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["no reason given"])[-1]
        if "cannot bring up" not in reason:
            reason = f"{reason}: {_NO_NAMESPACE_HINT}"
        print(f"error: no private network namespace: {reason}", file=sys.stderr)
        return 1
    cmd = private_network_command(command)
    os.execv(cmd[0], cmd)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
