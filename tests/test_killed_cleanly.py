"""Killed at any moment, nothing keeps running (issue 18).

Every command that starts processes is started on CI-sized data, signalled once its workers
are busy (a handshake on something the work produces, never a sleep), and checked with
:mod:`proctree`: after SIGTERM the command exits with 143 within 10 s and leaves nothing;
after SIGKILL of the command alone its whole tree is gone within 10 s. ``synth`` and
``tfrecords`` are then run again and must give the same bytes as an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from chexnet_utils import processes as P
from chexnet_utils.cli import main
from proctree import Command, ProcessTree, signal_and_check

SIGNALS = [pytest.param(signal.SIGTERM, id="SIGTERM"), pytest.param(signal.SIGKILL, id="SIGKILL")]
SYNTH = ["--n", "240", "--size", "512", "--seed", "3", "--workers", "2"]
# PNG re-encoding at 500 px: the slowest setting, so the signal lands mid-conversion
CONVERT = ["--shard-size", "8", "--encoding", "png", "--image-size", "500", "--workers", "2",
           "--no-progress"]


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted ``synth`` and ``tfrecords`` run: (data folder, TFRecords folder)."""
    base = tmp_path_factory.mktemp("reference")
    assert main(["synth", "--out", str(base / "data"), *SYNTH]) == 0
    assert main(["tfrecords", "--data-dir", str(base / "data"), "--out", str(base / "tfr"),
                 *CONVERT]) == 0
    return base / "data", base / "tfr"


@pytest.fixture
def run(tmp_path):
    started: list[Command] = []

    def start(*args: str, **kw) -> Command:
        cmd = Command(args, tmp_path / f"log-{len(started)}.txt", **kw)
        started.append(cmd)
        return cmd

    yield start
    for cmd in started:
        cmd.close()


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
    code = "from chexnet_utils.processes import worker_init; worker_init(parent=1); print('ran')"
    if os.getppid() == 1:
        pytest.skip("this test process is itself a child of pid 1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 143 and "ran" not in proc.stdout


def test_worker_init_restores_sigterm_and_sets_parent_death_signal():
    code = ("import signal, sys\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "from chexnet_utils.processes import worker_init\n"
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
            "from chexnet_utils.processes import command_lifetime\n"
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


# ---- every command -------------------------------------------------------------------------

def pngs(root: Path) -> list[Path]:
    return list(root.glob("images_*/images/*.png"))


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS)
def test_synth(run, tmp_path, reference, sig):
    out = tmp_path / "data"
    cmd = run("synth", "--out", out, *SYNTH)
    cmd.wait_for(lambda: len(cmd.workers()) >= 2 and pngs(out),
                 "2 busy workers")
    signal_and_check(cmd, sig, min_procs=2)
    assert len(pngs(out)) < 240, "the run finished before the signal"
    assert main(["synth", "--out", str(out), *SYNTH]) == 0
    assert files(out) == files(reference[0])


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS)
def test_tfrecords(run, tmp_path, reference, sig):
    out = tmp_path / "tfr"
    cmd = run("tfrecords", "--data-dir", reference[0], "--out", out, *CONVERT)
    cmd.wait_for(lambda: len(cmd.workers()) >= 2
                 and list(out.glob("*.tfrecord.tmp-*")), "2 workers writing shards")
    signal_and_check(cmd, sig, min_procs=2)
    assert not json.loads((out / "manifest.json").read_text())["complete"]
    assert main(["tfrecords", "--data-dir", str(reference[0]), "--out", str(out),
                 *CONVERT]) == 0
    assert files(out).keys() == files(reference[1]).keys()
    assert {k: v for k, v in files(out).items() if k.endswith(".tfrecord")} == \
           {k: v for k, v in files(reference[1]).items() if k.endswith(".tfrecord")}


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS)
def test_bench_conversion(run, tmp_path, reference, sig):
    work = tmp_path / "work"
    cmd = run("bench", "conversion", "--data-dir", reference[0], "--workers", "2",
              "--image-sizes", "500", "--repeats", "3", "--shard-size", "8", "--no-progress",
              env={"CHEXNET_WORK_DIR": str(work)})
    cmd.wait_for(lambda: len(cmd.workers()) >= 2
                 and list(work.glob("conv-*/*.tmp-*")), "2 workers writing shards")
    signal_and_check(cmd, sig, min_procs=2)
    if sig == signal.SIGTERM:  # its cleanup ran: no temporary conversion left
        assert not list(work.glob("conv-*"))


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS)
def test_train(run, tmp_path, reference, sig):
    out = tmp_path / "run"
    cmd = run("train", "--tfrecords", reference[1], "--arch", "small", "--image-size", "64",
              "--epochs", "200", "--batch-size", "8", "--out", out)
    cmd.wait_for(lambda: "training small" in cmd.output(), "the training loop")
    signal_and_check(cmd, sig)


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS)
def test_bench_pipelines(run, tmp_path, reference, sig):
    cmd = run("bench", "pipelines", "--tfrecords", reference[1], "--json",
              tmp_path / "b.json", "--image-size", "64", "--batches", "400", "--repeats", "3")
    cmd.wait_for(lambda: "... " in cmd.output(), "a timed pipeline run")
    signal_and_check(cmd, sig)
    assert not (tmp_path / "b.json").exists()


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("sig", SIGNALS)
def test_bench_scaling(run, tmp_path, reference, sig):
    cmd = run("bench", "scaling", "--tfrecords", reference[1], "--workers", "2",
              "--pipelines", "new", "--image-size", "64", "--steps", "100000",
              "--json", tmp_path / "s.json")
    cmd.wait_for(lambda: len(cmd.descendants("ipyparallel.engine")) >= 2
                 and "timing" in cmd.output(), "2 MPI engines at work", timeout=120)
    signal_and_check(cmd, sig, min_procs=4)  # controller, mpiexec, 2 engines


NOTEBOOK = {
    "cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
               "source": "import pathlib, subprocess, sys, time\n"
                         "child = subprocess.Popen([sys.executable, '-c', "
                         "'import time; time.sleep(600)'])\n"
                         "pathlib.Path(FLAG).write_text(str(child.pid))\n"
                         "time.sleep(600)\n"}],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                "language": "python"}},
    "nbformat": 4, "nbformat_minor": 5}


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS)
def test_tutorial(run, tmp_path, sig):
    flag = tmp_path / "started"
    nb = dict(NOTEBOOK)
    nb["cells"] = [dict(NOTEBOOK["cells"][0], source=f"FLAG = {str(flag)!r}\n"
                        + NOTEBOOK["cells"][0]["source"])]
    path = tmp_path / "90_sleep.ipynb"
    path.write_text(json.dumps(nb))
    cmd = run("tutorial", "--out", tmp_path / "out", path)
    cmd.wait_for(flag.exists, "the notebook's cell to start its process")
    tree = signal_and_check(cmd, sig, min_procs=2)  # the kernel and what it started
    assert int(flag.read_text()) in tree.procs


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS)
def test_lab(run, tmp_path, sig):
    from chexnet_utils.lab import free_port

    port, token = free_port(), "t0k3n"
    state = tmp_path / "jupyter"
    env = {"JUPYTER_CONFIG_DIR": str(state / "config"), "JUPYTER_RUNTIME_DIR": str(state / "rt"),
           "JUPYTER_DATA_DIR": os.environ.get("JUPYTER_DATA_DIR", ""),
           "IPYTHONDIR": str(state / "ipython")}
    env = {k: v for k, v in env.items() if v}
    cmd = run("--notebook-dir", tmp_path, f"--port={port}", "--no-browser",
              "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
              module="chexnet_utils.lab", env=env)

    def api(path: str, method: str = "GET"):
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                     headers={"Authorization": f"token {token}"})
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return json.loads(resp.read() or b"null")
        except OSError:
            return None

    cmd.wait_for(lambda: api("/api/status"), "JupyterLab to answer")
    assert api("/api/kernels", "POST"), "could not start a kernel"
    cmd.wait_for(lambda: cmd.descendants("ipykernel"), "the kernel process")
    signal_and_check(cmd, sig, min_procs=2)  # the server and its kernel
