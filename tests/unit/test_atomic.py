import os

import pytest

from chexnet_utils.platform.atomic import write_text_atomic


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
        write_text_atomic(target, "new", prefix="manifest.json.tmp-")
    assert target.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["manifest.json"]


def test_atomic_path_renames_on_success_and_removes_on_error(tmp_path):
    from chexnet_utils.platform.atomic import atomic_path

    target = tmp_path / "image.png"
    target.write_bytes(b"old")
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.exists()  # created (O_EXCL) before the block
        assert tmp.name.startswith(".image.png.") and not tmp.name.endswith(".png")
        tmp.write_bytes(b"new")
        assert target.read_bytes() == b"old"  # nothing visible before the block ends
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["image.png"]

    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target, suffix=".keras") as tmp:
            assert tmp.name.endswith(".keras")
            tmp.write_bytes(b"half")
            raise KeyboardInterrupt
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["image.png"]


def test_atomic_path_flushes_what_the_block_wrote_before_the_rename(tmp_path, monkeypatch):
    """A writer that names its own file (PIL, Keras) gets it fsynced too: after a power cut
    the final name never holds an empty file."""
    from chexnet_utils.platform import atomic

    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace",
                        lambda a, b: (events.append("replace"), real_replace(a, b))[1])
    with atomic.atomic_path(tmp_path / "fig.png") as tmp:
        tmp.write_bytes(b"png")
    assert events == ["fsync", "replace"]


def test_temporary_names_are_new_files_never_an_existing_name_or_link(tmp_path, monkeypatch):
    """``O_EXCL`` under a random name: a file or a symbolic link planted under the name that
    comes up is skipped, never opened, truncated or followed."""
    from chexnet_utils.platform import atomic

    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / ".out.json.aaaa.tmp").symlink_to(victim)
    names = iter(["aaaa", "bbbb"])
    monkeypatch.setattr(atomic.secrets, "token_hex", lambda n: next(names))
    atomic.write_text_atomic(tmp_path / "out.json", "{}")
    assert victim.read_text() == "keep" and (tmp_path / ".out.json.aaaa.tmp").is_symlink()
    assert (tmp_path / "out.json").read_text() == "{}"
    mode = (tmp_path / "out.json").stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask  # an ordinary new file's permissions, not mkstemp's 0600


def test_write_text_atomic_replaces_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "notes.txt"
    write_text_atomic(target, "first\n")
    assert target.read_text() == "first\n"
    write_text_atomic(target, "second é\n", fsync=False)
    assert target.read_text(encoding="utf-8") == "second é\n"
    assert os.listdir(tmp_path) == ["notes.txt"]


def test_fsync_dir_is_best_effort(tmp_path):
    from chexnet_utils.platform.atomic import fsync_dir

    fsync_dir(tmp_path)
    fsync_dir(tmp_path / "missing")  # no error


def test_json_writes_are_strict(tmp_path):
    import json
    import math

    import numpy as np

    from chexnet_utils.platform.atomic import json_safe, write_json_atomic

    assert json_safe({"a": np.float32(1.5), "b": math.nan, "c": np.array([1, 2]),
                      "d": np.bool_(True), "e": np.array(2.5), "f": (np.int64(3),)}) == {
        "a": 1.5, "b": None, "c": [1, 2], "d": True, "e": 2.5, "f": [3]}
    target = tmp_path / "r.json"
    write_json_atomic(target, {"z": 1, "a": math.inf}, sort_keys=True)
    text = target.read_text()
    assert text.index('"a"') < text.index('"z"') and "Infinity" not in text
    assert json.loads(text) == {"a": None, "z": 1}


def test_json_safe_writes_a_dataclass_result_as_its_dict():
    """A bench result is a dataclass: written as its ``as_dict()`` (derived figures
    included), int keys as strings; a dataclass without one as its fields."""
    import dataclasses
    import math

    from chexnet_utils.platform.atomic import json_safe

    @dataclasses.dataclass
    class Plain:
        x: float

    @dataclasses.dataclass
    class Result:
        rates: dict[int, float]
        inner: Plain

        @property
        def best(self) -> float:
            return max(self.rates.values())

        def as_dict(self) -> dict:
            return {**dataclasses.asdict(self), "best": self.best}

    r = Result({1: 2.0, 2: math.nan}, Plain(1.5))
    assert json_safe(r) == {"rates": {"1": 2.0, "2": None}, "inner": {"x": 1.5}, "best": 2.0}
    assert json_safe([Plain(3.0)]) == [{"x": 3.0}]
    assert json_safe(Plain) is Plain  # a class is not an instance


def test_results_record_writes_strict_json(monkeypatch, tmp_path):
    import json
    import math

    import numpy as np

    from chexnet_utils.notebook import results

    monkeypatch.setenv("CHEXNET_WORK_DIR", str(tmp_path))
    results.record("02", {"ratio": math.nan, "rate": np.float64(2.0), "ok": np.bool_(True)})
    text = (tmp_path / "results.json").read_text()
    assert "NaN" not in text
    assert json.loads(text) == {"02": {"ratio": None, "rate": 2.0, "ok": True}}
    assert os.listdir(tmp_path) == ["results.json"]


def test_folder_lock_makes_a_second_process_wait_and_say_so(tmp_path):
    """Two processes preparing one folder take turns; the second says it waits; no lock
    file is left in the folder."""
    import subprocess
    import sys
    import time

    folder = tmp_path / "data"
    folder.mkdir()
    log = tmp_path / "order.txt"
    script = (
        "import sys, time\n"
        "from chexnet_utils.platform.atomic import folder_lock\n"
        "name, hold = sys.argv[1], float(sys.argv[2])\n"
        f"with folder_lock({str(folder)!r}, waiting=name + ' waits'):\n"
        f"    open({str(log)!r}, 'a').write(name + ' in\\n')\n"
        "    time.sleep(hold)\n"
        f"    open({str(log)!r}, 'a').write(name + ' out\\n')\n")
    first = subprocess.Popen([sys.executable, "-c", script, "first", "1.5"])
    deadline = time.monotonic() + 30
    while not (log.exists() and "first in" in log.read_text()):
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.05)
    second = subprocess.run([sys.executable, "-c", script, "second", "0"],
                            capture_output=True, text=True, timeout=60)
    assert first.wait(timeout=60) == 0 and second.returncode == 0, second.stderr
    assert second.stdout == "second waits\n"
    assert log.read_text().splitlines() == ["first in", "first out", "second in", "second out"]
    assert list(folder.iterdir()) == []


def test_folder_lock_is_released_when_its_holder_is_killed(tmp_path, capsys):
    import signal
    import subprocess
    import sys

    from chexnet_utils.platform.atomic import folder_lock

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from chexnet_utils.platform.atomic import folder_lock\n"
         f"with folder_lock({str(tmp_path)!r}):\n    print('held', flush=True)\n"
         "    time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        with folder_lock(tmp_path, waiting="waiting: the lock outlived its holder"):
            pass
        assert capsys.readouterr().out == ""
    finally:
        holder.kill()
        holder.wait()
