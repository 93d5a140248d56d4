import os

import pytest

from chexnet_utils.atomic import write_text_atomic


def test_replaces_whole_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "state.json"
    target.write_text("old")
    write_text_atomic(target, "new contents")
    assert target.read_text() == "new contents"
    assert os.listdir(tmp_path) == ["state.json"]


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "manifest.json"
    target.write_text("old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_text_atomic(target, "new", tmp=tmp_path / "manifest.json.tmp-1")
    assert target.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["manifest.json"]
