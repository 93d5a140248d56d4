"""Crash-safe file writes: a reader sees the old file or the new one, never half of one.

Conversions, checkpoints and manifests here run for hours on real data and may be killed at
any moment; every small state file is therefore written to a temporary name in the same
folder, flushed to disk, and renamed over the target (``os.replace`` is atomic on POSIX).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

_NUMBER_LIST = re.compile(r"\[\s*(-?[0-9.eE+-]+(?:,\s*-?[0-9.eE+-]+)*)\s*\]")


def write_text_atomic(path: Path | str, text: str, tmp: Path | str | None = None,
                      fsync: bool = True) -> None:
    """Write ``text`` to ``path`` atomically.

    ``tmp`` is the temporary file (default ``.<name>.<pid>.tmp`` next to ``path``; it must be
    on the same file system). With ``fsync`` the data reaches the disk before the rename, so
    a power cut cannot leave an empty file under the final name.
    """
    path = Path(path)
    tmp_path = Path(tmp) if tmp is not None else path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp_path, "w", encoding="utf-8") as f:
            f.write(text)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def json_safe(obj: Any) -> Any:
    """NaN/inf -> None, numpy scalars -> Python, paths -> str, recursively (strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, Path):
        return str(obj)
    return obj


def write_json_atomic(path: Path | str, obj: Any, tmp: Path | str | None = None,
                      indent: int = 2, inline_number_lists: bool = False) -> None:
    """Write ``obj`` as strict JSON (:func:`json_safe`: NaN as ``null``) atomically.

    ``inline_number_lists`` keeps lists of numbers on one line inside the indented text
    (manifests with per-shard label sums stay readable). ``tmp`` as in
    :func:`write_text_atomic`.
    """
    text = json.dumps(json_safe(obj), indent=indent, allow_nan=False)
    if inline_number_lists:
        text = _NUMBER_LIST.sub(
            lambda m: "[" + ", ".join(m.group(1).replace(",", " ").split()) + "]", text)
    write_text_atomic(path, text + "\n", tmp=tmp)


def make_private(folder: Path | str) -> None:
    """Only the owner may read what is in ``folder``: the folder and its subfolders 0700,
    every file 0600 (connection files with keys, state of a local cluster)."""
    os.chmod(folder, 0o700)
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o700)
        for name in files:
            os.chmod(os.path.join(root, name), 0o600)
