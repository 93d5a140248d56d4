"""Crash-safe file writes: a reader sees the old file or the new one, never half of one.

Conversions, checkpoints and manifests here run for hours on real data and may be killed at
any moment; every small state file is therefore written to a temporary name in the same
folder (created with ``O_EXCL`` under a random name: :func:`create_temp`), flushed to disk,
and renamed over the target (``os.replace`` is atomic on POSIX). The one implementation of
that dance is :func:`atomic_path` (a temporary path for writers that stream or name their
own files: PNGs, shards, Keras checkpoints, figures);
:func:`write_text_atomic` and :func:`write_json_atomic` (strict
JSON through :func:`json_safe`) are built on it, and :func:`fsync_dir` makes a rename itself
durable. :func:`folder_lock` serialises two processes that write the same folder (two
notebooks preparing the same data set, two results writers).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

_NUMBER_LIST = re.compile(r"\[\s*(-?[0-9.eE+-]+(?:,\s*-?[0-9.eE+-]+)*)\s*\]")


def create_temp(folder: Path | str, prefix: str = ".", suffix: str = ".tmp") -> Path:
    """A new empty file ``<prefix><random><suffix>`` in ``folder``, created with ``O_EXCL``
    (never an existing file, nor a symbolic link planted under a guessed name) and the
    permissions of an ordinary new file (``0o666`` less the umask, as ``open`` gives)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) \
        | getattr(os, "O_CLOEXEC", 0)
    while True:
        path = Path(folder) / f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            os.close(os.open(path, flags, 0o666))
            return path
        except FileExistsError:
            continue


def fsync_file(path: Path | str) -> None:
    """Flush file ``path``'s data to disk (before renaming it into place)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: Path | str, *, prefix: str | None = None, suffix: str = ".tmp",
                fsync: bool = True) -> Iterator[Path]:
    """A temporary path to write ``path``'s new contents to; renamed over ``path``
    (``os.replace``) when the block ends normally, removed when it raises (even on
    ``KeyboardInterrupt``), so ``path`` is always the old file or the whole new one.

    The temporary file is created empty beforehand (:func:`create_temp`: a random name in
    ``path``'s folder, ``O_EXCL``): ``<prefix><random><suffix>``, by default
    ``.<name>.<random>.tmp`` (hidden, and matched by no ``*.<suffix>`` glob; Keras wants its
    own suffix: ``suffix=".keras"``). The block may write it however it likes (``open``,
    ``Image.save``, ``model.save``); with ``fsync`` its data reach the disk before the rename,
    so a power cut cannot leave an empty or partial file under the final name::

        with atomic_path(out / "image.png") as tmp:
            Image.fromarray(img).save(tmp, format="PNG")
    """
    path = Path(path)
    tmp_path = create_temp(path.parent, f".{path.name}." if prefix is None else prefix, suffix)
    try:
        yield tmp_path
        if fsync:
            fsync_file(tmp_path)
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


def write_text_atomic(path: Path | str, text: str, prefix: str | None = None,
                      fsync: bool = True) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_path`).

    ``prefix`` of the temporary name as in :func:`atomic_path`. With ``fsync`` the data
    reaches the disk before the rename, so a power cut cannot leave an empty file under the
    final name.
    """
    with atomic_path(path, prefix=prefix, fsync=False) as tmp_path:
        with open(tmp_path, "w", encoding="utf-8") as f:
            f.write(text)
            if fsync:
                f.flush()
                os.fsync(f.fileno())


@contextmanager
def folder_lock(folder: Path | str, waiting: str | None = None) -> Iterator[None]:
    """An exclusive ``flock`` on ``folder`` itself for the block: no lock file is left behind
    and the lock goes with the process (a killed holder releases it). ``folder`` must exist.
    If another process holds it and ``waiting`` is given, ``waiting`` is printed once before
    this one blocks (a second notebook preparing the data set the first one is making).
    A lock is per open of the folder: do not nest two locks on one folder in one process."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting:
                print(waiting, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def require_writable_dir(folder: Path | str) -> Path:
    """``folder``, created if missing, after proving that a file can be made in it (one
    :func:`create_temp`, removed at once): the check before long work whose first write comes
    late (a full scan, a benchmark, an epoch). Raises ``OSError`` (``PermissionError`` for a
    read-only folder) whose one-line message names the folder."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        create_temp(folder, ".write-probe-").unlink()
    except OSError as e:
        raise OSError(e.errno, f"cannot write in {folder}: {e.strerror or e}") from None
    return folder


def fsync_dir(path: Path | str) -> None:
    """Flush folder ``path``'s entries to disk (after a rename into it), if the platform
    lets a folder be opened; errors are ignored (best effort)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def json_safe(obj: Any) -> Any:
    """NaN/inf -> None, numpy scalars and arrays -> Python, paths -> str, recursively (strict
    JSON). A dataclass instance becomes its ``as_dict()`` when it has one (the bench
    results: their fields and derived figures), else :func:`dataclasses.asdict`. Anything
    else that converts with ``float()`` (a 0-d array, a scalar tensor) becomes a float; the
    rest is returned as it is."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        as_dict = getattr(obj, "as_dict", None)
        return json_safe(as_dict() if callable(as_dict) else dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.ndarray) and obj.ndim > 0:
        return json_safe(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, (np.integer, int)):
        return int(obj)
    if isinstance(obj, Path):
        return str(obj)
    if obj is not None and not isinstance(obj, str) and hasattr(obj, "__float__"):
        try:
            return json_safe(float(obj))
        except (TypeError, ValueError):
            return obj
    return obj


def write_json_atomic(path: Path | str, obj: Any, prefix: str | None = None,
                      indent: int = 2, inline_number_lists: bool = False,
                      sort_keys: bool = False) -> None:
    """Write ``obj`` as strict JSON (:func:`json_safe`: NaN as ``null``) atomically.

    ``inline_number_lists`` keeps lists of numbers on one line inside the indented text
    (manifests with per-shard label sums stay readable). ``prefix`` as in
    :func:`write_text_atomic`.
    """
    text = json.dumps(json_safe(obj), indent=indent, allow_nan=False, sort_keys=sort_keys)
    if inline_number_lists:
        text = _NUMBER_LIST.sub(
            lambda m: "[" + ", ".join(m.group(1).replace(",", " ").split()) + "]", text)
    write_text_atomic(path, text + "\n", prefix=prefix)


def make_private(folder: Path | str) -> None:
    """Only the owner may read what is in ``folder``: the folder and its subfolders 0700,
    every file 0600 (connection files with keys, state of a local cluster)."""
    os.chmod(folder, 0o700)
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o700)
        for name in files:
            os.chmod(os.path.join(root, name), 0o600)
