"""Notebook 10's scaffolding without a job: the ``horovodrun`` command lines, the event lines
read back, what a kill cost, the graceful-removal verdict and the script taken from the
notebook's ``%%writefile`` cells (the jobs themselves: tests/mpi/test_elastic.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chexnet_utils.cluster.elastic import (
    HorovodJob,
    Kill,
    images_redone,
    kill_outcome,
    local_host_names,
    progress_line,
)
from chexnet_utils.notebook.cells import written_file
from chexnet_utils.notebook.exercises.elastic import graceful_removal_problems

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "10_appendix_elastic.ipynb"


def ev(event: str, t: float, epoch: int = 0, images: int = 0, size: int = 2, **kw) -> dict:
    return {"event": event, "t": t, "epoch": epoch, "images": images, "size": size,
            "rank": 0, "host": "localhost", "pid": 1, **kw}


def test_elastic_and_static_command_lines(tmp_path: Path):
    script = tmp_path / "train.py"
    elastic = HorovodJob(script, {"a": 1}, ["localhost", "127.0.0.1"], tmp_path,
                         cooldown=(1, 2), gloo_timeout_s=7).command()
    assert elastic[elastic.index("-np") + 1] == "2"
    assert elastic[elastic.index("--max-np") + 1] == "3"
    assert elastic[elastic.index("--host-discovery-script") + 1].endswith("discover_hosts.sh")
    assert elastic[elastic.index("--blacklist-cooldown-range") + 1:][:2] == ["1", "2"]
    assert elastic[elastic.index("--gloo-timeout-seconds") + 1] == "7"
    assert elastic[elastic.index("--network-interface") + 1] == "lo"
    config = json.loads(elastic[-1])
    assert config["a"] == 1 and config["events"].endswith("events.jsonl")
    static = HorovodJob(script, {}, ["localhost", "127.0.0.1"], tmp_path, elastic=False).command()
    assert "--gloo" in static and static[static.index("-H") + 1] == "localhost:1,127.0.0.1:1"
    assert "--host-discovery-script" not in static


def test_a_job_refuses_no_hosts_and_a_missing_script(tmp_path: Path):
    with pytest.raises(ValueError, match="at least one host"):
        HorovodJob(tmp_path / "x.py", {}, [], tmp_path)
    with pytest.raises(FileNotFoundError, match="no training script"):
        HorovodJob(tmp_path / "x.py", {}, ["localhost"], tmp_path).start()


def test_hosts_file_round_trip(tmp_path: Path):
    job = HorovodJob(tmp_path / "x.py", {}, ["localhost"], tmp_path)
    job.set_hosts(["localhost", "127.0.0.1"])
    assert (tmp_path / "hosts.txt").read_text() == "localhost:1\n127.0.0.1:1\n"
    assert job.hosts_now() == ["localhost", "127.0.0.1"]


def test_local_host_names_resolve_here(monkeypatch: pytest.MonkeyPatch):
    names = local_host_names(2)
    assert names[:2] == ["localhost", "127.0.0.1"]
    # Debian's /etc/hosts maps the host name to 127.0.1.1, no interface's: left out
    monkeypatch.setattr("socket.gethostname", lambda: "127.0.1.1")
    assert "127.0.1.1" not in local_host_names(2)
    with pytest.raises(ValueError, match="are needed"):
        local_host_names(99)


def test_images_redone_within_and_across_epochs():
    at = ev("step", 0, epoch=1, images=96)
    assert images_redone(at, ev("start", 0, epoch=1, images=64), 400) == 32
    assert images_redone(at, ev("start", 0, epoch=1, images=96), 400) == 0
    assert images_redone(ev("step", 0, epoch=1, images=384), ev("start", 0, epoch=2), 400) == 0
    assert images_redone(at, ev("start", 0, epoch=0, images=300), 400) == 100 + 96


def test_kill_outcome_reads_lost_images_and_recovery():
    events = [ev("start", 0.0), ev("step", 1.0, epoch=1, images=64),
              ev("step", 2.0, epoch=1, images=96), ev("start", 5.0, epoch=1, images=64, size=1),
              ev("step", 6.5, epoch=1, images=80, size=1)]
    out = kill_outcome(events, Kill("127.0.0.1", 9, 2.5), n_train=400)
    assert (out.lost_images, out.size_before, out.size_after) == (32, 2, 1)
    assert out.recovery_s == pytest.approx(4.0)
    with pytest.raises(ValueError, match="no start"):
        kill_outcome(events[:3], Kill("x", 9, 2.5), 400)
    # rank 0 may log a step after the kill, before its allreduce fails: trained, then lost
    late = [*events[:3], ev("step", 3.0, epoch=1, images=128), *events[3:]]
    assert kill_outcome(late, Kill("127.0.0.1", 9, 2.5), n_train=400).lost_images == 64


def test_progress_line_says_when_what_and_the_size():
    line = progress_line(ev("start", 12.5, epoch=1, images=64, size=1, rank=0), t0=10.0)
    assert "2.5 s" in line and "size 1" in line and "64 images" in line and "start on" in line


def test_graceful_removal_verdicts():
    good = [ev("start", 0.0, size=2), ev("step", 1.0, images=64),
            ev("start", 3.0, images=64, size=1), ev("done", 9.0, epoch=2)]
    assert graceful_removal_problems(good, 2.0, 0, 2, told_to_leave=True) == []
    rolled = [*good[:2], ev("start", 3.0, images=32, size=1), good[3]]
    problems = graceful_removal_problems(rolled, 2.0, 0, 2, told_to_leave=False)
    assert any("killed" in p for p in problems) and any("twice" in p for p in problems)
    assert "never re-formed" in graceful_removal_problems(good[:2], 2.0, 0, 2, True)[0]
    unfinished = graceful_removal_problems(good[:3], 2.0, 1, 2, True)
    assert any("did not finish" in p for p in unfinished) and any("status 1" in p
                                                                  for p in unfinished)


def test_the_script_is_the_notebooks_writefile_cells():
    script = written_file(NOTEBOOK, "{SCRIPT}")
    compile(script, "elastic_chexnet.py", "exec")
    assert script.count("\n@hvd.elastic.run\n") == 1 and "class Keras3State" in script
    with pytest.raises(ValueError, match="no %%writefile cell"):
        written_file(NOTEBOOK, "{OTHER}")


def test_job_events_read_what_was_appended_and_skip_broken_or_unfinished_lines(tmp_path: Path):
    job = HorovodJob(tmp_path / "x.py", {}, ["localhost"], tmp_path)
    assert job.events() == []  # no file yet
    with open(job.events_path, "w") as f:
        f.write(json.dumps(ev("start", 1.0)) + "\n" + "not json\n" + '{"event": "st')
    assert [e["event"] for e in job.events()] == ["start"]
    with open(job.events_path, "a") as f:
        f.write('ep", "t": 2.0}\n')
    assert [e["event"] for e in job.events()] == ["start", "step"]
    assert [e["event"] for e in job.events("step")] == ["step"]
