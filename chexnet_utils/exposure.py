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
  seen and the ways out: a per-learner VM or container, or the explicit opt-in
  ``CHEXNET_ALLOW_SHARED_HOST=1`` for a facilitator who has firewalled the host.
"""

from __future__ import annotations

import os
import pwd
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
    floor, counts = uid_min(), {}
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


def in_private_network_namespace() -> bool:
    """True where this process's network namespace is not the host's: it differs from pid
    1's (readable as root), or this process is in a user namespace of its own (a namespace
    made without root with ``unshare --user --net``)."""
    try:
        return os.stat("/proc/self/ns/net").st_ino != os.stat("/proc/1/ns/net").st_ino
    except OSError:
        pass
    try:
        first = Path("/proc/self/uid_map").read_text().split()
    except OSError:
        return False
    return first[:3] != ["0", "0", "4294967295"]


def _account(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


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
        f"(loopback too). Run the notebooks in a VM or container of your own, or, if the "
        f"facilitator has made this host safe, set {ALLOW_ENV}=1 "
        f"(docs/facilitator.md, 'Shared hosts').")
