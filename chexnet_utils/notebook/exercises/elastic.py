"""Notebook 10's exercise check: a worker taken out of an elastic job gracefully.

:func:`check_graceful_removal` starts a short elastic job (the notebook's own script, two
hosts, two epochs), calls the learner's ``remove_gracefully(job, host)`` for the second host
after the first commit and judges by the job's events
(:func:`graceful_removal_problems`): the ring re-formed smaller, nothing was trained twice, the
survivor finished every epoch, ``horovodrun`` ended with status 0, and Horovod told the
worker to leave (a kill, by contrast, blacklists its host).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from chexnet_utils.cluster.elastic import Event, HorovodJob, JobFailed, images_redone
from chexnet_utils.notebook.exercises.verdict import missing, verdict

EPOCHS = 2
"""Epochs of the exercise's job (the removal happens in the first)."""


REMOVED_NOTICE = "has been removed from elastic job"
"""What Horovod's worker prints when the driver tells it that its host left the job (and
not when it fails)."""


def graceful_removal_problems(events: Sequence[Event], asked_t: float, exit_status: int,
                              epochs: int, told_to_leave: bool) -> list[str]:
    """What went wrong when a host was taken out at ``asked_t`` (``time.time()``), read from
    the job's events and whether Horovod told its worker to leave (:data:`REMOVED_NOTICE` in
    the job's output); ``[]`` when it was graceful."""
    before = [e for e in events if e["event"] == "start" and e["t"] < asked_t]
    after = [e for e in events if e["event"] == "start" and e["t"] > asked_t]
    if not after:
        return ["the ring never re-formed after your call: the driver learns about hosts only "
                "from the discovery script (job.set_hosts)"]
    problems = []
    if not told_to_leave:
        problems.append("the worker was not told to leave: it was killed or failed (its host "
                        "is now blacklisted); take its host out of the discovery script first")
    if before and after[0]["size"] >= before[-1]["size"]:
        problems.append(f"the job still had {after[0]['size']} workers after your call")
    steps = [e for e in events if e["event"] == "step" and e["t"] < after[0]["t"]]
    if steps and images_redone(steps[-1], after[0], n_train=1) > 0:
        problems.append("training went back to an earlier commit (work trained twice)")
    done = [e for e in events if e["event"] == "done"]
    if not done or any(e["epoch"] != epochs for e in done):
        problems.append(f"the job did not finish its {epochs} epochs")
    if exit_status != 0:
        problems.append(f"horovodrun ended with status {exit_status}")
    return problems


def check_graceful_removal(answer: Callable[[HorovodJob, str], Any] | None,
                           script: Path | str, config: dict[str, Any], hosts: Sequence[str],
                           workdir: Path | str, timeout: float = 900) -> bool:
    """10 exercise 1: run ``answer(job, host)`` on a short elastic job of ``script`` on two
    ``hosts`` (for the second one, after the first commit) and judge the removal by
    the events."""
    if missing(answer, "a function (job, host) that changes what the discovery script "
                       "reports, before anything happens to the worker"):
        return False
    config = {**config, "epochs": EPOCHS}
    with HorovodJob(script, config, list(hosts)[:2], workdir) as job:
        try:
            job.wait_for(lambda e: e["event"] == "commit" and e["epoch"] == 0, timeout,
                         "a first commit")
            asked_t = time.time()
            answer(job, hosts[1])
            status = job.wait(timeout)
        except JobFailed as e:
            return verdict(False, "", f"the job failed: {e}")
        except Exception as e:  # the learner's function raised: say what, never raise
            return verdict(False, "", f"your function raised {type(e).__name__}: {e}")
        events = job.events()
        told = REMOVED_NOTICE in job.output_path.read_text(errors="replace")
    problems = graceful_removal_problems(events, asked_t, status, EPOCHS, told)
    return verdict(not problems, "the ring shrank at the next commit with nothing rolled "
                   "back, and the survivor finished the job.", " | ".join(problems))
