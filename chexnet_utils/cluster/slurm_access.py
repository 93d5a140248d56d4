"""Who can reach the one-machine Slurm, and where its daemons may write.

:mod:`chexnet_utils.cluster.slurm_local` starts ``munged``, ``slurmctld`` and ``slurmd`` as the
user who asks (:func:`invoking_user`), listening where this host's name resolves to when that is a
loopback address (:func:`loopback_bind_address`), in a state folder that nobody else can
steer (:func:`check_state_dir` before anything is written, then :func:`private_folder` and
:func:`open_new`: 0700 folders, files created with ``O_NOFOLLOW``).
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import socket
import stat
from pathlib import Path

from chexnet_utils.cluster.slurm import SlurmError


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_state_dir(state: Path) -> None:
    """:class:`~chexnet_utils.cluster.slurm.SlurmError` unless the daemons may write in ``state``
    without another account steering where those writes land.

    ``state`` must be absolute. Every folder above it that exists must be a real folder (not
    a symbolic link) owned by root or this user, and not writable by other accounts unless
    it is sticky (``/tmp``: others may add entries there, not replace ours). If ``state``
    exists, it and everything in it must be this user's and hold no symbolic link. So
    ``make slurm`` run as root in a checkout another user owns is refused: that user could
    swap ``build/slurm/munge`` for a link to a folder of theirs between root's check and
    root's write (and read or replace the munge key there)."""
    if not state.is_absolute():
        raise SlurmError(f"Slurm state folder {state} must be an absolute path")
    me = os.geteuid()
    trusted = {0, me}
    for folder in reversed(state.parents):
        try:
            st = os.lstat(folder)
        except FileNotFoundError:
            break
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise SlurmError(f"{folder}, above the Slurm state folder, is a symbolic link "
                               "or not a folder: give --dir as a plain path")
        if st.st_uid not in trusted:
            raise SlurmError(
                f"{folder}, above the Slurm state folder {state}, is owned by "
                f"{_owner(st.st_uid)}, who could swap a folder on this path for a link to "
                f"their own while the daemons (running as {_owner(me)}) write there: start "
                f"this Slurm as that user, or in a folder of your own (make slurm "
                f"SLURM_DIR=...)")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise SlurmError(f"{folder}, above the Slurm state folder {state}, is writable "
                               "by other accounts (and not sticky): choose a state folder "
                               "under a folder only you may change")
    if not os.path.lexists(state):
        return
    for root, dirs, files in os.walk(state):
        for name in [".", *dirs, *files]:
            path = Path(root) / name if name != "." else Path(root)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                raise SlurmError(f"{path} is a symbolic link: the Slurm state folder may "
                                   "hold none (the daemons would write through it); remove "
                                   "it, or choose a new state folder")
            if st.st_uid != me:
                raise SlurmError(f"{path} in the Slurm state folder belongs to "
                                   f"{_owner(st.st_uid)}, not to {_owner(me)} who starts "
                                   "the daemons: choose a state folder of your own")
            if path == state and st.st_mode & 0o022:
                raise SlurmError(f"Slurm state folder {state} is writable by other "
                                   "accounts, so what is in it cannot be trusted: choose a "
                                   "new one")


def private_folder(path: Path) -> None:
    """Create ``path`` (0700) or make the existing real folder 0700, never following a
    symbolic link; :class:`~chexnet_utils.cluster.slurm.SlurmError` if it is not this user's."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        raise SlurmError(f"{path}: not a plain folder ({e.strerror})") from None
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise SlurmError(f"{path} is not yours: choose a state folder of your own")
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def open_new(path: Path, mode: int) -> int:
    """A new file at ``path`` for writing (an old one removed first), never through a link."""
    path.unlink(missing_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                   mode)


def invoking_user() -> str:
    """The name of the account this process runs as (the daemons' ``SlurmUser``)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        raise SlurmError(f"uid {os.geteuid()} has no account name (no entry in the "
                           "password database), which Slurm needs for SlurmUser") from None


def loopback_bind_address(host: str | None = None) -> str | None:
    """The address ``host`` (default: this machine's name) resolves to, if every address it
    resolves to is a loopback one; else ``None``.

    That is where ``slurmctld`` and ``slurmd`` listen with
    ``CommunicationParameters=NoCtldInAddrAny,NoInAddrAny`` ("bind to the address of what
    the node resolves to", ``slurm.conf(5)``, Slurm 22.05; measured here: ``NodeAddr`` and
    the address in ``SlurmctldHost`` do not change it)."""
    try:
        infos = socket.getaddrinfo(host or socket.gethostname(), None, type=socket.SOCK_STREAM)
    except OSError:
        return None
    addresses = [str(info[4][0]) for info in infos]  # a str for AF_INET and AF_INET6
    if not addresses or not all(ipaddress.ip_address(a).is_loopback for a in addresses):
        return None
    return next((a for a in addresses if ":" not in a), addresses[0])
