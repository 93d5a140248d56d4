"""Starting MPI processes from Python: root-safe Open MPI settings and ``mpirun`` commands.

Open MPI refuses to start as root unless told it is intended (containers and CI often run
as root). :func:`mpi_environment` adds those switches only when we are root, plus a thread
budget per process so N processes on a CPU machine do not each start ``cores`` threads.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import psutil

from chexnet_utils.hardware.devices import cpu_thread_budget, usable_cores
from chexnet_utils.platform.atomic import make_private
from chexnet_utils.platform.exposure import check_listen_address
from chexnet_utils.platform.lazy import lazy_module
from chexnet_utils.platform.processes import (
    LIFELINE_ENV,
    lifeline_tokens,
    pid_alive,
    release_watchdog,
    remove_orphan_shm_segments,
    start_watchdog,
    stop_within,
    terminate_below,
    watchdog_remove_on_death,
)
from chexnet_utils.platform.root import ROOT_SWITCHES, root_switches

if TYPE_CHECKING:
    from traitlets.config import Config

# Horovod: imported on first use (chexnet_utils.platform.lazy)
hvd = lazy_module("horovod.tensorflow")

BIND_TO_ONE_CORE = ("core", "hwthread")
"""``--bind-to`` values that give each rank a single core (or hardware thread)."""
HOROVODRUN_BIND_TO = "none"
""":class:`MPICluster`'s default ``--bind-to``: what ``horovodrun`` passes to ``mpirun``
(``-bind-to none -map-by slot``: Horovod v0.28.1 ``docs/mpi.rst``, "Equivalent Open MPI
command", and ``horovod/runner/mpi_run.py``), so that an engine's input pipeline can use the
node's other cores."""
HEARTBEAT_MS, HEARTBEAT_MISSES, ENGINE_HEARTBEAT_MISSES = 500, 60, 175
"""Controller ping period (ms; ``HeartMonitor.period``, 3000), pings an engine may miss
(``max_heartmonitor_misses``, 10), checks an engine may find no ping in (``IPEngine.
max_heartbeat_misses``, 50, every period + 500 ms): ipyparallel 9.2. An engine registers at
the first ping after it answered one, 3-6 s per start at 3000 ms (``docs/benchmarks.md``);
both tolerances stay at 30 s and 175 s."""


def mpi_env_overrides(n_procs: int = 1, base: Mapping[str, str] | None = None,
                      bind_to: str | None = None) -> dict[str, str]:
    """Only the variables :func:`mpi_environment` adds to ``base`` (default ``os.environ``).

    As root in a container, a user namespace of one's own or with ``CHEXNET_ALLOW_ROOT=1``:
    Open MPI's allow-root switches (as the host's root otherwise, ``RootRefused``:
    :mod:`chexnet_utils.platform.root`). Always, unless ``base`` sets them already:
    ``OMP_NUM_THREADS`` and TensorFlow's thread counts = ``cores // n_procs`` (the CPU
    thread budget), and a quieter TensorFlow log.

    With more than one process, ``OMPI_MCA_mpi_yield_when_idle=1`` as well when a rank has
    no core to spare: the processes fill every core of this machine (``n_procs >= cores``)
    or each is bound to a single core (``bind_to`` ``"core"`` / ``"hwthread"``). Open MPI
    waits for a message by spinning on the core, and Horovod's background thread runs a
    small MPI collective every ``HOROVOD_CYCLE_TIME`` (1 ms) to agree which tensors are
    ready. A rank that reaches it first spins until the other ranks arrive, on the very
    core its training thread needs. Yielding while idle hands the core back (measured on 2
    cores, one bound core per worker: 1 -> 2 workers scaling efficiency 0.71 spinning, 1.02
    yielding; ``docs/benchmarks.md``). With spare cores and no binding to one core (a GPU
    node: one process per GPU, many cores each) spinning costs nothing and answers faster,
    so it is left alone. ``cores`` are this machine's: with a hostfile, ``n_procs`` counts
    every node's ranks, so set the variable yourself if the nodes are full.
    """
    base = os.environ if base is None else base
    extra: dict[str, str] = {}
    if root_switches(base):  # RootRefused as the host's root without CHEXNET_ALLOW_ROOT=1
        extra.update(ROOT_SWITCHES)
    threads = str(cpu_thread_budget(n_procs))
    defaults = {"OMP_NUM_THREADS": threads, "TF_NUM_INTRAOP_THREADS": threads,
                "TF_NUM_INTEROP_THREADS": "1" if threads == "1" else "2",
                "TF_CPP_MIN_LOG_LEVEL": "2"}
    if n_procs > 1 and (n_procs >= usable_cores() or bind_to in BIND_TO_ONE_CORE):
        defaults["OMPI_MCA_mpi_yield_when_idle"] = "1"
    extra.update({k: v for k, v in defaults.items() if k not in base})
    return extra


def mpi_environment(n_procs: int = 1, base: Mapping[str, str] | None = None,
                    bind_to: str | None = None) -> dict[str, str]:
    """Environment for processes started with ``mpirun``: ``base`` plus
    :func:`mpi_env_overrides` (root-safe Open MPI, per-process thread budget, yielding MPI
    where a rank has no spare core)."""
    env = dict(os.environ if base is None else base)
    env.update(mpi_env_overrides(n_procs, env, bind_to))
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


def remote_errors(e: BaseException) -> list[tuple[str, str]]:
    """The engines' errors ipyparallel passes on in ``e``, as ``(ename, evalue)``: one per
    engine of a ``CompositeError``, the one of a ``RemoteError``, none for any other
    exception (``ipyparallel/error.py``, 9.2)."""
    from ipyparallel import error

    if isinstance(e, error.CompositeError):
        return [(ename, evalue) for ename, evalue, *_ in e.elist]
    if isinstance(e, error.RemoteError):
        return [(e.ename, e.evalue)]
    return []


def engine_died(e: BaseException) -> bool:
    """Whether ``e``, raised by an ipyparallel result, says an engine died: ipyparallel's
    ``EngineError``, also among its :func:`remote_errors`."""
    from ipyparallel import error

    return isinstance(e, error.EngineError) or any(
        ename == "EngineError" for ename, _ in remote_errors(e))


def rank_info() -> dict[str, object]:
    """``hvd.init()``, pin this process (:func:`~chexnet_utils.hardware.devices.pin_process`),
    describe it.

    Returns rank, size, local rank, local size, host name, pid and the placement. Run it in
    every process (``mpirun -np N python -m chexnet_utils whoami``, or on ipyparallel engines)."""
    from chexnet_utils.hardware.devices import pin_process

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


def json_objects(text: str) -> list[dict[str, Any]]:
    """Every JSON object in ``text``, even when lines from several processes run together.

    ``mpirun`` merges the processes' stdout and does not promise to keep their lines apart,
    so ``{"rank": 0}{"rank": 1}`` on one line is possible; this scans for objects instead of
    splitting lines.
    """
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
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


def _run_mpirun(cmd: list[str], n_procs: int, bind_to: str | None,
                timeout: float) -> subprocess.CompletedProcess[str]:
    """Run an ``mpirun`` command line with :func:`mpi_environment`, output captured; raise
    ``RuntimeError`` with the tail of stderr when it fails."""
    out = subprocess.run(cmd, env=mpi_environment(n_procs, bind_to=bind_to),
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"mpirun exited with {out.returncode}:\n{out.stderr[-3000:]}")
    return out


def run_mpi_json(n_procs: int, argv: Sequence[str], timeout: float = 300,
                 bind_to: str | None = None, **mpirun_options: Any
                 ) -> list[dict[str, object]]:
    """Run ``argv`` under ``mpirun -np n_procs``; return the JSON objects the ranks printed.

    Sorted by their ``rank`` key where present. Raises ``RuntimeError`` with the tail of
    stderr when ``mpirun`` fails, and ``subprocess.TimeoutExpired`` after ``timeout`` seconds
    (a hung ``hvd.init()`` must not hang the caller).
    """
    cmd = mpirun_command(n_procs, argv, bind_to=bind_to, **mpirun_options)
    out = _run_mpirun(cmd, n_procs, bind_to, timeout)
    objs = json_objects(out.stdout)
    return sorted(objs, key=lambda o: int(o.get("rank", 0)))


def report_bindings(n_procs: int, bind_to: str | None = None, map_by: str | None = None,
                    timeout: float = 60) -> list[str]:
    """Where Open MPI puts ``n_procs`` processes, one line per rank, from ``mpirun
    --report-bindings`` (``"rank 0: bound to socket 0[core 0[hwt 0]]: [B/.]"``).

    ``bind_to=None`` passes no ``--bind-to``, so the lines show Open MPI's own default, which
    is *not* unbound: with no binding directive Open MPI 4.1 binds each process to a core
    when ``np <= 2`` and to a socket above that (``mpirun(1)``, Open MPI 4.1, "Mapping,
    Ranking, and Binding"; unbound when oversubscribed). ``"none"`` really leaves them free.
    Runs the trivial program ``true`` on this host (with ``--oversubscribe`` when ``n_procs``
    exceeds its cores); raises ``RuntimeError`` with the tail of stderr if ``mpirun`` fails.
    """
    extra = ["--report-bindings"] + (["--oversubscribe"] if n_procs > usable_cores() else [])
    cmd = mpirun_command(n_procs, ["true"], map_by=map_by, bind_to=bind_to, extra=extra)
    out = _run_mpirun(cmd, n_procs, bind_to, timeout)
    reported: dict[int, str] = {}
    for line in (out.stderr + out.stdout).splitlines():
        m = re.search(r"MCW rank (\d+) (.*)", line)
        if m:
            reported[int(m.group(1))] = m.group(2).strip()
    # Open MPI 4.1 reports nothing for a process it did not bind (--bind-to none, oversubscribed).
    return [f"rank {r}: {reported.get(r, 'not bound (free to run on any core)')}"
            for r in range(n_procs)]


# ---------------------------------------------------------------------------------------
# ipyparallel MPI engines driven from a notebook
# ---------------------------------------------------------------------------------------


def mpi_rank() -> int:
    """This process's MPI rank from the launcher's environment (Open MPI, MPICH, Slurm)."""
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


class EngineFailure(RuntimeError):
    """An engine (or the whole MPI job) died, or a task ran past its time limit."""


def mpirun_option_given(args: Sequence[str], option: str) -> bool:
    """True if ``args`` give ``mpirun`` the option ``option`` (``--x``, ``-x``, ``--x=v``)."""
    return any(a.lstrip("-").split("=", 1)[0] == option for a in args if a.startswith("-"))


class MPICluster:
    """An ipyparallel cluster of ``n`` MPI engines (one ``mpiexec``), torn down for sure.

    Use it as a context manager::

        with MPICluster(n=2) as cluster:
            ranks = cluster.run(rank_info)          # runs on every engine, sorted by rank

    * The controller listens on **loopback** (``127.0.0.1``) unless you name the address of
      an interface (``controller_ip=``, and ``location=`` the address engines should use);
      off loopback CurveZMQ encryption is on (``curve=None``: on exactly then; see
      ``tests/support/remote_engines.py``). Its connection files live in a private folder
      (mode 0700, files 0600) that is deleted at teardown.
    * As root, Open MPI's allow-root switches are set for ``mpiexec``; every engine gets a
      CPU thread budget of ``cores // n`` (see :func:`mpi_env_overrides`).
    * ``map_by`` / ``bind_to`` / ``hostfile`` / ``mpi_args`` go to ``mpiexec`` unchanged
      (``--map-by socket`` was the best mapping on the articles' C4140 nodes). ``bind_to``
      defaults to ``"none"`` (:data:`HOROVODRUN_BIND_TO`, what ``horovodrun`` passes): the
      engines are unbound, so a GPU node's engine can feed its GPU from the node's other
      cores. ``bind_to=None`` passes nothing, i.e. *Open MPI's default*, which is not
      unbound: a core per engine for ``n <= 2``, a socket above (``mpirun(1)``, Open MPI
      4.1; :func:`report_bindings` shows it). A ``--bind-to`` in ``mpi_args`` (a
      :func:`chexnet_utils.hardware.gpu_topology.binding_plan`) wins over ``bind_to``.
    * Teardown (``stop()``, the end of a ``with`` block, an exception or an interrupted
      cell) stops the engines and controller, waits for every process the cluster started
      (controller, ``mpiexec``, engines and their nanny processes) to exit, and kills the
      stragglers after ``stop_timeout`` seconds.
    * **A killed kernel leaves nothing either** (SIGKILL by the out-of-memory killer, a kernel
      that exits because its Jupyter server went away): :meth:`start` starts a small
      watchdog process (:func:`chexnet_utils.platform.processes.start_watchdog`) that waits on this
      process, and every process of the cluster carries the cluster's token in
      ``CHEXNET_LIFELINE``; when this process dies the watchdog stops them all (SIGTERM,
      then SIGKILL), whoever their parent is by then.
    * **Interrupt** (the stop button) during a ``%%px`` cell or :meth:`run`: every SIGINT
      sent to the engines (``%%px`` sends one, :meth:`run` calls :meth:`interrupt`) waits
      until the interrupted tasks have ended, up to ``interrupt_timeout`` seconds, and says
      so in one line, so the next cell finds the engines idle (without the wait, ipykernel
      aborts it: :mod:`chexnet_utils.cluster.engine_interrupts`). An engine still busy then (in a
      call that ignores SIGINT: an MPI or Horovod collective waiting for a rank that was
      interrupted) cannot be saved, the MPI job is lost: the cluster is stopped, its
      processes gone, and the line says to start a new one. A second interrupt during the
      wait stops it at once.
    """

    def __init__(self, n: int = 2, *, map_by: str | None = None,
                 bind_to: str | None = HOROVODRUN_BIND_TO,
                 hostfile: str | None = None, mpi_args: Sequence[str] = (),
                 controller_ip: str = "127.0.0.1", location: str | None = None,
                 engine_timeout: float = 60, stop_timeout: float = 10,
                 env: Mapping[str, str] | None = None, oversubscribe: bool | None = None,
                 curve: bool | None = None, interrupt_timeout: float = 10) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        check_listen_address(controller_ip)
        self.n = n
        self.map_by, self.bind_to, self.hostfile = map_by, bind_to, hostfile
        self.mpi_args = list(mpi_args)
        self.controller_ip, self.location = controller_ip, location
        self.curve = not controller_ip.startswith("127.") if curve is None else curve
        self.engine_timeout, self.stop_timeout = engine_timeout, stop_timeout
        self.interrupt_timeout = interrupt_timeout
        self.last_interrupt: str | None = None
        """What the last interrupt did (the line it printed), ``None`` before one."""
        self.env = dict(env or {})
        self.oversubscribe = (n > usable_cores() and hostfile is None
                              if oversubscribe is None else oversubscribe)
        # ipyparallel's Cluster, Client and broadcast view (untyped); None until start()
        self.cluster: Any = None
        self.client: Any = None
        self.view: Any = None
        self.engine_pids: list[int] = []
        self._ranks: list[int] = []
        self.last_outputs: list[str] = []
        self._tracked: dict[int, Any] = {}
        """pid -> the ``psutil.Process`` captured when it was first seen: signalled later
        only if it is still that process (psutil checks its start time), never a process
        that got the pid after it exited."""
        self._profile_dir: str | None = None
        self.profile_parent: str | None = None  # where the private profile folder is made
        self.start_seconds: float | None = None
        self.exposure: str | None = None  # who could reach mpiexec's listener (start())
        self.stop_seconds: float | None = None
        self._started_at: float | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self.lifeline: str | None = None
        """The token every process of the running cluster carries (``CHEXNET_LIFELINE``)."""

    def env_overrides(self) -> dict[str, str]:
        """What the controller and engines get on top of this process's environment:
        :func:`mpi_env_overrides` for ``n`` engines bound as ``bind_to``, then ``env``."""
        return {**mpi_env_overrides(self.n, bind_to=self.bind_to), **self.env}

    # -- life cycle -----------------------------------------------------------------------
    def _mpiexec_args(self) -> list[str]:
        args: list[str] = []
        if self.map_by:
            args += ["--map-by", self.map_by]
        if self.bind_to and not mpirun_option_given(self.mpi_args, "bind-to"):
            args += ["--bind-to", self.bind_to]
        if self.hostfile:
            args += ["--hostfile", self.hostfile]
        if self.oversubscribe:
            args += ["--oversubscribe"]
        if self.hostfile is None and self.controller_ip.startswith("127."):
            # One machine: ranks talk through shared memory (no TCP transport listening on
            # the network) and the runtime's own traffic stays on loopback. Open MPI 4.1's
            # mpiexec still opens an out-of-band listener on all interfaces (no setting
            # binds it to one address): firewall it on shared machines.
            args += ["--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo"]
        return args + self.mpi_args

    def ipyparallel_config(self, cfg: Config, extra_env: Mapping[str, str] | None = None
                           ) -> dict[str, object]:
        """Put this cluster's launcher settings into ``cfg`` (a traitlets ``Config``) and
        return the ``ipyparallel.Cluster`` settings (engine launcher, ``n``, controller
        address, engine timeout): what :meth:`start` passes, and what the JupyterLab
        sidebar's ``chexnet-mpi`` profile uses (:func:`configure_mpi_profile`). The
        controller and engines get :meth:`env_overrides` plus ``extra_env``; the controller
        pings every :data:`HEARTBEAT_MS`."""
        env = {**self.env_overrides(), **(extra_env or {})}
        cfg.LocalControllerLauncher.environment = {
            **env, "IPP_ENABLE_CURVE": "1" if self.curve else "0"}
        settings: dict[str, object] = {
            "engine_launcher_class": self._engine_launcher(cfg, env), "n": self.n,
            "controller_ip": self.controller_ip, "engine_timeout": int(self.engine_timeout),
            "controller_args": [f"--HeartMonitor.period={HEARTBEAT_MS}",
                                f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}"]}
        cfg.EngineLauncher.engine_args = [
            f"--IPEngine.max_heartbeat_misses={ENGINE_HEARTBEAT_MISSES}"]
        if self.location:
            settings["controller_location"] = self.location
        return settings

    def _before_engines(self) -> None:
        """Called in :meth:`start` once the ipyparallel cluster object exists, before any
        process is started (subclasses tell the watchdog what else to clean up)."""

    def _engine_launcher(self, cfg: Config, env: Mapping[str, str]) -> str:
        """Configure the engines' launcher in ``cfg`` (a traitlets ``Config``); return its
        ipyparallel name. Here ``mpiexec`` on this machine; subclasses start engines
        elsewhere (:class:`chexnet_utils.cluster.slurm_engines.SlurmCluster`: a Slurm job)."""
        cfg.MPIEngineSetLauncher.mpi_args = self._mpiexec_args()
        cfg.MPIEngineSetLauncher.environment = dict(env)
        return "mpi"

    def start(self) -> "MPICluster":
        """Start the controller and the MPI engines; wait until all ``n`` engines are up."""
        import ipyparallel as ipp
        from traitlets.config import Config

        from chexnet_utils.cluster.engine_interrupts import settle_on_sigint

        if self.cluster is not None:
            raise RuntimeError("cluster already started")
        t0 = time.perf_counter()
        self._started_at = time.time()
        self._profile_dir = tempfile.mkdtemp(prefix="chexnet-ipp-",  # mode 0700
                                             dir=self.profile_parent)
        os.chmod(self._profile_dir, 0o700)
        cfg = Config()

        self.lifeline = f"ipp-{os.getpid()}-{secrets.token_hex(4)}"
        self._watchdog = start_watchdog(os.getpid(), self.lifeline)
        watchdog_remove_on_death(self._watchdog, self._profile_dir)  # a dead kernel leaves none
        try:
            settings = self.ipyparallel_config(
                cfg, {LIFELINE_ENV: ",".join([*lifeline_tokens(), self.lifeline])})
            self.cluster = ipp.Cluster(profile_dir=self._profile_dir, config=cfg,
                                       shutdown_atexit=True, log_level=40, **settings)
            self._before_engines()
            self.client = self.cluster.start_and_connect_sync()
            settle_on_sigint(self.client, self._after_interrupt)
            self._secure_connection_files()
            # cloudpickle: functions and closures defined in a notebook travel by value
            self.client[:].use_cloudpickle()
            self.view = self.client.broadcast_view()
            self.view.block = True
            self.engine_pids = list(self.view.apply_sync(os.getpid))
            self._ranks = [int(r) for r in self.view.apply_sync(mpi_rank)]
            self._track_processes()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.perf_counter() - t0
        # mpiexec listens on every interface
        from chexnet_utils.platform.exposure import announce_reach

        self.exposure = announce_reach("mpiexec's out-of-band listener", "[MPICluster]")
        return self

    def busy_engines(self) -> list[int]:
        """Ids (= MPI ranks) of the engines running (or queued) a task of this client."""
        from chexnet_utils.cluster.engine_interrupts import pending_tasks

        return sorted(pending_tasks(self.client))

    def interrupt(self) -> str:
        """Send SIGINT to the engines that are running something, as the stop button does
        for a ``%%px`` cell, and wait until their tasks have ended (see the class notes).
        Returns the line it printed."""
        if self.client is None:
            return "the cluster is not running: nothing to interrupt"
        busy = self.busy_engines()
        if not busy:
            self.last_interrupt = "no engine was busy: nothing to interrupt"
            return self.last_interrupt
        self.client.send_signal(signal.SIGINT, targets=busy, block=True)
        return self.last_interrupt or ""

    def _after_interrupt(self) -> None:
        """Wait up to ``interrupt_timeout`` s for the interrupted tasks; stop the cluster if
        an engine is still busy then (or on a second interrupt). Prints what happened."""
        from chexnet_utils.cluster.engine_interrupts import wait_for_tasks

        settled = wait_for_tasks(self.client, self.interrupt_timeout)
        ranks = ", ".join(map(str, settled.busy)) or "(none)"
        if settled.done:
            self._say(f"interrupted: engine(s) {ranks} stopped their task within "
                      f"{settled.seconds:.1f} s (KeyboardInterrupt there); the cluster is "
                      "ready for the next cell")
            return
        why = "interrupted again while waiting for them" if settled.interrupted_again else (
            f"still busy {self.interrupt_timeout:.0f} s after the interrupt (a call that "
            "ignores SIGINT, e.g. an MPI or Horovod collective waiting for a rank that stopped)")
        n = self.n
        self.stop()
        self._say(f"interrupted: engine(s) {', '.join(map(str, settled.still_busy))} {why}; "
                  "the MPI job cannot go on, so the cluster was stopped and all its processes "
                  f"are gone. Start a new one to go on: cluster = MPICluster(n={n}).start()")

    def _say(self, line: str) -> None:
        self.last_interrupt = line
        print(f"[MPICluster] {line}", file=sys.stderr, flush=True)

    def _secure_connection_files(self) -> None:
        assert self._profile_dir is not None
        make_private(self._profile_dir)

    def _launcher_pids(self) -> list[int]:
        if self.cluster is None:
            return []
        launchers = [self.cluster.controller, *self.cluster.engines.values()]
        return [int(pid) for launcher in launchers if (pid := getattr(launcher, "pid", None))]

    def _track(self, pid: int, with_children: bool = True) -> None:
        """Remember process ``pid`` (and, with ``with_children``, every process below it) as
        ``psutil.Process`` objects, captured now."""
        try:
            proc = self._tracked.get(pid) or psutil.Process(pid)
            self._tracked.setdefault(pid, proc)
            for child in proc.children(recursive=True) if with_children else ():
                self._tracked.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass

    def _track_processes(self) -> None:
        """Remember every process the cluster started: launchers and all their children."""
        for pid in [*self._launcher_pids(), *self.engine_pids]:
            self._track(pid)

    def pids(self) -> set[int]:
        """Pids of every process this cluster started (for checks that nothing is left)."""
        self._track_processes()
        return set(self._tracked)

    def stop(self) -> None:
        """Stop engines and controller; wait for all their processes; kill stragglers."""
        t0 = time.perf_counter()
        if self.cluster is not None:
            with suppress(Exception):
                self._track_processes()
            if self.client is not None:
                with suppress(Exception):
                    self.client.close()
            with suppress(Exception):
                self._terminate_local_engines()
            with suppress(Exception):
                self.cluster.stop_cluster_sync()

        def orphaned_nanny(proc: Any) -> bool:  # it would notice at its next poll (~3 s)
            parent = proc.ppid()  # an orphaned nanny was re-parented
            return "ipyparallel.engine.nanny" in " ".join(proc.cmdline()) and not (
                parent in self.engine_pids and pid_alive(parent))

        # captured while they ran (no reused pid); told to stop, they get stop_timeout
        stop_within(list(self._tracked.values()), self.stop_timeout, kill_at_once=orphaned_nanny)
        if self._profile_dir:
            shutil.rmtree(self._profile_dir, ignore_errors=True)
        if self._started_at is not None:  # shared memory of engines killed with SIGKILL
            remove_orphan_shm_segments(since=self._started_at)
        self.cluster = self.client = self.view = None
        release_watchdog(self._watchdog)  # stops what still carries the token: normally none
        self._watchdog = self.lifeline = None
        self.stop_seconds = time.perf_counter() - t0

    def _terminate_local_engines(self, timeout: float = 2.0) -> list[Any]:
        """SIGTERM the engines below this cluster's ``mpiexec``, wait up to ``timeout`` s, SIGKILL
        the rest (a busy engine ignores SIGTERM), as ``mpiexec`` would in 2 s whatever they do
        (:data:`chexnet_utils.platform.processes.MPIEXEC_KILL_SEQUENCE`). Engines elsewhere
        (another host, a Slurm job) are left to their launcher. Returns those that outlived the
        SIGTERM."""
        from ipyparallel.cluster.launcher import MPILauncher

        if self.cluster is not None:
            launchers = [lc.process for lc in self.cluster.engines.values()
                         if isinstance(lc, MPILauncher) and lc.process is not None]
            engines = [p for pid, p in self._tracked.items() if pid in self.engine_pids]
            stop_within(survivors := terminate_below(launchers, engines, timeout), 0.0)
            return survivors
        return []

    def __enter__(self) -> "MPICluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill_engine(self, rank: int) -> int:
        """SIGKILL the engine of MPI rank ``rank`` (fault drills); returns its pid."""
        pid = self.engine_pids[self._ranks.index(rank)]
        psutil.Process(pid).kill()
        return pid

    def kill_engine_when(self, rank: int, path: str | os.PathLike[str],
                         timeout: float = 300) -> "threading.Thread":
        """Fault drill: in a background thread, wait until ``path`` exists (for example the
        first checkpoint), then kill the engine of ``rank``. Returns the started thread."""

        def watch() -> None:
            deadline = time.time() + timeout
            while time.time() < deadline and not os.path.exists(path):
                time.sleep(0.2)
            if os.path.exists(path) and self.cluster is not None:
                self.kill_engine(rank)

        thread = threading.Thread(target=watch, daemon=True, name=f"kill-rank-{rank}")
        thread.start()
        return thread

    # -- running work ----------------------------------------------------------------------
    def _engines_alive(self) -> bool:
        if self.cluster is None:
            return False

        if not all(pid_alive(pid) for pid in self.engine_pids):
            return False
        return all(getattr(es, "running", True) for es in self.cluster.engines.values())

    def run(self, fn, *args, timeout: float | None = None, stream_rank0: bool = True,
            poll: float = 0.5, **kwargs):  # noqa: ANN001, ANN201
        """Run ``fn(*args, **kwargs)`` on every engine; return the results in rank order.

        Engines are in MPI rank order (an MPI engine's id is its rank). With
        ``stream_rank0`` the output that rank 0 prints appears here while it runs; the other
        ranks' output is not shown (many progress bars would flood Jupyter's IOPub channel)
        and is kept in ``self.last_outputs``.

        Raises :class:`EngineFailure` when an engine process dies (the whole MPI job is then
        lost: Open MPI ends every rank when one dies) or after ``timeout`` seconds, instead
        of waiting forever for a collective that can no longer complete.
        """
        if self.view is None:
            raise RuntimeError("cluster is not running: use it in a with block or call start()")
        ar = self.view.apply_async(fn, *args, **kwargs)
        t0 = time.perf_counter()
        shown = 0
        rank0 = self._ranks.index(0) if 0 in self._ranks else 0
        order = sorted(range(len(self._ranks)), key=self._ranks.__getitem__)
        try:
            while not ar.ready():
                ar.wait(poll)
                if stream_rank0:
                    out = ar.stdout[rank0] if ar.stdout else ""
                    if len(out) > shown:
                        sys.stdout.write(out[shown:])
                        sys.stdout.flush()
                        shown = len(out)
                if not ar.ready() and not self._engines_alive():
                    ar.wait(2 * poll)  # let a last error message arrive
                    if not ar.ready():
                        raise EngineFailure(
                            f"an MPI engine died while running {getattr(fn, '__name__', fn)}; "
                            "the MPI job cannot continue (tear the cluster down and start a "
                            "new one; training resumes from the last checkpoint)")
                if timeout is not None and time.perf_counter() - t0 > timeout:
                    raise EngineFailure(f"{getattr(fn, '__name__', fn)} did not finish within "
                                        f"{timeout:.0f} s on {self.n} engines")
            if stream_rank0 and ar.stdout and len(ar.stdout[rank0]) > shown:
                sys.stdout.write(ar.stdout[rank0][shown:])
            self.last_outputs = [ar.stdout[i] for i in order]
            try:
                results = list(ar.get())
                return [results[i] for i in order] if len(order) == len(results) else results
            except Exception as e:
                if engine_died(e):
                    raise EngineFailure(f"an engine died: {e}") from e
                raise
        except KeyboardInterrupt:
            try:
                ar.abort()  # tasks not started yet
                if not ar.ready():
                    self.interrupt()  # the running ones: SIGINT, wait, or stop the cluster
            except Exception:
                pass
            raise

