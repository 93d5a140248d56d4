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
lifeline token of :mod:`chexnet_utils.platform.processes` (inherited environment) and a parent-death
signal, so a killed, restarted or shut-down kernel or command leaves nothing behind;
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
from typing import TYPE_CHECKING, Any

from chexnet_utils.hardware.devices import usable_cpus
from chexnet_utils.platform.exposure import require_private_network
from chexnet_utils.platform.processes import set_parent_death_signal, wait_gone

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = [
    "PROCESSING_MODES",
    "ServiceProcess",
    "ServiceStalled",
    "TFDataService",
    "bench_service",
    "distribute",
    "format_bench_service",
    "next_within",
    "port_open",
    "trainer_run",
]

PROCESSING_MODES: tuple[str, ...] = ("parallel_epochs", "distributed_epoch")
"""The two processing modes of ``tf.data.experimental.service.distribute``."""

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


def _role_command(role: str, args: Sequence[str], cpus: Sequence[int] | None = None,
                  extra_env: Mapping[str, str] | None = None
                  ) -> tuple[list[str], dict[str, str]]:
    """Command line and environment of one of this module's processes (``dispatcher``,
    ``worker``, ``trainer``): this interpreter, ``--parent`` this process (its lifeline),
    pinned to ``cpus`` if given. The environment carries ``CHEXNET_LIFELINE`` (so the
    command's watchdog sees the child) and quiet TensorFlow logs unless ``extra_env`` says
    otherwise."""
    cmd = [sys.executable, "-m", "chexnet_utils.input.tfdata_service", role,
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
    and :meth:`add_worker` first ask :func:`chexnet_utils.platform.exposure.require_private_network`
    (a :class:`~chexnet_utils.platform.exposure.SharedHostError` where other accounts could reach
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
        cmd, env = _role_command(role, args, cpu_t, self.env)
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
        import psutil

        procs = list(reversed(self.processes))
        for p in procs:
            if p.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.popen.terminate()
        ps = []
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                ps.append(psutil.Process(p.pid))
        left = wait_gone(ps, timeout)
        for q in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                q.kill()
        left = wait_gone(left, 5.0)
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=1.0)
            if p.popen.stdout is not None:
                p.popen.stdout.close()
        deadline = time.monotonic() + 5.0
        open_ports = [p.port for p in procs if p.port]
        while open_ports and time.monotonic() < deadline:
            open_ports = [port for port in open_ports if port_open(port)]
            if open_ports:
                time.sleep(0.1)
        report = {"stopped": [p.pid for p in procs], "left": [q.pid for q in left],
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


def distribute(dataset: tf.data.Dataset, service: str, processing_mode: str,
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
    import tensorflow as tf

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
# bench service: a one-core trainer, decoding locally vs fed by a service worker
# --------------------------------------------------------------------------------------------

def _timed_steps(step: Any, it: Iterator[Any], n_steps: int, warmup: int) -> float:
    """Training images/s over ``n_steps`` steps pulled from ``it`` after ``warmup`` steps."""
    from chexnet_utils.bench.bench_timing import batch_len, block

    for _ in range(warmup):
        block(step(next_within(it, 120)))
    images = 0
    t0 = time.perf_counter()
    for _ in range(n_steps):
        b = next_within(it, 120)
        block(step(b))
        images += batch_len(b)
    return images / (time.perf_counter() - t0)


def _drain(it: Iterator[Any], slow_s: float, limit: int = 500) -> int:
    """Take (untimed) what the service buffered while the trainer did something else: pull
    elements until one takes longer than ``slow_s`` to arrive (it had to be produced).
    Returns how many were taken."""
    for n in range(limit):
        t0 = time.perf_counter()
        next_within(it, 120)
        if time.perf_counter() - t0 > slow_s:
            return n + 1
    return limit


def trainer_run(tfrecords_dir: str, target: str, image_size: int = 128, batch_size: int = 16,
                n_steps: int = 30, warmup: int = 5, repeats: int = 2, split: str = "train",
                processing_mode: str = "parallel_epochs", arch: str = "small",
                seed: int = 0, prefetch: int = 4) -> dict[str, Any]:
    """The trainer of :func:`bench_service`, run in a process confined to its cores (one).

    Measures, in this order: ``c``, seconds of training compute per image (steps on one
    constant batch); ``d``, seconds of decoding per image (the new pipeline alone, nothing
    consuming); then ``repeats`` alternating runs of training fed by the new pipeline run
    **locally** (decode and compute share the core: about ``d + c`` per image) and fed by the
    **service** (``distribute(...)``: the trainer only computes, about ``max(d, c)``), with
    ``prefetch`` received batches buffered on the trainer (when ``d`` and ``c`` are close, a
    step that happens to be slow on either side would otherwise stall the other). Call
    with TensorFlow configured to one intra/inter-op thread before this point.
    """
    import statistics

    import keras

    from chexnet_utils.bench.bench_pipeline import time_pipeline
    from chexnet_utils.bench.bench_training import synthetic_rate, train_step_fn
    from chexnet_utils.data.tfrecords import list_shards
    from chexnet_utils.input.pipelines import new_approach
    from chexnet_utils.model.models import build_chexnet

    files = list_shards(tfrecords_dir, split)
    if not files:
        raise ValueError(f"{tfrecords_dir}: no {split} shards")

    def pipeline() -> tf.data.Dataset:
        return new_approach(files, batch_size, image_size, training=True, seed=seed)

    keras.utils.set_random_seed(seed)
    model = build_chexnet(arch, image_size)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy")
    step = train_step_fn(model)
    first = next(iter(pipeline()))
    batch = (first[0], first[1])
    runs: dict[str, list[float]] = {"local": [], "service": [], "compute": [], "decode": []}
    # One service job for all runs (its worker starts once); each service run first takes
    # `warmup` untimed steps, which also drain what the worker buffered meanwhile.
    service_it = iter(distribute(pipeline(), target, processing_mode).prefetch(prefetch))
    _timed_steps(step, service_it, 1, 2 * warmup)
    for _ in range(repeats):  # c, d, local, service: each repeat measures all four
        runs["compute"].append(synthetic_rate(step, batch, n_steps)[0])
        runs["decode"].append(time_pipeline(pipeline(), n_steps, warmup, 1).mean)
        it = iter(pipeline())
        runs["local"].append(_timed_steps(step, it, n_steps, warmup))
        del it
        # a batch made on the worker's core takes about batch_size x d: half of that means
        # "not from a buffer"
        _drain(service_it, 0.5 * batch_size / runs["decode"][-1])
        runs["service"].append(_timed_steps(step, service_it, n_steps, warmup))
    del service_it
    return {"compute_img_per_s": statistics.fmean(runs["compute"]),
            "decode_img_per_s": statistics.fmean(runs["decode"]),
            "compute_img_per_s_runs": runs["compute"], "decode_img_per_s_runs": runs["decode"],
            "local_img_per_s_runs": runs["local"], "service_img_per_s_runs": runs["service"],
            "n_files": len(files), "model": model.name, "arch": arch}


def bench_service(tfrecords_dir: str | os.PathLike[str], image_size: int = 128,
                  batch_size: int = 16, n_steps: int = 30, warmup: int = 5, repeats: int = 2,
                  split: str = "train", processing_mode: str = "parallel_epochs",
                  arch: str = "small", trainer_cpus: Iterable[int] = (0,),
                  worker_cpus: Iterable[int] = (1,), timeout: float = 900.0,
                  log: Any = None) -> dict[str, Any]:
    """A GPU host whose cores are all busy, on a CPU: local decoding vs a tf.data service.

    The trainer is a separate process pinned to ``trainer_cpus`` (one core) with one
    intra/inter-op thread: it trains the CPU-sized model (compute ``c`` per image) and, in
    the local runs, also decodes the full-size shards (``d`` per image), so a step costs
    about ``d + c``. In the service runs a worker process pinned to ``worker_cpus`` decodes
    and the trainer only computes: about ``max(d, c)``. Returns a JSON-ready dict with
    ``local_img_per_s``, ``service_img_per_s``, ``service_over_local``, ``d_ms``, ``c_ms``,
    ``predicted_speedup = (d + c) / max(d, c)``, ``bytes_per_image`` (what the service
    ships per image), and the parameters.
    """
    import statistics

    say = log or (lambda _msg: None)
    trainer_cpus, worker_cpus = tuple(trainer_cpus), tuple(worker_cpus)
    if set(trainer_cpus) & set(worker_cpus):
        raise ValueError("trainer and service worker must run on different cores")
    avail = set(usable_cpus())
    if not set(trainer_cpus) | set(worker_cpus) <= avail:
        raise ValueError(f"cores {sorted(set(trainer_cpus) | set(worker_cpus))} not all "
                         f"available (this process may use {sorted(avail)})")
    load_start = list(os.getloadavg())
    say(f"starting a tf.data service (dispatcher + 1 worker on core(s) {list(worker_cpus)})")
    with TFDataService(num_workers=1, worker_cpus=[worker_cpus],
                       dispatcher_cpus=worker_cpus) as svc:
        say(f"trainer on core(s) {list(trainer_cpus)}: measuring c, d, then local vs service")
        cmd, env = _role_command("trainer", [
            "--tfrecords", str(tfrecords_dir), "--target", svc.target,
            "--image-size", str(image_size), "--batch-size", str(batch_size),
            "--steps", str(n_steps), "--warmup", str(warmup), "--repeats", str(repeats),
            "--split", split, "--mode", processing_mode, "--arch", arch], trainer_cpus)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        stop_report = svc.stop()
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the trainer failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[-2000:]}")
    r = json.loads(lines[-1])
    local = statistics.fmean(r["local_img_per_s_runs"])
    service = statistics.fmean(r["service_img_per_s_runs"])
    d, c = 1.0 / r["decode_img_per_s"], 1.0 / r["compute_img_per_s"]
    r.update(
        local_img_per_s=local, service_img_per_s=service,
        service_over_local=service / local, d_ms=1000 * d, c_ms=1000 * c,
        predicted_local_img_per_s=1.0 / (d + c), predicted_service_img_per_s=1.0 / max(d, c),
        predicted_speedup=(d + c) / max(d, c),
        bytes_per_image=image_size * image_size * 3 * 4,
        service_MB_per_s=service * image_size * image_size * 3 * 4 / 1e6,
        trainer_cpus=list(trainer_cpus), worker_cpus=list(worker_cpus),
        processing_mode=processing_mode, image_size=image_size, batch_size=batch_size,
        n_steps=n_steps, warmup=warmup, repeats=repeats, split=split,
        tfrecords_dir=str(tfrecords_dir), service_stopped_cleanly=not (
            stop_report["left"] or stop_report["open_ports"]),
        load_average_start=load_start, load_average=list(os.getloadavg()))
    r["service_over_predicted"] = r["service_over_local"] / r["predicted_speedup"]
    return r


def format_bench_service(r: dict[str, Any]) -> str:
    """The result of :func:`bench_service` as a small table."""
    return "\n".join([
        f"one-core trainer (core(s) {r['trainer_cpus']}), {r['arch']} model at "
        f"{r['image_size']} px, batch {r['batch_size']}; service worker on core(s) "
        f"{r['worker_cpus']} ({r['processing_mode']})",
        f"  decode d = {r['d_ms']:.1f} ms/image, compute c = {r['c_ms']:.1f} ms/image",
        f"  {'':<22}{'measured':>10}{'predicted':>11}",
        f"  {'local (d + c)':<22}{r['local_img_per_s']:>10.1f}"
        f"{r['predicted_local_img_per_s']:>11.1f}  images/s",
        f"  {'service (max(d, c))':<22}{r['service_img_per_s']:>10.1f}"
        f"{r['predicted_service_img_per_s']:>11.1f}  images/s",
        f"  {'service / local':<22}{r['service_over_local']:>9.2f}x"
        f"{r['predicted_speedup']:>10.2f}x",
        f"  load average (1 min) at the start {r['load_average_start'][0]:.2f}, at the end "
        f"{r['load_average'][0]:.2f} (other jobs on the cores distort the figures)",
    ])


def _trainer_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m chexnet_utils.input.tfdata_service trainer")
    p.add_argument("--parent", type=int, default=None)
    p.add_argument("--cpus", default="0")
    p.add_argument("--tfrecords", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--split", default="train")
    p.add_argument("--mode", default="parallel_epochs", choices=PROCESSING_MODES)
    p.add_argument("--arch", default="small")
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    set_parent_death_signal(signal.SIGKILL, a.parent)
    os.sched_setaffinity(0, {int(c) for c in a.cpus.split(",")})
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    r = trainer_run(a.tfrecords, a.target, a.image_size, a.batch_size, a.steps, a.warmup,
                    a.repeats, a.split, a.mode, a.arch)
    print(json.dumps(r), flush=True)
    return 0


# --------------------------------------------------------------------------------------------
# The service processes: python -m chexnet_utils.input.tfdata_service dispatcher|worker ...
# --------------------------------------------------------------------------------------------

def _serve(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # die at once on SIGTERM
    set_parent_death_signal(signal.SIGKILL, args.parent)
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    import tensorflow as tf

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
    """Entry point of the dispatcher, worker and bench-trainer processes."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["trainer"]:
        return _trainer_main(argv[1:])
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
