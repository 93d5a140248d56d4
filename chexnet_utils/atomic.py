"""Crash-safe file writes: a reader sees the old file or the new one, never half of one.

Conversions, checkpoints and manifests here run for hours on real data and may be killed at
any moment; every small state file is therefore written to a temporary name in the same
folder, flushed to disk, and renamed over the target (``os.replace`` is atomic on POSIX).
"""

from __future__ import annotations

import os
from pathlib import Path


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
