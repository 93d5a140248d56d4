"""Killed at any moment, nothing keeps running (issue 18).

Every command that starts processes is started on CI-sized data, signalled once its workers
are busy (a handshake on something the work produces, never a sleep), and checked with
:mod:`proctree`: after SIGTERM the command exits with 143 within 10 s and leaves nothing;
after SIGKILL of the command alone its whole tree is gone within 10 s. ``synth`` and
``tfrecords`` are then run again and must give the same bytes as an uninterrupted run.
The pieces of :mod:`chexnet_utils.platform.processes` are tested in
tests/unit/test_killed_cleanly.py.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from chexnet_utils.cli import main
from tests.support.proctree import Command, cmdline_of, signal_and_check

SIGNALS = [pytest.param(signal.SIGTERM, id="SIGTERM"), pytest.param(signal.SIGKILL, id="SIGKILL")]
N_SYNTH = 120  # enough that every signal lands mid-run; each test re-runs the rest to compare
SYNTH = ["--n", str(N_SYNTH), "--size", "512", "--seed", "3", "--workers", "2"]
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


def left_after(remaining: Callable[[], list[Path]], seconds: float) -> list[Path]:
    """What ``remaining()`` still lists after up to ``seconds`` (a watchdog removes what a
    killed command left: it may still be at it)."""
    deadline = time.monotonic() + seconds
    while (left := remaining()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


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
    assert len(pngs(out)) < N_SYNTH, "the run finished before the signal"
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
    tmp = tmp_path / "tmp"  # the cluster's profile folder is made here (TMPDIR)
    tmp.mkdir()
    cmd = run("bench", "scaling", "--tfrecords", reference[1], "--workers", "2",
              "--pipelines", "new", "--image-size", "64", "--steps", "100000",
              "--json", tmp_path / "s.json", env={"TMPDIR": str(tmp)})
    cmd.wait_for(lambda: len(cmd.descendants("ipyparallel.engine")) >= 2
                 and "timing" in cmd.output(), "2 MPI engines at work", timeout=120)
    assert list(tmp.glob("chexnet-ipp-*"))
    signal_and_check(cmd, sig, min_procs=4)  # controller, mpiexec, 2 engines
    # nor its profile folder: after SIGKILL the cluster's own watchdog removes it (the
    # command's watchdog once killed that one first, and the folder stayed)
    assert not left_after(lambda: list(tmp.glob("chexnet-ipp-*")), 10)


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
    import secrets

    from chexnet_utils.platform.ports import free_port

    port, token = free_port(), secrets.token_hex(16)
    state = tmp_path / "jupyter"
    env = {"JUPYTER_CONFIG_DIR": str(state / "config"), "JUPYTER_RUNTIME_DIR": str(state / "rt"),
           "JUPYTER_DATA_DIR": os.environ.get("JUPYTER_DATA_DIR", ""),
           "IPYTHONDIR": str(state / "ipython"), "JUPYTER_TOKEN": token}
    env = {k: v for k, v in env.items() if v}
    cmd = run("--notebook-dir", tmp_path, f"--port={port}", "--no-browser",
              "--ServerApp.port_retries=0", module="chexnet_utils.lab", env=env)

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


# ---- a kernel that dies with a cluster up (issue 27) -----------------------------------------

def test_a_killed_or_orphaned_kernel_leaves_no_cluster_behind(tmp_path):
    """The project kernel under the Jupyter server of ``make lab`` (:class:`LabServer`) starts
    ``MPICluster(n=2)`` as notebook 04 does, then dies without cleaning up:

    1. SIGKILL of the kernel (the out-of-memory killer): the cluster's watchdog stops the
       controller, ``mpiexec``, the engines and their nannies;
    2. a second such kernel, then SIGKILL of the Jupyter server: the kernel notices its
       parent is gone and exits with ``os._exit`` (ipykernel's ``ParentPollerUnix``, no
       clean-up), and the watchdog stops its cluster.

    Each time nothing of the kernel's process tree (recorded by pid, with the cluster's
    lifeline token) is left 20 s later, nor the cluster's profile folder (its connection
    files) nor the shared-memory segments of its killed engines. (Restart and a closed tab:
    test_learner_session.py.)
    """
    from jupyter_client import BlockingKernelClient

    from tests.support.lab_server import LabServer
    from tests.support.proctree import ProcessTree

    profiles: list[Path] = []

    def kernel_with_cluster(lab: LabServer) -> tuple[int, BlockingKernelClient]:
        kernel_id = lab.request("/api/kernels", method="POST")["id"]
        client = BlockingKernelClient(
            connection_file=str(lab.state_dir / "runtime" / f"kernel-{kernel_id}.json"))
        client.load_connection_file()
        client.start_channels()
        reply = client.execute_interactive(
            "from chexnet_utils.cluster.distributed import MPICluster\n"
            "cluster = MPICluster(n=2).start()", timeout=180, output_hook=lambda msg: None,
            user_expressions={"profile": "cluster.cluster.profile_dir"})
        assert reply["content"]["status"] == "ok", reply["content"]
        profile = reply["content"]["user_expressions"]["profile"]["data"]["text/plain"]
        profiles.append(Path(profile.strip("'")))
        assert profiles[-1].is_dir(), profiles
        server = psutil.Process(lab.process.pid)
        (pid,) = [p.pid for p in server.children(recursive=True)
                  if f"kernel-{kernel_id}.json" in cmdline_of(p)]
        return pid, client

    import psutil

    from chexnet_utils.platform.processes import orphan_shm_segments

    started = time.time()
    with LabServer(tmp_path) as lab:
        pid, client = kernel_with_cluster(lab)
        tree = ProcessTree(pid)
        assert len(tree) >= 6  # controller, mpiexec, 2 engines, 2 nannies (+ the watchdog)
        tree.procs[pid] = psutil.Process(pid)
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        tree.assert_gone_by(t0 + 20, "20 s after the kernel's SIGKILL")
        print(f"kernel SIGKILLed: {len(tree)} processes gone after {time.monotonic() - t0:.1f} s")
        client.stop_channels()

        pid, client = kernel_with_cluster(lab)
        everything = ProcessTree(lab.process.pid)  # every kernel and what they started
        assert len(everything) >= 7 and pid in everything.procs
        t0 = time.monotonic()
        lab.process.kill()
        lab.process.wait()
        everything.assert_gone_by(t0 + 20, "20 s after the Jupyter server's SIGKILL")
        print(f"Jupyter server SIGKILLed: its {len(everything)} processes gone after "
              f"{time.monotonic() - t0:.1f} s")
        client.stop_channels()
    # the watchdogs remove them once the processes are gone (they may still be at it)
    assert not left_after(lambda: [p for p in profiles if p.exists()], 10), "profile folders left"
    assert not orphan_shm_segments(since=started), "shared-memory segments left"
