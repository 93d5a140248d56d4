"""Shared-memory segments left by ranks killed with SIGKILL are found and removed; segments
some process still holds, and older ones, are left alone."""

import mmap
import os
import time

from chexnet_utils.platform.processes import orphan_shm_segments, remove_orphan_shm_segments


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


def test_other_accounts_segments_are_never_orphans(tmp_path, monkeypatch):
    """Another account's processes cannot be looked into, so its live segments look unheld:
    they are skipped by owner, whoever we are (as root they were deleted; as a normal user
    the unlink raised PermissionError out of MPICluster.stop())."""
    theirs = tmp_path / "vader_segment.host.5.0"
    theirs.write_bytes(b"x" * 64)
    me = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: me + 1)  # the files now belong to "someone else"
    assert orphan_shm_segments(shm_dir=str(tmp_path)) == []
    assert remove_orphan_shm_segments(shm_dir=str(tmp_path)) == []
    assert theirs.exists()


def test_a_segment_that_cannot_be_removed_is_left_without_an_error(tmp_path, monkeypatch):
    """``remove_orphan_shm_segments`` never raises (it runs inside MPICluster.stop())."""
    seg = tmp_path / "vader_segment.host.7.0"
    seg.write_bytes(b"x" * 64)

    def refuse(path, *args, **kwargs):
        raise PermissionError(1, "Operation not permitted", str(path))

    monkeypatch.setattr(os, "unlink", refuse)
    assert remove_orphan_shm_segments(shm_dir=str(tmp_path)) == []
    monkeypatch.undo()
    assert seg.exists()
