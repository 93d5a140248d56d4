"""Shared by the kill tests: start a command, wait for a handshake, record its process tree,
send a signal, and check that nothing of the tree survives.

The tree is recorded as :class:`psutil.Process` objects (so a reused pid is not mistaken for
a survivor, and a process re-parented to init is still found), together with the command's
lifeline tokens: a process that carries them but was started after the recording (a pool
that was replacing a worker, say) counts as a survivor too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import psutil
import pytest

from chexnet_utils.platform.processes import (
    LIFELINE_ENV,
    WATCHDOG_MODULE,
    lifeline_tokens,
    marked_processes,
    wait_gone,
)

T = TypeVar("T")


class Command:
    """``python -m chexnet_utils ARGS`` (or another module) in its own session, output to a
    log file; killed with its whole session at :meth:`close` whatever a test did."""

    def __init__(self, args: Sequence[str], log: Path, *, module: str = "chexnet_utils",
                 env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.log = log
        self._out = open(log, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", module, *map(str, args)],
                                     stdout=self._out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     env={**os.environ, **(env or {})}, cwd=cwd)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        self._out.flush()
        return self.log.read_text(encoding="utf-8", errors="replace")

    def wait_for(self, predicate: Callable[[], T], what: str, timeout: float = 120.0) -> T:
        """Poll ``predicate`` until it is truthy (the handshake); fail with the output if
        the command ends first or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if self.proc.poll() is not None:
                pytest.fail(f"the command exited ({self.proc.returncode}) before {what}:\n"
                            + self.output()[-3000:])
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {timeout:.0f} s:\n" + self.output()[-3000:])
            time.sleep(0.05)

    def descendants(self, match: str = "") -> list[psutil.Process]:
        """Live processes below the command whose command line contains ``match``."""
        try:
            kids = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        out = []
        for k in kids:
            try:
                if k.status() != psutil.STATUS_ZOMBIE and match in " ".join(k.cmdline()):
                    out.append(k)
            except psutil.NoSuchProcess:
                pass
        return out

    def workers(self) -> list[psutil.Process]:
        """The command's worker processes: its descendants but for the watchdog and
        multiprocessing's resource tracker."""
        return [p for p in self.descendants() if not _helper(p)]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)
        self._out.close()


def cmdline_of(p: psutil.Process) -> str:
    """``p``'s command line as one string; empty for a process that ended meanwhile (a short-
    lived child seen by ``children()`` may be a zombie, without a command line, a moment
    later: ``psutil.ZombieProcess`` is a ``NoSuchProcess``)."""
    try:
        return " ".join(p.cmdline())
    except psutil.NoSuchProcess:
        return ""


def _helper(p: psutil.Process) -> bool:
    try:
        line = " ".join(p.cmdline())
    except psutil.NoSuchProcess:
        return True
    return WATCHDOG_MODULE in line or "resource_tracker" in line


class ProcessTree:
    """The processes below ``pid`` (and its lifeline tokens), recorded now."""

    def __init__(self, pid: int) -> None:
        self.root = pid
        self.procs: dict[int, psutil.Process] = {}
        self.tokens: set[str] = set()
        self.record()

    def record(self) -> "ProcessTree":
        try:
            kids = psutil.Process(self.root).children(recursive=True)
        except psutil.NoSuchProcess:
            kids = []
        ours = set(lifeline_tokens())  # a command this test runs inside of, if any
        for p in kids:
            self.procs.setdefault(p.pid, p)
            try:
                self.tokens.update(t for t in p.environ().get(LIFELINE_ENV, "").split(",")
                                   if t and t not in ours)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        return self

    def __len__(self) -> int:
        return len(self.procs)

    def survivors(self) -> list[str]:
        """Descriptions of the recorded or marked processes that still run."""
        left = {p.pid: p for p in wait_gone(self.procs.values(), timeout=0)}
        for token in self.tokens:
            for pid in marked_processes(token, exclude=(os.getpid(),)):
                try:
                    left.setdefault(pid, psutil.Process(pid))
                except psutil.NoSuchProcess:
                    pass
        out = []
        for pid, p in sorted(left.items()):
            try:
                out.append(f"{pid} (parent {p.ppid()}): {' '.join(p.cmdline())[:160]}")
            except psutil.NoSuchProcess:
                pass
        return out

    def assert_gone_by(self, deadline: float, what: str) -> None:
        """Fail unless every recorded process has ended by ``deadline`` (monotonic)."""
        while True:
            left = self.survivors()
            if not left:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"{len(left)} process(es) still running {what}:\n" + "\n".join(left))
            time.sleep(0.05)


def signal_and_check(cmd: Command, sig: int, *, min_procs: int = 1,
                     within: float = 10.0) -> ProcessTree:
    """Record the tree, send ``sig`` to the command only, and check the promise:

    SIGTERM: the command exits with 143 within ``within`` s and nothing of its tree is left
    by then; SIGKILL: nothing of its tree is left ``within`` s after the kill.
    """
    tree = ProcessTree(cmd.pid)
    assert len(tree) >= min_procs, f"expected >= {min_procs} processes below the command, " \
                                   f"found {len(tree)}"
    t0 = time.monotonic()
    cmd.proc.send_signal(sig)
    try:
        rc = cmd.proc.wait(within)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the command still runs {within:.0f} s after {signal.Signals(sig).name}:\n"
                    + cmd.output()[-3000:])
    exited = time.monotonic() - t0
    if sig == signal.SIGTERM:
        assert rc == 128 + signal.SIGTERM, f"exit status {rc}:\n{cmd.output()[-3000:]}"
        assert "interrupted by signal 15" in cmd.output()
    else:
        assert rc == -sig
    tree.assert_gone_by(t0 + within, f"{within:.0f} s after {signal.Signals(sig).name}")
    print(f"{signal.Signals(sig).name}: {len(tree)} processes below the command; exit after "
          f"{exited:.2f} s, all gone after {time.monotonic() - t0:.2f} s")
    return tree
