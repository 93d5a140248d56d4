"""Elastic Horovod on Keras 3 (issue 48): notebook 10's own training script under ``horovodrun``.

The script is taken from the notebook's ``%%writefile`` cells (so a change to the lesson is
what gets tested) and run on three local "hosts" (``local_host_names``): one job in which a
worker is SIGKILLed, its host comes back (a blacklist cooldown of 1-2 s) and another host is
then taken out gracefully; and one job whose driver (``horovodrun``) is SIGKILLed. What they
check: the survivors go on from the last commit with identical weights, at the smaller size;
the job ends with the epochs asked for; a worker that joins holds the others' weights from its
first sync to the end; a graceful removal rolls nothing back; nothing is left running.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from chexnet_utils.cluster.elastic import Event, HorovodJob, Kill, local_host_names
from chexnet_utils.notebook.cells import written_file
from chexnet_utils.notebook.exercises.elastic import graceful_removal_problems
from chexnet_utils.platform.processes import alive, wait_pids_gone

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "10_appendix_elastic.ipynb"
EPOCHS = 10  # room for the add: the survivors must not finish before the host is back
COMMIT_EVERY = 1


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("elastic") / "elastic_chexnet.py"
    path.write_text(written_file(NOTEBOOK, "{SCRIPT}"))
    return path


def config(tfrecords: Path) -> dict:
    return {"tfrecords": str(tfrecords), "image_size": 64, "arch": "small", "batch": 4,
            "epochs": EPOCHS, "lr": 1e-3, "commit_every": COMMIT_EVERY}


def after(t: float, event: str, host: str | None = None):
    return lambda e: e["event"] == event and e["t"] > t and host in (None, e["host"])


@dataclass
class Run:
    events: list[Event]
    hosts: list[str]
    kill: Kill
    leaving: str
    added_t: float
    removed_t: float
    status: int
    left: list[int]
    output: str

    def of(self, event: str, start: float = 0.0, end: float = float("inf")) -> list[Event]:
        return [e for e in self.events if e["event"] == event and start < e["t"] < end]


@pytest.fixture(scope="module")
def run(script: Path, hvd_tfrecords: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Three workers; the third killed in epoch 1 and its host dropped; the host back after
    its cooldown; then the second host taken out of the discovery script (graceful)."""
    h = local_host_names(3)
    work = tmp_path_factory.mktemp("elastic-run")
    # with three workers one survivor saw the closed connection at once, the other waited
    # for Gloo's timeout (30 s by default, measured): a shorter one keeps the test short
    with HorovodJob(script, config(hvd_tfrecords), h, work, cooldown=(1, 2),
                    gloo_timeout_s=20) as job:
        first = job.wait_for(lambda e: e["event"] == "commit" and e["epoch"] == 1, 300,
                             "a commit in epoch 1")
        job.wait_for(after(first["t"], "step"), 60, "a step after it")
        kill = job.kill_worker(job.host_of_rank(2))  # not rank 0: it logs the commits
        survivors = [x for x in h if x != kill.host]
        job.set_hosts(survivors)
        resync = job.wait_for(after(kill.t, "start"), 120, "the survivors' sync")
        job.wait_for(after(resync["t"], "commit"), 60, "a commit at size 2")
        # the host's cooldown (1-2 s) starts when the driver blacklists it, about when the
        # survivors start again; once it is over the driver takes the host back
        time.sleep(max(0.0, resync["t"] + 2.5 - time.time()))
        job.set_hosts(h)
        added_t = time.time()
        joined = job.wait_for(after(added_t, "start", kill.host), 180,
                              "the returning worker's sync")
        job.wait_for(after(joined["t"] + 1, "commit"), 120, "a commit at size 3")
        leaving = job.host_of_rank(1)
        job.set_hosts([x for x in h if x != leaving])
        removed_t = time.time()
        job.wait_for(after(removed_t, "start"), 120, "the sync after the removal")
        status = job.wait(600)
        events = job.events()
    return Run(events, h, kill, leaving, added_t, removed_t, status, job.pids(),
               job.output_path.read_text(errors="replace"))


def test_a_killed_worker_leaves_the_survivors_on_the_last_commit(run: Run):
    resync = run.of("start", run.kill.t, run.added_t)
    last_commit = run.of("commit", end=resync[0]["t"])[-1]  # logged before its save
    assert sorted(e["host"] for e in resync) == sorted(h for h in run.hosts if h != run.kill.host)
    assert {e["size"] for e in resync} == {2}
    # identical on both survivors, and equal to the committed state
    assert {(e["digest"], e["epoch"], e["images"]) for e in resync} == \
        {(last_commit["digest"], last_commit["epoch"], last_commit["images"])}
    # and training went on from there, one global batch of the new size per step
    steps = run.of("step", resync[0]["t"], run.added_t)
    assert steps and steps[0]["images"] == last_commit["images"] + 4 * 2


def test_the_job_ends_with_the_epochs_asked_for_and_identical_ranks(run: Run):
    done = run.of("done")
    assert run.status == 0
    assert sorted(e["host"] for e in done) == sorted(h for h in run.hosts if h != run.leaving)
    assert [e["epoch"] for e in done] == [EPOCHS, EPOCHS]
    assert len({e["digest"] for e in done}) == 1
    assert run.left == []


def test_a_worker_added_later_catches_up(run: Run):
    joined = run.of("start", run.added_t, run.removed_t)
    assert sorted(e["host"] for e in joined) == sorted(run.hosts)
    assert {e["size"] for e in joined} == {3}
    assert len({e["digest"] for e in joined}) == 1  # rank 0's weights, the newcomer's too
    steps = run.of("step", joined[0]["t"], run.removed_t)
    assert steps and steps[0]["size"] == 3


def test_a_graceful_removal_rolls_nothing_back_and_a_kill_is_no_removal(run: Run):
    assert graceful_removal_problems(run.events, run.removed_t, run.status, EPOCHS,
                                     told_to_leave=True) == []
    assert {e["size"] for e in run.of("start", run.removed_t)} == {2}
    assert "has been removed from elastic job" in run.output  # Horovod told the worker
    assert "exit with status code 137" in run.output  # the kill: SIGKILL, seen by the driver
    problems = graceful_removal_problems(run.events, run.kill.t, run.status, EPOCHS,
                                         told_to_leave=False)
    assert any("killed" in p for p in problems)


def test_a_killed_driver_leaves_no_worker(script: Path, hvd_tfrecords: Path, tmp_path: Path):
    h = local_host_names(2)
    with HorovodJob(script, {**config(hvd_tfrecords), "epochs": 50}, h, tmp_path) as job:
        job.wait_for(lambda e: e["event"] == "commit", 300, "a first commit")
        workers = sorted({e["pid"] for e in job.events("start")})
        assert alive(workers) == workers
        assert job.proc is not None
        os.kill(job.proc.pid, signal.SIGKILL)
        assert wait_pids_gone(workers, timeout=20) == []
        deadline = time.monotonic() + 20   # the watchdog's SIGTERM, then SIGKILL after 3 s
        while job.pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert job.pids() == []
