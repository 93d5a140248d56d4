"""Starting MPI processes from Python: root-safe Open MPI settings and ``mpirun`` commands.

Open MPI refuses to start as root unless told it is intended (containers and CI often run
as root). :func:`mpi_environment` adds those switches only when we are root, plus a thread
budget per process so N processes on a CPU machine do not each start ``cores`` threads.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence

from chexnet_utils.devices import cpu_thread_budget

ROOT_SWITCHES = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def mpi_environment(n_procs: int = 1, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for processes started with ``mpirun``.

    Copies ``base`` (default ``os.environ``); as root adds Open MPI's allow-root switches;
    sets ``OMP_NUM_THREADS`` / TensorFlow thread counts to ``cores // n_procs`` unless the
    caller set them already.
    """
    env = dict(os.environ if base is None else base)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.update(ROOT_SWITCHES)
    threads = str(cpu_thread_budget(n_procs))
    env.setdefault("OMP_NUM_THREADS", threads)
    env.setdefault("TF_NUM_INTRAOP_THREADS", threads)
    env.setdefault("TF_NUM_INTEROP_THREADS", "1" if threads == "1" else "2")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def mpirun_command(
    n_procs: int,
    argv: Sequence[str],
    map_by: str | None = None,
    bind_to: str | None = None,
    hostfile: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """``mpirun -np N [--map-by X] [--bind-to Y] [--hostfile F] ... argv``.

    ``argv`` starting with ``python`` is replaced by this interpreter so the processes run in
    the same environment. Forwards the thread-budget variables (set them with
    :func:`mpi_environment`) with ``-x`` so they reach processes on other hosts too. Raises
    ``FileNotFoundError`` when ``mpirun`` is not installed.
    """
    exe = shutil.which("mpirun")
    if exe is None:
        raise FileNotFoundError("mpirun not found: install Open MPI "
                                "(apt-get install openmpi-bin libopenmpi-dev)")
    if n_procs < 1:
        raise ValueError(f"n_procs must be >= 1, got {n_procs}")
    cmd = [exe, "-np", str(n_procs)]
    if map_by:
        cmd += ["--map-by", map_by]
    if bind_to:
        cmd += ["--bind-to", bind_to]
    if hostfile:
        cmd += ["--hostfile", hostfile]
    for var in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS",
                "TF_CPP_MIN_LOG_LEVEL"):
        cmd += ["-x", var]
    cmd += list(extra)
    argv = list(argv)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return cmd + argv


def rank_info() -> dict[str, object]:
    """``hvd.init()``, pin this process (:func:`~chexnet_utils.devices.pin_process`), describe it.

    Returns rank, size, local rank, local size, host name, pid and the placement. Run it in
    every process (``mpirun -np N python -m chexnet_utils whoami``, or on ipyparallel engines).
    """
    import socket

    import horovod.tensorflow as hvd

    from chexnet_utils.devices import pin_process

    hvd.init()
    placement = pin_process(hvd.local_rank(), hvd.local_size())
    return {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "local_rank": hvd.local_rank(),
        "local_size": hvd.local_size(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "device": placement.device,
        "threads": placement.threads,
    }


def json_objects(text: str) -> list[dict[str, object]]:
    """Every JSON object in ``text``, even when lines from several processes run together.

    ``mpirun`` merges the processes' stdout and does not promise to keep their lines apart,
    so ``{"rank": 0}{"rank": 1}`` on one line is possible; this scans for objects instead of
    splitting lines.
    """
    import json

    decoder = json.JSONDecoder()
    found: list[dict[str, object]] = []
    pos = text.find("{")
    while pos != -1:
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            pos = text.find("{", pos + 1)
            continue
        if isinstance(obj, dict):
            found.append(obj)
        pos = text.find("{", end)
    return found


def run_mpi_json(n_procs: int, argv: Sequence[str], timeout: float = 300,
                 **mpirun_options: object) -> list[dict[str, object]]:
    """Run ``argv`` under ``mpirun -np n_procs``; return the JSON objects the ranks printed.

    Sorted by their ``rank`` key where present. Raises ``RuntimeError`` with the tail of
    stderr when ``mpirun`` fails, and ``subprocess.TimeoutExpired`` after ``timeout`` seconds
    (a hung ``hvd.init()`` must not hang the caller).
    """
    import subprocess

    cmd = mpirun_command(n_procs, argv, **mpirun_options)  # type: ignore[arg-type]
    out = subprocess.run(cmd, env=mpi_environment(n_procs), capture_output=True, text=True,
                         timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"mpirun exited with {out.returncode}:\n{out.stderr[-3000:]}")
    objs = json_objects(out.stdout)
    return sorted(objs, key=lambda o: int(o.get("rank", 0)))  # type: ignore[call-overload]
