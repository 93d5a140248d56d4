"""tf.data service: preprocessing on other processes' (other machines') CPUs.

When the accelerator host's cores are all busy (training, communication, the framework's own
threads), the new pipeline of :mod:`chexnet_utils.input.pipelines` is at its ceiling: there is no
core left to decode on. The tf.data service moves the pipeline to *other* CPUs:

* a **dispatcher** (``tf.data.experimental.service.DispatchServer``) keeps the list of
  workers and hands out the work of each job;
* **workers** (``WorkerServer``) run the ``tf.data`` pipeline and keep decoded batches ready;
* the **trainer** applies ``dataset.apply(tf.data.experimental.service.distribute(
  processing_mode, service))``: the graph of the pipeline is sent to the dispatcher, and the
  trainer's iterator receives finished batches over gRPC instead of running the pipeline.

Processing modes: ``"parallel_epochs"`` - every worker runs the *whole* data set, so with k
workers a trainer sees each example k times per epoch (fine for shuffled, repeated training
data, wrong for evaluation); ``"distributed_epoch"`` - the dispatcher splits the source (the
file names) among workers, so each example is produced **exactly once** per epoch.

This module starts the dispatcher and the workers as separate processes on 127.0.0.1
(``python -m chexnet_utils.input.tfdata_service dispatcher|worker ...``), each announcing the port
the OS gave it, optionally pinned to given cores (``os.sched_setaffinity``). They carry the
lifeline token of :mod:`chexnet_utils.platform.processes` (inherited environment) and a
parent-death signal, so a killed, restarted or shut-down kernel or command leaves nothing behind;
:meth:`TFDataService.stop` terminates them, waits until they are gone and checks that their
ports are closed. Each runs in a session of its own, so the notebook's Interrupt (SIGINT to
the kernel's process group) leaves the service running.
Clients and workers reach the dispatcher at 127.0.0.1, but TensorFlow's gRPC servers listen on
every interface of the host (``DispatcherConfig`` / ``WorkerConfig`` have a port, no bind
address): on a machine with a public interface, firewall those ports, or run the service on
a private network only.

A worker that dies mid-epoch does not make the trainer's ``next()`` fail: the client keeps
retrying, waiting for the worker (or a replacement) to come back. :func:`next_within` bounds
that wait and raises :class:`ServiceStalled` instead, so the trainer finds out in bounded
time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from chexnet_utils.platform.exposure import require_private_network
from chexnet_utils.platform.lazy import lazy_module
from chexnet_utils.platform.processes import set_parent_death_signal, stop_processes

if TYPE_CHECKING:
    import tensorflow as tf

# TensorFlow: imported on first use (chexnet_utils.platform.lazy)
if not TYPE_CHECKING:
    tf = lazy_module("tensorflow")

__all__ = [
    "PROCESSING_MODES",
    "ProcessingMode",
    "ServiceProcess",
    "ServiceStalled",
    "TFDataService",
    "distribute",
    "next_within",
    "port_open",
    "role_command",
]

ProcessingMode = Literal["parallel_epochs", "distributed_epoch"]
"""The two processing modes of ``tf.data.experimental.service.distribute`` (module
docstring): the type of every ``processing_mode`` parameter."""
PROCESSING_MODES: tuple[str, ...] = get_args(ProcessingMode)

HOST = "127.0.0.1"
_READY_TIMEOUT_S = 60.0


class ServiceStalled(TimeoutError):
    """The tf.data service delivered no element within the allowed time (a dead worker, a
    dead dispatcher, or a network partition: the client itself would keep retrying)."""


@dataclass
class ServiceProcess:
    """One dispatcher or worker process."""

    role: str
    popen: subprocess.Popen[str]
    port: int
    cpus: tuple[int, ...] | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"


def role_command(role: str, args: Sequence[str], cpus: Sequence[int] | None = None,
                 extra_env: Mapping[str, str] | None = None, module: str = __name__
                 ) -> tuple[list[str], dict[str, str]]:
    """Command line and environment of one of this module's processes (``dispatcher``,
    ``worker``; ``module`` another one's, as the ``trainer`` of
    :mod:`chexnet_utils.bench.service`): this interpreter, ``--parent`` this process (its
    lifeline), pinned to ``cpus`` if given. The environment carries ``CHEXNET_LIFELINE`` (so the
    command's watchdog sees the child) and quiet TensorFlow logs unless ``extra_env`` says
    otherwise."""
    cmd = [sys.executable, "-m", module, role,
           "--parent", str(os.getpid()), *args]
    if cpus is not None:
        cmd += ["--cpus", ",".join(map(str, cpus))]
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra_env or {})
    return cmd, env


def port_open(port: int, host: str = HOST, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout):
        return True
    return False


def _read_ready(proc: subprocess.Popen[str], role: str, timeout: float) -> int:
    """Wait for the child's ``{"ready": port}`` line on stdout; return the port."""
    box: dict[str, Any] = {}

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.strip()
            if line.startswith("{") and '"ready"' in line:
                box["port"] = int(json.loads(line)["ready"])
                return

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(timeout)
    if "port" not in box:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        raise RuntimeError(f"tf.data service {role} did not start within {timeout:.0f} s "
                           f"(exit code {proc.returncode})")
    return box["port"]


class TFDataService:
    """A dispatcher and ``num_workers`` workers, each a separate process on 127.0.0.1.

    Use as a context manager (stopped on exit, even on errors)::

        with TFDataService(num_workers=1, worker_cpus=[{1}]) as svc:
            ds = distribute(pipeline, svc.target, "distributed_epoch")
            for batch in ds: ...

    ``worker_cpus[i]`` pins worker ``i`` (and its tf.data threads) to those cores;
    ``dispatcher_cpus`` the dispatcher. ``heartbeat_ms`` is how often workers report to the
    dispatcher, ``worker_timeout_ms`` how long the dispatcher waits before declaring a
    silent worker dead.

    The servers run any graph a client sends, unauthenticated, on ``[::]``: :meth:`start`
    and :meth:`add_worker` first ask
    :func:`chexnet_utils.platform.exposure.require_private_network` (a
    :class:`~chexnet_utils.platform.exposure.SharedHostError` where other accounts could reach
    them, before any process starts) and keep its answer in :attr:`exposure`.
    """

    def __init__(self, num_workers: int = 1,
                 worker_cpus: Sequence[Iterable[int] | None] | None = None,
                 dispatcher_cpus: Iterable[int] | None = None, heartbeat_ms: int = 500,
                 worker_timeout_ms: int = 5000, env: dict[str, str] | None = None) -> None:
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if worker_cpus is not None and len(worker_cpus) != num_workers:
            raise ValueError(f"{len(worker_cpus)} worker_cpus entries for {num_workers} "
                             "worker(s)")
        self.num_workers = num_workers
        self.worker_cpus = list(worker_cpus) if worker_cpus is not None else [None] * num_workers
        self.dispatcher_cpus = dispatcher_cpus
        self.heartbeat_ms = heartbeat_ms
        self.worker_timeout_ms = worker_timeout_ms
        self.env = env
        self.dispatcher: ServiceProcess | None = None
        self.workers: list[ServiceProcess] = []
        self.exposure: str | None = None
        """Who can reach the servers (one line, from the last start or added worker)."""

    # -- lifecycle -------------------------------------------------------------------------
    def _spawn(self, role: str, args: list[str], cpus: Iterable[int] | None) -> ServiceProcess:
        proc, cpu_t = self._launch(role, args, cpus)
        return ServiceProcess(role, proc, _read_ready(proc, role, _READY_TIMEOUT_S), cpu_t)

    def _launch(self, role: str, args: list[str], cpus: Iterable[int] | None
                ) -> tuple[subprocess.Popen[str], tuple[int, ...] | None]:
        cpu_t = tuple(sorted(cpus)) if cpus is not None else None
        cmd, env = role_command(role, args, cpu_t, self.env)
        # In a session of its own: the notebook's Interrupt sends SIGINT to the kernel's
        # process group, and a service starting up (importing TensorFlow) would die of it;
        # it still dies with this process (parent-death signal, lifeline token).
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, text=True, env=env,
                                start_new_session=True)
        return proc, cpu_t

    def start(self) -> TFDataService:
        """Start the dispatcher, then the workers; return once every worker has registered."""
        if self.dispatcher is not None:
            raise RuntimeError("the service is already running")
        self.exposure = require_private_network("tf.data service")
        try:
            self.dispatcher = self._spawn(
                "dispatcher", ["--worker-timeout-ms", str(self.worker_timeout_ms)],
                self.dispatcher_cpus)
            # the workers start side by side (each imports TensorFlow: seconds)
            launched = [self._launch("worker", self._worker_args(), cpus)
                        for cpus in self.worker_cpus]
            for proc, cpu_t in launched:
                self.workers.append(ServiceProcess("worker", proc, 0, cpu_t))
            for w in self.workers:
                w.port = _read_ready(w.popen, "worker", _READY_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        return self

    def add_worker(self, cpus: Iterable[int] | None = None) -> ServiceProcess:
        """Start one more worker (e.g. to replace a dead one)."""
        if self.dispatcher is None:
            raise RuntimeError("start the service first")
        self.exposure = require_private_network("tf.data service")
        w = self._spawn("worker", self._worker_args(), cpus)
        self.workers.append(w)
        return w

    def _worker_args(self) -> list[str]:
        assert self.dispatcher is not None
        return ["--dispatcher-port", str(self.dispatcher.port),
                "--heartbeat-ms", str(self.heartbeat_ms)]

    @property
    def target(self) -> str:
        """The service address for ``distribute(service=...)``: ``grpc://127.0.0.1:PORT``."""
        if self.dispatcher is None:
            raise RuntimeError("the service is not running")
        return f"grpc://{self.dispatcher.address}"

    @property
    def processes(self) -> list[ServiceProcess]:
        return ([self.dispatcher] if self.dispatcher else []) + list(self.workers)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    @property
    def ports(self) -> list[int]:
        return [p.port for p in self.processes]

    def kill_worker(self, index: int = 0, sig: int = signal.SIGKILL) -> int:
        """Kill worker ``index`` (default SIGKILL: no goodbye to the dispatcher); return its
        pid. The bad-input drill: a preprocessing machine that dies mid-epoch."""
        w = self.workers[index]
        with contextlib.suppress(ProcessLookupError):
            os.kill(w.pid, sig)
        w.popen.wait(timeout=10)
        return w.pid

    def stop(self, timeout: float = 10.0) -> dict[str, Any]:
        """SIGTERM every process (workers first), SIGKILL what is left after ``timeout`` s,
        wait until all are gone and their ports closed. Returns ``{"stopped": pids,
        "left": pids still running, "open_ports": ports still accepting}`` (both lists
        empty after a clean stop). Safe to call twice."""
        procs = list(reversed(self.processes))
        left = stop_processes([p.popen for p in procs], timeout)
        for p in procs:
            if p.popen.stdout is not None:
                p.popen.stdout.close()
        deadline = time.monotonic() + 5.0
        open_ports = [p.port for p in procs if p.port]
        while open_ports and time.monotonic() < deadline:
            open_ports = [port for port in open_ports if port_open(port)]
            if open_ports:
                time.sleep(0.1)
        report = {"stopped": [p.pid for p in procs], "left": left,
                  "open_ports": open_ports}
        self.dispatcher, self.workers = None, []
        return report

    def __enter__(self) -> TFDataService:
        return self.start() if self.dispatcher is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"dispatcher {self.target}" if self.dispatcher else "stopped"
        return f"TFDataService({state}, {len(self.workers)} worker(s))"


def distribute(dataset: tf.data.Dataset, service: str, processing_mode: ProcessingMode,
               job_name: str | None = None, max_outstanding_requests: int | None = None
               ) -> tf.data.Dataset:
    """``dataset`` run by the service's workers: the trainer's iterator only receives.

    ``processing_mode``: ``"parallel_epochs"`` (each worker runs the whole data set) or
    ``"distributed_epoch"`` (the source is split among workers: every example once per
    epoch). Decoded float batches do not compress well and compressing them costs the
    worker and the trainer CPU, so compression is off (on a slow network, ship encoded or
    uint8 data instead). ``job_name`` lets several trainers share one job (they then split
    the elements between them).
    """
    if processing_mode not in PROCESSING_MODES:
        raise ValueError(f"processing_mode must be one of {PROCESSING_MODES}, got "
                         f"{processing_mode!r}")
    return dataset.apply(tf.data.experimental.service.distribute(
        processing_mode=processing_mode, service=service, job_name=job_name,
        max_outstanding_requests=max_outstanding_requests, compression=None))


def next_within(it: Iterator[Any], timeout: float) -> Any:
    """``next(it)``, but raise :class:`ServiceStalled` when no element arrives within
    ``timeout`` seconds (``StopIteration`` at the end as usual).

    The tf.data service client retries a lost worker without limit (a restarted worker may
    come back), so a trainer whose only worker died would wait forever; this bounds it. The
    pending ``next`` keeps running in a daemon thread; stop the service to end it.
    """
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = next(it)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e
        done.set()

    threading.Thread(target=run, daemon=True, name="next_within").start()
    if not done.wait(timeout):
        raise ServiceStalled(f"no element from the tf.data service within {timeout:g} s "
                             "(is a worker or the dispatcher dead?)")
    if "error" in box:
        raise box["error"]
    return box["value"]


# --------------------------------------------------------------------------------------------
# The service processes: python -m chexnet_utils.input.tfdata_service dispatcher|worker ...
# --------------------------------------------------------------------------------------------

def _serve(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # die at once on SIGTERM
    set_parent_death_signal(signal.SIGKILL, args.parent)
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})

    svc = tf.data.experimental.service
    if args.role == "dispatcher":
        server = svc.DispatchServer(svc.DispatcherConfig(
            port=args.port, worker_timeout_ms=args.worker_timeout_ms))
        port = int(server.target.rsplit(":", 1)[1])
    else:
        server = svc.WorkerServer(svc.WorkerConfig(
            dispatcher_address=f"{HOST}:{args.dispatcher_port}", port=args.port,
            worker_address=f"{HOST}:%port%", heartbeat_interval_ms=args.heartbeat_ms))
        port = int(server._address.rsplit(":", 1)[1])  # noqa: SLF001 - no public accessor
    print(json.dumps({"ready": port, "pid": os.getpid()}), flush=True)
    server.join()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the dispatcher and worker processes."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m chexnet_utils.input.tfdata_service")
    p.add_argument("role", choices=("dispatcher", "worker"))
    p.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    p.add_argument("--dispatcher-port", type=int, default=None)
    p.add_argument("--parent", type=int, default=None, help="die when this pid dies")
    p.add_argument("--cpus", default=None, help="comma-separated cores to run on")
    p.add_argument("--heartbeat-ms", type=int, default=500)
    p.add_argument("--worker-timeout-ms", type=int, default=5000)
    args = p.parse_args(argv)
    if args.role == "worker" and args.dispatcher_port is None:
        p.error("worker needs --dispatcher-port")
    return _serve(args)


if __name__ == "__main__":
    raise SystemExit(main())
