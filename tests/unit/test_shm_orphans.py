"""Shared-memory segments left by ranks killed with SIGKILL are found and removed; segments
some process still holds, and older ones, are left alone."""

import mmap
import os
import time

from chexnet_utils.processes import orphan_shm_segments, remove_orphan_shm_segments


def test_only_unheld_recent_segments_are_orphans(tmp_path):
    old = tmp_path / "vader_segment.host.1.0"
    old.write_bytes(b"x" * 64)
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    since = time.time() - 60
    orphan = tmp_path / "vader_segment.host.2.0"
    orphan.write_bytes(b"x" * 64)
    held_fd = tmp_path / "vader_segment.host.3.0"
    held_fd.write_bytes(b"x" * 64)
    mapped = tmp_path / "vader_segment.host.4.0"
    mapped.write_bytes(b"x" * mmap.PAGESIZE)
    other = tmp_path / "not_a_segment"
    other.write_bytes(b"x")
    with open(held_fd, "rb"), open(mapped, "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
        f.close()                      # only the mapping holds it now
        try:
            assert orphan_shm_segments(since, shm_dir=str(tmp_path)) == [str(orphan)]
            assert remove_orphan_shm_segments(since, shm_dir=str(tmp_path)) == [str(orphan)]
        finally:
            m.close()
    assert not orphan.exists()
    assert old.exists() and held_fd.exists() and mapped.exists() and other.exists()
    assert orphan_shm_segments(since, shm_dir=str(tmp_path / "missing")) == []
