"""Engines on other hosts: the controller on one interface, CurveZMQ on, keys kept private.

On one machine :class:`~chexnet_utils.cluster.distributed.MPICluster` keeps everything on loopback.
Once engines run on other hosts, the controller must listen on a network interface, and then
three things matter:

1. **Listen on that interface only** (``ip``), never on ``0.0.0.0``: nothing on other
   networks of the machine can reach the controller.
2. **Encrypt** with CurveZMQ (ipyparallel's ``IPP_ENABLE_CURVE=1``): the controller makes a
   key pair, writes its *public* key into the connection files, and every engine and client
   that reads them encrypts its ZeroMQ connections (each makes a key pair of its own). Without
   it, code, arguments and results cross the network in plain text (pickles: readable and
   forgeable by anyone on the path).
3. **Keep the connection files private** (folder 0700, files 0600): they carry the key and
   the addresses; a client without the server key cannot even complete the handshake.

``launch`` is the command prefix that runs a program on the engines' host: ``["ssh",
"node17"]`` on a cluster, ``["ip", "netns", "exec", "nodeB"]`` for a simulated host here
(:mod:`chexnet_utils.cluster.netns`). The engines read the engine connection file at its path on
their host, so the private profile folder is made in ``profile_parent``: by default this
machine's temporary folder (enough for namespaces, which share the file system), on a
cluster a folder of the shared file system (e.g. in ``$HOME``)::

    with RemoteEngines(ip="10.77.0.1", n=1, launch=["ip", "netns", "exec", "nodeB"]) as rc:
        rc.view.apply_sync(socket.gethostname)
"""

from __future__ import annotations

import glob
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from chexnet_utils.platform.atomic import make_private
from chexnet_utils.platform.exposure import check_listen_address
from chexnet_utils.platform.processes import (
    LIFELINE_ENV,
    lifeline_tokens,
    release_watchdog,
    start_watchdog,
    stop_processes,
    watchdog_remove_on_death,
)


def boot_id() -> str:
    """This kernel's boot id: the same in every network namespace and container of this
    machine, different on another host (``/proc/sys/kernel/random/boot_id``)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        import socket

        return socket.gethostname()


def boot_id_and_pid() -> tuple[str, int]:
    """Run on an engine: where it runs (:func:`boot_id`) and its pid."""
    return boot_id(), os.getpid()


class RemoteEngines:
    """A controller on ``ip`` (CurveZMQ on unless ``curve=False``) and ``n`` engines started
    with ``launch``, the connection files in a private folder made in ``profile_parent``
    (default: the temporary folder; the engines' host must see it at the same path); a
    context manager that always tears everything down. Like ``MPICluster`` it starts a
    watchdog: if this process dies (a kernel killed with SIGKILL), the controller and every
    engine on this machine (they carry its token in ``CHEXNET_LIFELINE``) are stopped and the
    connection files removed."""

    def __init__(self, ip: str, n: int = 1, launch: Sequence[str] = (), curve: bool = True,
                 engine_timeout: float = 60, env: Mapping[str, str] | None = None,
                 profile_parent: str | os.PathLike[str] | None = None) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        check_listen_address(ip)
        self.ip, self.n, self.launch, self.curve = ip, n, list(launch), curve
        self.engine_timeout = engine_timeout
        self.env = dict(env or {})
        self.profile_parent = os.fspath(profile_parent) if profile_parent is not None else None
        self.cluster: Any = None
        self.client: Any = None
        self.view: Any = None
        self.profile_dir: str | None = None
        self.engines: list[subprocess.Popen[bytes]] = []
        self.engine_pids: list[int] = []
        self.lifeline: str | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._local: list[Any] = []
        """``psutil.Process`` of the controller and of the engines that run on this machine
        (same ``boot_id``: a network namespace here, not another host), captured at start:
        :meth:`stop` signals only these, never a process that got one of their pids later,
        nor a local process whose pid number an engine on another host happens to have."""

    # -- connection files ------------------------------------------------------------------
    def connection_file(self, kind: str) -> str:
        """Path of the controller's ``engine`` or ``client`` connection file."""
        assert self.profile_dir is not None, "not started"
        found = glob.glob(os.path.join(self.profile_dir, "security", f"*{kind}.json"))
        if not found:
            raise FileNotFoundError(f"no {kind} connection file in {self.profile_dir}")
        return found[0]

    def _wait_for_files(self, deadline: float) -> None:
        while True:
            try:
                for kind in ("engine", "client"):
                    self.connection_file(kind)
                return
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise TimeoutError("the controller wrote no connection files") from None
                time.sleep(0.05)

    def _secure_files(self) -> None:
        assert self.profile_dir is not None
        make_private(self.profile_dir)

    def server_key(self) -> str | None:
        """The controller's public CurveZMQ key from the client file (``None``: curve off)."""
        with open(self.connection_file("client"), encoding="utf-8") as f:
            return json.load(f).get("curve_serverkey")

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> RemoteEngines:
        """Start the controller, then the engines through ``launch``; wait for all ``n``."""
        import ipyparallel as ipp
        from traitlets.config import Config

        if self.cluster is not None:
            raise RuntimeError("already started")
        self.profile_dir = tempfile.mkdtemp(prefix="chexnet-remote-",  # mode 0700
                                            dir=self.profile_parent)
        self.lifeline = f"remote-{os.getpid()}-{secrets.token_hex(4)}"
        self._watchdog = start_watchdog(os.getpid(), self.lifeline)
        watchdog_remove_on_death(self._watchdog, self.profile_dir)  # a dead kernel leaves none
        marked = {**self.env, LIFELINE_ENV: ",".join([*lifeline_tokens(), self.lifeline])}
        cfg = Config()
        cfg.LocalControllerLauncher.environment = {
            **marked, "IPP_ENABLE_CURVE": "1" if self.curve else "0"}
        try:
            self.cluster = ipp.Cluster(profile_dir=self.profile_dir, controller_ip=self.ip,
                                       n=0, config=cfg, log_level=40, shutdown_atexit=True)
            self.cluster.start_controller_sync()
            self._capture_local([(boot_id(), self.cluster.controller.process.pid)])
            self._wait_for_files(time.monotonic() + self.engine_timeout)
            self._secure_files()
            engine_file = self.connection_file("engine")
            env = {**os.environ, **marked}
            self.engines = [subprocess.Popen(
                [*self.launch, sys.executable, "-m", "ipyparallel.engine",
                 f"--file={engine_file}", "--log-level=40"],
                env=env, stdin=subprocess.DEVNULL) for _ in range(self.n)]
            self.client = self.cluster.connect_client_sync()
            self.client.wait_for_engines(self.n, timeout=self.engine_timeout)
            self.view = self.client.broadcast_view()
            self.view.block = True
            where = [(str(b), int(p)) for b, p in self.view.apply_sync(boot_id_and_pid)]
            self.engine_pids = [pid for _, pid in where]
            self._capture_local(where)
            self._secure_files()  # and whatever the client wrote since
        except BaseException:
            self.stop()
            raise
        return self

    def _capture_local(self, where: Sequence[tuple[str, int]]) -> None:
        import psutil

        here = boot_id()
        for boot, pid in where:
            if boot == here:
                try:
                    self._local.append(psutil.Process(pid))
                except psutil.NoSuchProcess:
                    pass

    def controller_listening(self) -> set[str]:
        """Addresses the controller's processes listen on (should be just ``{ip}``)."""
        import psutil

        pids = [self.cluster.controller.process.pid] if self.cluster is not None and \
            self.cluster.controller is not None and self.cluster.controller.process else []
        found: set[str] = set()
        for pid in pids:
            try:
                procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for proc in procs:
                try:
                    found.update(c.laddr.ip for c in proc.net_connections("inet")
                                 if c.status == psutil.CONN_LISTEN)
                except psutil.NoSuchProcess:
                    pass
        return found

    def stop(self, timeout: float = 10) -> list[int]:
        """Shut engines and controller down, kill stragglers, delete the keys; returns the pids
        still alive afterwards (``[]`` when all is gone)."""

        if self.client is not None:
            try:
                self.client.shutdown(hub=False, block=True, targets="all")
            except Exception:  # engines already gone, or never registered
                pass
            self.client.close()
            self.client = None
        stop_processes(self.engines, timeout, sig=None)  # told to stop by the shutdown above
        if self.cluster is not None:
            try:
                self.cluster.stop_cluster_sync()
            except Exception:
                pass
            self.cluster = None
        # stragglers: SIGKILL now (psutil: only if still the process captured at start)
        still = stop_processes(self._local, 0, sig=None)
        if self.profile_dir is not None:
            shutil.rmtree(self.profile_dir, ignore_errors=True)
            self.profile_dir = None
        release_watchdog(self._watchdog)  # stops what still carries the token: normally none
        self._watchdog = self.lifeline = None
        self.engines, self.view, self._local = [], None, []
        return still

    def __enter__(self) -> RemoteEngines:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
