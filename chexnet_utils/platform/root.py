"""Running as root: in a container, in a namespace of one's own, or by an explicit opt-in.

Jupyter Server refuses to run as root without ``--allow-root``, and Open MPI's ``mpirun``
without ``OMPI_ALLOW_RUN_AS_ROOT=1`` and ``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``: a root process
that runs whatever a notebook or a client sends can change anything on the host. This project
adds those switches (:func:`root_switches`) only where root is the normal way of working:

- in a **container** (``/.dockerenv``, ``/run/.containerenv``, or the ``container`` variable
  systemd-nspawn, podman and LXC set), where root is the container's;
- in a **user namespace of the learner's own** (``make lab``'s private namespace made without
  root: uid 0 there is the learner's own uid outside, ``/proc/self/uid_map``);
- or where the learner said so: ``CHEXNET_ALLOW_ROOT=1``.

As the host's root otherwise, :class:`RootRefused` says in one line what to do: run as a normal
user (root is needed only for the system packages), or set the opt-in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ROOT_SWITCHES = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
"""What Open MPI needs to start as root (:func:`root_switches` says when to add them)."""
ALLOW_ROOT_ENV = "CHEXNET_ALLOW_ROOT"
"""``1``: let Jupyter and Open MPI run as the host's root."""
CONTAINER_MARKERS = ("/.dockerenv", "/run/.containerenv")


class RootRefused(RuntimeError):
    """Running as the host's root without the opt-in (the message says what to do)."""


def in_container(env: Mapping[str, str] | None = None, root: Path = Path("/")) -> bool:
    """Whether this process runs in a container (Docker, Podman, systemd-nspawn, LXC)."""
    env = os.environ if env is None else env
    return bool(env.get("container")) or any(
        (root / marker.lstrip("/")).exists() for marker in CONTAINER_MARKERS)


def host_root(uid_map: Path = Path("/proc/self/uid_map")) -> bool:
    """Whether this process is the host's root: effective uid 0, and uid 0 here is uid 0
    outside (a user namespace made by a normal account maps 0 to that account's uid)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False
    try:
        for line in uid_map.read_text().splitlines():
            inside, outside, _ = (int(x) for x in line.split())
            if inside == 0:
                return outside == 0
    except (OSError, ValueError):
        pass
    return True


def root_switches(env: Mapping[str, str] | None = None) -> bool:
    """Whether to add Jupyter's ``--allow-root`` and Open MPI's allow-root switches: ``False``
    when this process is not uid 0; ``True`` as root in a container, in a user namespace of
    one's own, or with ``CHEXNET_ALLOW_ROOT=1``. Raises :class:`RootRefused` as the host's root
    otherwise."""
    env = os.environ if env is None else env
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False
    if not host_root() or in_container(env) or env.get(ALLOW_ROOT_ENV) == "1":
        return True
    raise RootRefused(
        "running as root on this host (not in a container): Jupyter and Open MPI refuse root "
        "for a reason, and this project does not switch that off by itself; run the notebooks "
        "as a normal user (root is needed only for the system packages: README, Quick start), "
        f"or set {ALLOW_ROOT_ENV}=1 to run them as root anyway")
