"""Elastic Horovod on this machine: ``horovodrun`` jobs a notebook starts, watches, hurts and ends.

Notebook 10 writes the training script itself (its lesson: the state, the commit, the reset
callback, the ``@hvd.elastic.run`` function); this module is the scaffolding around it:

- :func:`local_host_names`: names that are each a "host" to Horovod yet all this machine.
  Horovod's launcher starts a worker without ``ssh`` when its host name resolves to an address
  of this machine (``horovod/runner/gloo_run.py``, ``_exec_command``, v0.28.1) and tells hosts
  apart by name, so ``localhost``, ``127.0.0.1``, the machine's own name (where it resolves to
  an interface's address) and the machine's other addresses are distinct hosts; a failed
  worker blacklists its *host* (``horovod/runner/elastic/discovery.py``), so one name per
  worker keeps the others usable.
- :class:`HorovodJob`: one ``horovodrun`` job, **elastic** (``--host-discovery-script`` over a
  hosts file the notebook edits: a host taken away, one added) or **static** (``-H``: the
  checkpoint-restart baseline, where one dead worker ends the job); the workers' event lines
  read back; a worker SIGKILLed by host name. Everything a job starts is stopped when it ends,
  also when ``horovodrun`` itself is SIGKILLed: the job's watchdog
  (:func:`~chexnet_utils.platform.processes.start_watchdog`) watches ``horovodrun`` and stops
  whatever carries the job's token (the workers inherit it through their environment).
- :func:`kill_outcome`: what a kill cost, read from the events: images trained twice and the
  seconds from the kill to the next step.

**The event lines** (one JSON object per line in ``events.jsonl``, written by the script):
every line has ``event``, ``t`` (``time.time()``), ``rank``, ``size``, ``pid`` and ``host``;
``start`` (every rank, at each (re)start of the training function, after the state's sync
if there was one: ``epoch``, ``images``, ``digest``), ``step`` (rank 0, after each step:
``epoch``, ``images``, ``loss``), ``commit`` (rank 0, just before each ``state.commit()``,
whose save is what a rollback returns to: ``epoch``, ``images``, ``digest``), ``done`` (every
rank: ``epoch``, ``digest``, ``auroc`` on rank 0). ``images`` counts the images of the current
epoch trained so far by all ranks together.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from horovod.runner.util.network import get_local_host_addresses, resolve_host_address

from chexnet_utils.platform.atomic import write_text_atomic
from chexnet_utils.platform.processes import (
    LIFELINE_ENV,
    descendants,
    lifeline_tokens,
    marked_processes,
    pid_alive,
    release_watchdog,
    start_watchdog,
    stop_marked,
    stop_processes,
)

Event = dict[str, Any]


class JobFailed(RuntimeError):
    """The job ended (or never got) where it was expected to go; the message ends with the
    tail of ``horovodrun``'s output."""


def local_host_names(n: int = 3) -> list[str]:
    """``n`` names Horovod treats as distinct hosts, each resolving to an address of this
    machine (so its workers start here, without ``ssh``): ``localhost``, ``127.0.0.1``, the
    machine's name (Debian's ``/etc/hosts`` maps it to 127.0.1.1, no interface's address: then
    it is left out), then this machine's other IPv4 addresses. ``ValueError`` if fewer than
    ``n`` are found."""
    local = get_local_host_addresses()
    candidates = ["localhost", "127.0.0.1", socket.gethostname(),
                  *sorted(a for a in local if a != "127.0.0.1")]
    names = [h for h in dict.fromkeys(candidates) if resolve_host_address(h) in local]
    if len(names) < n:
        raise ValueError(f"only {len(names)} local host name(s) resolve here ({names}); "
                         f"{n} are needed")
    return names[:n]


@dataclass(frozen=True)
class Kill:
    """A worker killed on purpose: its host, its pid and when (``time.time()``)."""

    host: str
    pid: int
    t: float


class HorovodJob:
    """One ``horovodrun`` job on this machine, one worker slot per host name.

    ``script`` is run as ``python SCRIPT CONFIG_JSON`` on every worker, with ``config`` plus
    ``events`` and ``checkpoint`` (two paths in ``workdir``) and ``resume``. ``elastic=True``
    launches with a host-discovery script that prints the hosts file (:meth:`set_hosts` edits
    it), ``--min-np min_np`` and ``--max-np`` (default: the number of hosts given, plus one);
    ``elastic=False`` launches a static Gloo job on ``hosts``. A host whose worker failed is
    blacklisted for the rest of an elastic job, unless ``cooldown=(low, high)`` (seconds,
    ``--blacklist-cooldown-range``) lets it back after a while. ``gloo_timeout_s``
    (``--gloo-timeout-seconds``, Horovod's default 30) bounds how long a survivor may wait for
    a dead worker's data before it notices (with three workers one survivor did). ``resume=False``
    empties ``workdir`` first; ``resume=True`` keeps its checkpoint and events: a restarted
    job. Use as a context manager (or :meth:`start` and :meth:`stop`): leaving it stops every
    process it started.
    """

    def __init__(self, script: Path | str, config: dict[str, Any], hosts: Sequence[str],
                 workdir: Path | str, *, elastic: bool = True, min_np: int = 1,
                 max_np: int | None = None, resume: bool = False,
                 cooldown: tuple[int, int] | None = None, gloo_timeout_s: int | None = None,
                 network_interface: str = "lo") -> None:
        if not hosts:
            raise ValueError("a job needs at least one host")
        self.script = Path(script)
        self.workdir = Path(workdir)
        self.elastic = elastic
        self.hosts = list(hosts)
        self.min_np = min_np
        self.max_np = max_np if max_np is not None else len(self.hosts) + 1
        self.resume = resume
        self.cooldown = cooldown
        self.gloo_timeout_s = gloo_timeout_s
        self.network_interface = network_interface
        self.config = {**config, "events": str(self.events_path), "resume": resume,
                       "checkpoint": str(self.workdir / "checkpoint.npz")}
        self.token = f"hvdjob-{secrets.token_hex(8)}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._watchdogs: list[subprocess.Popen[bytes] | None] = []
        self._seen = 0
        self._read: tuple[int, list[Event]] = (0, [])  # bytes parsed, their events

    # -- paths and command -------------------------------------------------------------------
    @property
    def events_path(self) -> Path:
        return self.workdir / "events.jsonl"

    @property
    def hosts_path(self) -> Path:
        return self.workdir / "hosts.txt"

    @property
    def output_path(self) -> Path:
        """``horovodrun``'s output and the workers' (TensorFlow's start-up lines and all)."""
        return self.workdir / "horovodrun.log"

    def command(self) -> list[str]:
        """The ``horovodrun`` command line this job runs."""
        launcher = [sys.executable, "-c",
                    "from horovod.runner.launch import run_commandline; run_commandline()"]
        if self.elastic:
            where = ["-np", str(len(self.hosts)), "--min-np", str(self.min_np),
                     "--max-np", str(self.max_np),
                     "--host-discovery-script", str(self.workdir / "discover_hosts.sh")]
            if self.cooldown:
                where += ["--blacklist-cooldown-range", *map(str, self.cooldown)]
        else:
            where = ["--gloo", "-np", str(len(self.hosts)),
                     "-H", ",".join(f"{h}:1" for h in self.hosts)]
        if self.gloo_timeout_s is not None:
            where += ["--gloo-timeout-seconds", str(self.gloo_timeout_s)]
        return [*launcher, *where, "--network-interface", self.network_interface,
                sys.executable, str(self.script.resolve()), json.dumps(self.config)]

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> HorovodJob:
        """Write the hosts file and the discovery script, start ``horovodrun`` and its
        watchdog."""
        if self.proc is not None:
            raise RuntimeError("this job was started already")
        if not self.script.is_file():
            raise FileNotFoundError(f"no training script at {self.script}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.resume:
            for name in ("events.jsonl", "checkpoint.npz", "horovodrun.log"):
                (self.workdir / name).unlink(missing_ok=True)
        self._seen = len(self.events())  # a resumed job reports only its own lines
        self.set_hosts(self.hosts)
        discover = self.workdir / "discover_hosts.sh"
        write_text_atomic(discover, f"#!/bin/sh\nexec cat {shlex.quote(str(self.hosts_path))}\n")
        discover.chmod(0o700)
        env = {**os.environ, LIFELINE_ENV: ",".join([*lifeline_tokens(), self.token]),
               "PYTHONUNBUFFERED": "1"}
        with open(self.output_path, "ab") as out:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env,
                                         cwd=self.workdir, start_new_session=True)
        try:
            # one watchdog for horovodrun's death (a SIGKILLed driver leaves no worker
            # behind), one for this process's (a killed kernel leaves no job behind)
            self._watchdogs = [start_watchdog(self.proc.pid, self.token),
                               start_watchdog(os.getpid(), self.token)]
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, grace: float = 5.0) -> list[int]:
        """Stop ``horovodrun`` (SIGTERM: it ends its workers) and whatever still carries the
        job's token; returns the pids still alive after that (``[]``)."""
        left: list[int] = []
        if self.proc is not None:
            running = self.proc.poll() is None  # a reaped pid may be somebody else's now
            stop_processes([self.proc, *(descendants(self.proc.pid) if running else [])], grace)
            stop_marked(self.token, grace=grace)
            for dog in self._watchdogs:
                release_watchdog(dog)
            self._watchdogs = []
            left = self.pids()
        return left

    def __enter__(self) -> HorovodJob:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def pids(self) -> list[int]:
        """The job's live processes: ``horovodrun``, its workers, anything with its token."""
        found = set(marked_processes(self.token))
        if self.proc is not None and self.proc.poll() is None:
            found |= {self.proc.pid, *descendants(self.proc.pid)}
        return sorted(found)

    # -- what the notebook does to a running job -------------------------------------------------
    def set_hosts(self, hosts: Iterable[str]) -> None:
        """What the discovery script reports from now on: one slot per host name."""
        self.hosts_path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.hosts_path, "".join(f"{h}:1\n" for h in hosts))

    def hosts_now(self) -> list[str]:
        """The host names the discovery script reports now."""
        return [line.rsplit(":", 1)[0] for line in self.hosts_path.read_text().split()]

    def host_of_rank(self, rank: int) -> str:
        """The host of the live worker whose latest ``start`` gave it ``rank``."""
        live = [e for e in self.events("start") if pid_alive(e["pid"])]
        hosts = {e["pid"]: e for e in live}  # each worker's latest start
        found = [e["host"] for e in hosts.values() if e["rank"] == rank]
        if len(found) != 1:
            raise JobFailed(f"{len(found)} live workers have rank {rank}" + self._tail())
        return str(found[0])

    def kill_worker(self, host: str) -> Kill:
        """SIGKILL the live worker on ``host`` (its pid from its latest ``start`` line)."""
        starts = [e for e in self.events("start") if e["host"] == host and pid_alive(e["pid"])]
        if not starts:
            raise JobFailed(f"no live worker on host {host!r}" + self._tail())
        pid = starts[-1]["pid"]
        os.kill(pid, signal.SIGKILL)
        return Kill(host, pid, time.time())

    # -- reading it ----------------------------------------------------------------------------
    def events(self, event: str | None = None) -> list[Event]:
        """The event lines so far (complete lines only), or those of one kind. Reads only what
        was appended since the last call."""
        offset, parsed = self._read
        try:
            with open(self.events_path, "rb") as f:
                f.seek(offset)
                new = f.read()
        except FileNotFoundError:
            new = b""
        complete = new[:new.rfind(b"\n") + 1]
        parsed = parsed + parse_events(complete.decode(errors="replace"))
        self._read = (offset + len(complete), parsed)
        return [e for e in parsed if event is None or e["event"] == event]

    def wait_for(self, predicate: Callable[[Event], bool], timeout: float, what: str,
                 progress: Callable[[str], None] | None = None) -> Event:
        """The first event (in order, from the start) for which ``predicate`` holds, waiting up
        to ``timeout`` s; ``progress`` gets a line per new ``start``, ``commit`` and ``done``.
        ``JobFailed`` if the job ends first or the time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            events = self.events()
            self._report(events, progress)
            hit = next((e for e in events if predicate(e)), None)
            if hit is not None:
                return hit
            if self.proc is None or self.proc.poll() is not None:
                status = None if self.proc is None else self.proc.returncode
                raise JobFailed(f"the job ended (status {status}) before {what}" + self._tail())
            if time.monotonic() > deadline:
                raise JobFailed(f"no {what} within {timeout:.0f} s" + self._tail())
            time.sleep(0.1)

    def wait(self, timeout: float, progress: Callable[[str], None] | None = None) -> int:
        """``horovodrun``'s exit status, waiting up to ``timeout`` s (``JobFailed`` after);
        ``progress`` as in :meth:`wait_for`."""
        assert self.proc is not None, "start the job first"
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._report(self.events(), progress)
            time.sleep(0.1)
        try:
            status = self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise JobFailed(f"the job did not end within {timeout:.0f} s" + self._tail()) from None
        self._report(self.events(), progress)
        return status

    def _report(self, events: list[Event], progress: Callable[[str], None] | None) -> None:
        """Hand ``progress`` a line per ``start``, ``commit`` and ``done`` not reported yet."""
        if progress is not None:
            for e in events[self._seen:]:
                if e["event"] in ("start", "commit", "done"):
                    progress(progress_line(e, events[0]["t"]))
        self._seen = max(self._seen, len(events))

    def _tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            text = self.output_path.read_text(errors="replace").splitlines()[-lines:]
            return f"\n(last lines of {self.output_path}:)\n" + "\n".join(text)
        return ""


def parse_events(text: str) -> list[Event]:
    """The events of complete lines of JSON; a line that is not an object (a worker killed
    mid-write on a file system without atomic appends) is skipped."""
    events = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            e = json.loads(line)
            if isinstance(e, dict) and "event" in e:
                events.append(e)
    return events


def progress_line(e: Event, t0: float) -> str:
    """One line of a watched job: time since its first event, what happened, the world size."""
    what = {"start": f"start on {e['host']} (rank {e['rank']})",
            "commit": "commit", "done": f"done on {e['host']}"}[e["event"]]
    where = f"epoch {e['epoch']}" + (f", {e['images']} images" if "images" in e else "")
    return f"{e['t'] - t0:6.1f} s  size {e['size']}  {where:>22}  {what}"


@dataclass(frozen=True)
class KillOutcome:
    """What one kill cost a job (:func:`kill_outcome`)."""

    lost_images: int
    """Images trained on before the kill whose work was thrown away: the position at the kill
    minus the position training went on from (the last commit, or the last checkpoint)."""
    recovery_s: float
    """From the kill to the first step after it."""
    size_before: int
    size_after: int


def images_redone(at: Event, resumed: Event, n_train: int) -> int:
    """Images trained at position ``at`` (an event's ``epoch`` and ``images``) that are trained
    again when training goes on from ``resumed``: ``0`` when it goes on from there or later
    (an epoch's end commit counts as the next epoch's image 0). Across an epoch boundary the
    epoch is taken as ``n_train`` images (its last, partial batch is never trained: high by
    less than one global batch)."""
    if resumed["epoch"] > at["epoch"]:
        return 0
    if resumed["epoch"] == at["epoch"]:
        return max(0, at["images"] - resumed["images"])
    return ((at["epoch"] - resumed["epoch"] - 1) * n_train + n_train - resumed["images"]
            + at["images"])


def kill_outcome(events: Sequence[Event], kill: Kill, n_train: int) -> KillOutcome:
    """Read a kill's cost off a job's events (those of a restarted job appended): the images
    trained before training went on again (rank 0 may finish a step after the kill, before
    its allreduce fails) and trained again after it (:func:`images_redone`), the seconds from
    the kill to the first step after it."""
    resumed = [e for e in events if e["event"] == "start" and e["t"] > kill.t]
    if not resumed:
        raise ValueError("the events hold no start after the kill")
    restart = resumed[0]
    steps_before = [e for e in events if e["event"] == "step" and e["t"] < restart["t"]]
    if not steps_before:
        raise ValueError("the events hold no step before the kill")
    at_kill = steps_before[-1]
    next_step = next((e for e in events if e["event"] == "step" and e["t"] > restart["t"]),
                     None)
    if next_step is None:
        raise ValueError("no step after the kill")
    return KillOutcome(images_redone(at_kill, restart, n_train), next_step["t"] - kill.t,
                       at_kill["size"], restart["size"])
