"""Killed at any moment, nothing keeps running (issue 18): the pieces of
:mod:`chexnet_utils.platform.processes` (process-table queries, ``Terminated``, the command
lifetime and its watchdog, worker start-up), each on a small Python child that says when it is
ready. Every command killed for real is in tests/mpi/test_killed_cleanly.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import pytest

from chexnet_utils.platform import processes as P
from tests.support.proctree import ProcessTree

# ---- the pieces ----------------------------------------------------------------------------

def test_pid_alive_and_descendants():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert P.pid_alive(child.pid)
        assert child.pid in P.descendants(os.getpid())
    finally:
        child.kill()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, not yet reaped
    assert not P.pid_alive(child.pid)  # a zombie counts as gone
    child.wait()
    assert child.pid not in P.descendants(os.getpid())


def test_terminated_is_a_keyboard_interrupt_with_exit_status():
    assert issubclass(P.Terminated, KeyboardInterrupt)
    assert P.exit_status(P.Terminated(signal.SIGTERM)) == 143
    assert P.exit_status(P.Terminated(signal.SIGHUP)) == 129
    assert P.exit_status(KeyboardInterrupt()) == 130


def test_lifetime_marks_children_and_stops_leftovers_on_exit():
    """A process started inside the block carries the token and is stopped on leaving it."""
    code = "import time; print('ready', flush=True); time.sleep(60)"
    with P.command_lifetime() as life:
        assert life.token in P.lifeline_tokens()
        stubborn = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        assert stubborn.stdout.readline().strip() == b"ready"
        assert P.marked_processes(life.token) == [stubborn.pid]
    assert stubborn.wait(timeout=1) == -signal.SIGTERM
    assert life.token not in P.lifeline_tokens()
    assert life.watchdog.poll() is not None


def test_sigterm_inside_lifetime_raises_terminated_and_handler_is_restored():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(P.Terminated) as err, P.command_lifetime(watchdog=False):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between two bytecodes
            pass
    assert err.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


def test_second_sigterm_during_cleanup_is_noted_and_nothing_leaks_out():
    cleaned = False
    with P.command_lifetime(watchdog=False):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):
                pass
        except P.Terminated:
            os.kill(os.getpid(), signal.SIGTERM)  # a supervisor's second signal
            for _ in range(1000):
                pass
            cleaned = True  # the cleanup was not cut short
        with pytest.raises(P.Terminated):  # a library swallowed it: the command still stops
            P.check_terminated()
    assert cleaned
    P.check_terminated()  # outside a command: nothing to re-raise


def test_worker_whose_parent_is_already_gone_exits():
    code = ("from chexnet_utils.platform.processes import worker_init; "
            "worker_init(parent=1); print('ran')")
    if os.getppid() == 1:
        pytest.skip("this test process is itself a child of pid 1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 143 and "ran" not in proc.stdout


def test_worker_init_restores_sigterm_and_sets_parent_death_signal():
    code = ("import signal, sys\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "from chexnet_utils.platform.processes import worker_init\n"
            "worker_init()\n"
            "import ctypes; v = ctypes.c_int(); libc = ctypes.CDLL(None)\n"
            "libc.prctl(2, ctypes.byref(v), 0, 0, 0)\n"  # PR_GET_PDEATHSIG
            "print(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, v.value)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", str(int(signal.SIGKILL))]


def test_watchdog_stops_the_tree_of_a_killed_parent(tmp_path):
    """The watchdog alone (no pool, no parent-death signal): a parent inside a lifetime
    starts a grandchild that ignores SIGTERM, then is SIGKILLed."""
    code = ("import subprocess, sys, time\n"
            "from chexnet_utils.platform.processes import command_lifetime\n"
            "with command_lifetime():\n"
            "    c = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'])\n"
            "    print(c.pid, flush=True); time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        grandchild = int(parent.stdout.readline())
        tree = ProcessTree(parent.pid)
        assert grandchild in tree.procs and len(tree) == 2  # the grandchild and the watchdog
        import time

        t0 = time.monotonic()
        parent.kill()
        parent.wait()
        tree.assert_gone_by(t0 + 10, "after SIGKILL of their parent")
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_command_that_cannot_finish_its_cleanup_still_exits_after_the_grace_period():
    """A thread that never ends (a library's non-daemon worker) would keep the interpreter
    alive after SIGTERM: once the main thread is over, the deadline armed by the handler
    exits with 128 + 15 anyway (work the command still does in its main thread is not cut)."""
    import signal
    import subprocess
    import sys
    import time

    code = (
        "import threading, time, sys\n"
        "from chexnet_utils.platform import processes as P\n"
        "P.TERM_GRACE_S = 0.5\n"
        "with P.command_lifetime(watchdog=False):\n"
        "    threading.Thread(target=time.sleep, args=(600,)).start()  # never joins in time\n"
        "    try:\n"
        "        print('ready', flush=True)\n"
        "        time.sleep(600)\n"
        "    except P.Terminated:\n"
        "        print('terminated', flush=True)\n"
        "time.sleep(1.0)   # still working after handling it: the deadline leaves it alone\n"
        "print('went on', flush=True)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"    # handshake, no sleep
        t0 = time.monotonic()
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == 128 + signal.SIGTERM
        assert child.stdout.read().split() == ["terminated", "went", "on"]
        assert time.monotonic() - t0 < 20
    finally:
        child.kill()
        child.wait()


def test_wait_pids_gone_returns_the_survivors_and_counts_exited_children_as_gone() -> None:
    import subprocess
    import sys

    from chexnet_utils.platform.processes import wait_pids_gone

    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert wait_pids_gone([quick.pid], timeout=20) == []   # exited, not yet reaped
        assert wait_pids_gone([slow.pid], timeout=0.1) == [slow.pid]
    finally:
        slow.kill()
        slow.wait()
        quick.wait()
    assert wait_pids_gone([slow.pid], timeout=5) == []


def test_stop_within_kills_at_once_what_it_is_told_and_the_rest_after_the_timeout() -> None:
    import threading
    import time

    import psutil

    slow = [subprocess.Popen(["sleep", "30"]) for _ in range(2)]
    ended: dict[int, float] = {}

    def watch(p: subprocess.Popen) -> None:
        p.wait()
        ended[p.pid] = time.monotonic()

    watchers = [threading.Thread(target=watch, args=(p,)) for p in slow]
    for w in watchers:
        w.start()
    t0 = time.monotonic()
    P.stop_within([psutil.Process(p.pid) for p in slow], timeout=3.0,
                  kill_at_once=lambda proc: proc.pid == slow[0].pid)
    for w in watchers:
        w.join(timeout=10)
    assert [p.returncode for p in slow] == [-signal.SIGKILL, -signal.SIGKILL]
    assert ended[slow[0].pid] - t0 < 2.0  # told: killed at once
    assert ended[slow[1].pid] - t0 >= 3.0  # the rest: after the timeout


@pytest.mark.parametrize("end", ["killed", "released", "closed"])
def test_watchdog_runs_its_on_death_commands_only_when_the_parent_dies(tmp_path, end):
    """What no signal reaches (a Slurm job: scancel) is handed to the watchdog as a command
    (issue 27): run after SIGKILL of the parent, not after a normal release; so is a folder
    the parent would have removed (a cluster's profile with its connection files). ``closed``: the
    pipe closes without ``done`` while the parent still looks alive, which is what a dying
    parent looks like for a moment (it closes its files before it is a zombie; CI once lost
    the race, and the Slurm job ended FAILED instead of CANCELLED): that is a death too."""
    import time

    flag = tmp_path / "ran"
    folder = tmp_path / "profile"  # what the parent's clean-up would remove: after a death
    (folder / "security").mkdir(parents=True)
    (folder / "security" / "client.json").write_text("{}")
    command = f"import pathlib; pathlib.Path({str(flag)!r}).write_text('ran')"
    code = ("import sys, time\n"
            "from chexnet_utils.platform import processes as P\n"
            "w = P.start_watchdog(P.os.getpid(), 'tok-x')\n"
            f"assert P.watchdog_on_death(w, [sys.executable, '-c', {command!r}])\n"
            f"assert P.watchdog_remove_on_death(w, {str(folder)!r})\n"
            "print(w.pid, flush=True)\n"
            f"if {end == 'released'}:\n"
            "    P.release_watchdog(w)\n"
            "    print('released', flush=True)\n"
            f"if {end == 'closed'}:\n"
            "    w.stdin.close()\n"
            "    print('closed', flush=True)\n"
            "time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        watchdog = int(parent.stdout.readline())
        if end == "released":
            assert parent.stdout.readline().strip() == "released"
            assert P.wait_pids_gone([watchdog], timeout=10) == []
        if end == "closed":
            assert parent.stdout.readline().strip() == "closed"
            assert P.wait_pids_gone([watchdog], timeout=20) == []
            assert parent.poll() is None and flag.exists()
        parent.kill()
        parent.wait()
        assert P.wait_pids_gone([watchdog], timeout=20) == []
        time.sleep(0.2)
        assert flag.exists() is (end != "released")
        assert folder.exists() is (end == "released")
    finally:
        if parent.poll() is None:
            parent.kill()
    assert not P.watchdog_on_death(None, ["true"])
    assert not P.watchdog_remove_on_death(None, str(folder))


def test_a_released_watchdog_removes_the_segments_of_the_ranks_it_had_to_stop():
    """A rank that outlived its cluster's own clean-up (which removed the orphaned Open MPI
    segments before it) is stopped when the watchdog is released, and its segment, now
    mapped by nobody, is removed then too: before, only a parent's death did that, and such
    pairs of 4 MiB segments stayed in /dev/shm."""
    import secrets
    import time

    token = f"tok-shm-{secrets.token_hex(4)}"
    segment = f"/dev/shm/vader_segment.chexnet-test.{os.getpid()}.{token}"
    code = ("import mmap, os, sys, time\n"
            f"fd = os.open({segment!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
            "os.ftruncate(fd, 4096)\n"
            "m = mmap.mmap(fd, 4096)\n"
            "os.close(fd)\n"
            "print('mapped', flush=True)\n"
            "time.sleep(120)\n")
    watchdog = P.start_watchdog(os.getpid(), token)
    time.sleep(1.0)  # it counts segments from its own start on: a cluster's ranks come later
    rank = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, P.LIFELINE_ENV: token})
    try:
        assert rank.stdout.readline().strip() == "mapped"
        assert segment not in P.orphan_shm_segments()  # mapped: in use, not an orphan
        t0 = time.monotonic()
        P.release_watchdog(watchdog)
        assert rank.wait(timeout=10) == -signal.SIGTERM  # stopped by the watchdog
        assert not os.path.exists(segment), "the stopped rank's segment was left behind"
        assert time.monotonic() - t0 < 10
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(segment)


def test_a_modules_main_block_comes_last():
    """``python -m chexnet_utils.platform.processes`` (the watchdog) ran its ``__main__`` block
    before the module's last functions were defined, so its shared-memory clean-up failed
    with a NameError, unseen, in every watchdog: a module run as a program defines everything
    first."""
    import ast
    from pathlib import Path

    import chexnet_utils

    late = []
    for path in Path(chexnet_utils.__file__).parent.rglob("*.py"):
        body = ast.parse(path.read_text(encoding="utf-8")).body
        for i, node in enumerate(body):
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) and any(
                    isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                    for n in body[i + 1:]):
                late.append(str(path))
    assert late == []


# ---- the test session itself (security review finding 11) -----------------------------------

def test_a_killed_pytest_session_leaves_nothing_it_started(tmp_path):
    """The repository's conftest gives each pytest session a lifeline: a test session killed
    with SIGKILL (a CI timeout) takes the processes its tests started with it."""
    import json
    import selectors
    import time

    import psutil

    from chexnet_utils.platform.processes import wait_pids_gone

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    (tmp_path / "test_sleeper.py").write_text(
        "import json, subprocess, sys, time\n"
        "def test_sleeps():\n"
        "    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],\n"
        "                             start_new_session=True)\n"  # out of pytest's group
        "    print(json.dumps({'child': child.pid}), flush=True)\n"
        "    time.sleep(600)\n")
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-c", os.path.join(root, "pyproject.toml"), "--rootdir", str(tmp_path), "-p",
         "conftest", str(tmp_path / "test_sleeper.py")],
        cwd=root, stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
        start_new_session=True)
    child = None
    try:
        sel = selectors.DefaultSelector()
        sel.register(session.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 120
        while child is None and time.monotonic() < deadline:
            if not sel.select(timeout=deadline - time.monotonic()):
                break
            line = session.stdout.readline()
            if not line:
                break
            if line.lstrip(".").startswith("{"):
                child = json.loads(line.lstrip("."))["child"]
        assert child is not None, "the test session did not start its child"
        assert P.pid_alive(child)
        watchdogs = [p.pid for p in psutil.process_iter(["cmdline"])
                     if (p.info["cmdline"] or [])[1:4]
                     == ["-m", "chexnet_utils.platform.processes", str(session.pid)]]
        assert len(watchdogs) == 1, "the session has no watchdog"
        session.kill()
        session.wait()
        assert wait_pids_gone([child], timeout=20) == [], "the child outlived its pytest"
        assert wait_pids_gone(watchdogs, timeout=20) == [], "the watchdog did not finish"
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
        if child is not None and P.pid_alive(child):
            os.kill(child, signal.SIGKILL)
