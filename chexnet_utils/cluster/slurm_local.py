"""A real Slurm on this one machine: ``munged``, ``slurmctld`` and ``slurmd``, for its user only.

For the tests (``tests/mpi/conftest.py``) and for trying Slurm by hand (``make slurm``)::

    with LocalSlurm() as slurm:                      # about 2 s until the node is idle
        job = slurm.submit("scripts/slurm_horovod.sbatch", [...], options=[...])
        slurm.wait_for_job(job, timeout=300)         # "COMPLETED"

Everything lives in one state folder (a new temporary one unless ``state_dir`` is given):
``slurm.conf``, a generated munge key (0400), munge's socket, the daemons' logs, pid files,
``StateSaveLocation`` and ``SlurmdSpoolDir``, and ``jobcomp.txt`` (``jobcomp/filetxt``: one
line per finished job, as there is no accounting database for ``sacct``). The node is this
machine, with the CPUs and memory ``slurmd -C`` reports, on free non-default ports. Nothing
touches a system Slurm: every client command gets this ``SLURM_CONF`` through
:attr:`LocalSlurm.env` (never through this process's environment), and munge has its own
socket and key.

**Who can reach it** (:attr:`LocalSlurm.exposure` says it in one line):

- The daemons run as **the user who starts them** (``SlurmUser`` = ``SlurmdUser`` = that
  user; ``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``: no cgroups, no
  root needed), so jobs run as that user too. Root is needed by nobody; as root they run as
  root (a container, CI).
- They **listen on loopback only** where this host's name resolves to a loopback address
  (Slurm's ``CommunicationParameters=NoCtldInAddrAny,NoInAddrAny`` binds to what the name
  resolves to, Slurm 22.05 ``slurm.conf(5)``;
  :func:`~chexnet_utils.cluster.slurm_access.loopback_bind_address`); the clients and the node use
  that address. Where the name resolves to a network address they would bind there, so they listen
  on every interface instead and :attr:`LocalSlurm.exposure` says so.
- Every Slurm message carries a munge credential, and **only this user can get one**: the
  state folder and every folder in it are 0700, munge's socket folder included (``munged``
  wants that folder open to all; ``--force`` makes that a warning), and the key is 0400.
  Another account can neither submit nor query.
- The state folder is **checked before anything is written**
  (:func:`~chexnet_utils.cluster.slurm_access.check_state_dir`): no symbolic link in it, everything
  in it this user's, and every folder above it owned by root or this user and not writable by other
  accounts (unless sticky, like ``/tmp``), so nobody else can swap a folder for a link while the
  daemons write (``make slurm`` as root in another user's checkout is refused). Files are created
  with ``O_NOFOLLOW``.

:meth:`LocalSlurm.stop` cancels every job, stops the daemons (SIGTERM, then SIGKILL) and
checks by pid that none is left, nor any ``slurmstepd`` of this Slurm (found by its
``SLURM_CONF``) or process below one; if the process that started them dies without
stopping them (a kernel killed with SIGKILL), a watchdog does
(:func:`chexnet_utils.platform.processes.start_watchdog`: the daemons carry its token; ``up`` ends
it, its daemons outlive the command). Two of them run side by side on one machine (own
state folder, socket, key and ports; a port taken between choosing and binding it is
chosen again).

Command line (``make slurm`` runs ``run``)::

    python -m chexnet_utils.cluster.slurm_local run    --dir build/slurm   # until Ctrl-C
    python -m chexnet_utils.cluster.slurm_local up     --dir build/slurm   # start, return
    python -m chexnet_utils.cluster.slurm_local status --dir build/slurm
    python -m chexnet_utils.cluster.slurm_local down   --dir build/slurm
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil

from chexnet_utils.cluster import slurm as S
from chexnet_utils.cluster.slurm_access import (
    check_state_dir,
    invoking_user,
    loopback_bind_address,
    open_new,
    private_folder,
)
from chexnet_utils.platform.atomic import write_json_atomic, write_text_atomic
from chexnet_utils.platform.ports import free_ports
from chexnet_utils.platform.processes import (
    LIFELINE_ENV,
    alive,
    descendants,
    lifeline_tokens,
    pid_alive,
    release_watchdog,
    start_watchdog,
    stop_processes,
)

NODE_NAME = "chexnet-node"
PARTITION = "debug"
START_TIMEOUT = 30.0
"""Seconds :meth:`LocalSlurm.start` waits for the node to show ``idle`` in ``sinfo``."""
STATE_FOLDERS = ("munge-run", "munge", "log", "ctld-state", "slurmd-spool")
"""The folders inside the state folder (all 0700, like the state folder itself)."""
PORT_ATTEMPTS = 3
"""How often :meth:`LocalSlurm.start` chooses new ports when one was taken meanwhile."""
_PORT_TAKEN = "Address already in use"


def node_hardware() -> str:
    """This machine's ``CPUs=.. Boards=.. SocketsPerBoard=.. CoresPerSocket=..
    ThreadsPerCore=.. RealMemory=..`` as ``slurmd -C`` reports them (what slurmd checks)."""
    slurmd = S.daemon_path("slurmd") or "slurmd"
    out = subprocess.run([slurmd, "-C"], capture_output=True, text=True, timeout=30)
    first = out.stdout.splitlines()[0] if out.stdout else ""
    fields = [f for f in first.split() if f.split("=")[0] in
              ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore",
               "RealMemory")]
    if not fields:
        raise S.SlurmError(f"slurmd -C printed no node description: {out.stderr.strip()}")
    return " ".join(fields)


def check_conf_path(state: Path) -> None:
    """:class:`~chexnet_utils.cluster.slurm.SlurmError` for a state folder whose path has
    whitespace, ``#`` or a quote: slurm.conf has no quoting that every one of its keys takes, so
    such a path is refused before anything is written, rather than written and misread."""
    if any(c.isspace() or c in "#\"'" for c in str(state)):
        raise S.SlurmError(f"Slurm state folder {str(state)!r} contains whitespace, '#' or "
                           "a quote, which slurm.conf cannot hold: choose a plain path")


def slurm_conf(state: Path, ctld_port: int, slurmd_port: int, hardware: str,
               host: str | None = None, user: str = "root",
               bind_address: str | None = None) -> str:
    """The text of ``slurm.conf`` for this host with everything in ``state``.

    ``user``: the account the daemons run as (``SlurmUser``, ``SlurmdUser``).
    ``bind_address``: the loopback address this host's name resolves to
    (:func:`~chexnet_utils.cluster.slurm_access.loopback_bind_address`): the daemons listen there
    only (``NoCtldInAddrAny,NoInAddrAny``) and clients and node use it; ``None``: they listen on
    every interface, clients and node use ``127.0.0.1``.

    Raises :class:`~chexnet_utils.cluster.slurm.SlurmError` for a ``state`` path slurm.conf cannot
    hold (:func:`check_conf_path`)."""
    check_conf_path(state)
    host = host or socket.gethostname().split(".")[0]
    addr = bind_address or "127.0.0.1"
    bind = ("# listen only where this host's name resolves to (a loopback address)\n"
            "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny\n") if bind_address else ""
    return f"""\
# One-machine Slurm written by chexnet_utils.cluster.slurm_local (state folder {state})
ClusterName=chexnet
SlurmctldHost={host}({addr})
SlurmUser={user}
SlurmdUser={user}
{bind}SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={state}/munge-run/munge.socket
CredType=cred/munge
StateSaveLocation={state}/ctld-state
SlurmdSpoolDir={state}/slurmd-spool
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd.pid
SlurmctldLogFile={state}/log/slurmctld.log
SlurmdLogFile={state}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={state}/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
# finished jobs stay visible to `scontrol show job` for 10 minutes (no sacct here)
MinJobAge=600
ReturnToService=2
SlurmdTimeout=60
NodeName={NODE_NAME} NodeAddr={addr} NodeHostname={host} {hardware} State=UNKNOWN
PartitionName={PARTITION} Nodes={NODE_NAME} Default=YES MaxTime=INFINITE State=UP
"""


def _environ_has(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


class LocalSlurm:
    """``munged``, ``slurmctld`` and ``slurmd`` for this machine, started and stopped for sure.

    ``state_dir``: where everything lives (created; default a new temporary folder, removed
    by :meth:`stop`). :attr:`env` is the environment for client commands (``sbatch``,
    ``srun``, ``sinfo``, ...): this process's plus ``SLURM_CONF``.
    """

    def __init__(self, state_dir: str | os.PathLike[str] | None = None,
                 start_timeout: float = START_TIMEOUT, stop_timeout: float = 15) -> None:
        self._owns_dir = state_dir is None
        self.state = Path(state_dir) if state_dir is not None else None
        self.start_timeout, self.stop_timeout = start_timeout, stop_timeout
        self.daemon_pids: dict[str, int] = {}
        self._popens: list[subprocess.Popen[bytes]] = []
        self.node = NODE_NAME
        self.partition = PARTITION
        self._watchdog: subprocess.Popen[bytes] | None = None
        self.lifeline: str | None = None
        """The token the daemons carry (``CHEXNET_LIFELINE``) while this process owns them."""
        self.bind_address: str | None = None
        """Where the daemons listen
        (:func:`~chexnet_utils.cluster.slurm_access.loopback_bind_address`); ``None``:
        everywhere."""
        self.ports: tuple[int, ...] = ()
        """``(SlurmctldPort, SlurmdPort)`` after :meth:`start`."""

    # -- paths and environment ------------------------------------------------------------
    @property
    def conf_path(self) -> Path:
        """The ``slurm.conf`` of this Slurm."""
        assert self.state is not None
        return self.state / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """This process's environment plus ``SLURM_CONF`` (for every client command)."""
        return {**os.environ, "SLURM_CONF": str(self.conf_path)}

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of each daemon's log (for error messages)."""
        assert self.state is not None
        parts = []
        for name in ("munged", "slurmctld", "slurmd"):
            for path in (self.state / "log" / f"{name}.log",
                         self.state / "log" / f"{name}.stderr"):
                text = path.read_text(errors="replace") if path.exists() else ""
                if text.strip() or path.suffix == ".log":
                    tail = "\n".join(text.splitlines()[-lines:]) or "(empty)"
                    parts.append(f"--- {path} ---\n{tail}")
        return "\n".join(parts)

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> "LocalSlurm":
        """Check the state folder, write the configuration, start the three daemons as this
        user, wait until the node is idle."""
        reason = S.slurm_missing_reason()
        if reason:
            raise S.SlurmError(reason)
        user = invoking_user()
        if self.state is None:
            self.state = Path(tempfile.mkdtemp(prefix="chexnet-slurm-"))  # 0700
        elif not self.state.is_absolute():
            self.state = Path(os.path.abspath(self.state))
        st = self.state
        check_conf_path(st)
        check_state_dir(st)
        if (st / "pids.json").exists():
            raise S.SlurmError(f"{st} has a running Slurm already (pids.json): "
                               f"stop it first (python -m chexnet_utils.cluster.slurm_local down "
                               f"--dir {st})")
        st.parent.mkdir(parents=True, exist_ok=True)
        private_folder(st)
        for sub in STATE_FOLDERS:
            private_folder(st / sub)
        key = st / "munge" / "munge.key"
        with os.fdopen(open_new(key, 0o400), "wb") as f:   # never readable by others
            f.write(secrets.token_bytes(1024))
        self.bind_address = loopback_bind_address()
        hardware = node_hardware()
        # A killed kernel (SIGKILL: no atexit) must not leave the daemons either: they carry
        # this Slurm's lifeline token, and a watchdog stops them when this process dies.
        self.lifeline = f"slurm-{os.getpid()}-{secrets.token_hex(4)}"
        self._watchdog = start_watchdog(os.getpid(), self.lifeline)
        env = {**self.env, LIFELINE_ENV: ",".join([*lifeline_tokens(), self.lifeline])}
        # A notebook cell that raises between start() and stop() must not leave three
        # daemons behind: the interpreter's exit (kernel shutdown) stops them.
        atexit.register(self._stop_at_exit)
        try:
            # --force: munged refuses a socket folder that every account cannot enter;
            # this one is 0700 on purpose, so that only this user gets credentials
            self._spawn("munged", [
                "-F", "--force", f"--socket={st}/munge-run/munge.socket", f"--key-file={key}",
                f"--pid-file={st}/munge-run/munged.pid", f"--log-file={st}/log/munged.log",
                f"--seed-file={st}/munge/munged.seed"], env)
            self._wait_for(lambda: (st / "munge-run" / "munge.socket").exists(), "munged")
            for attempt in range(1, PORT_ATTEMPTS + 1):
                ctld_port, slurmd_port = free_ports(2)
                self.ports = (ctld_port, slurmd_port)
                write_text_atomic(self.conf_path, slurm_conf(
                    st, ctld_port, slurmd_port, hardware, user=user,
                    bind_address=self.bind_address))
                logs = self._log_sizes()
                try:
                    self._spawn("slurmctld", ["-D", "-f", str(self.conf_path)], env)
                    self._spawn("slurmd", ["-D", "-f", str(self.conf_path), "-N", self.node],
                                env)
                    self._wait_for(lambda: self.node_state() == "idle",
                                   "the node to be idle in sinfo", logs)
                    break
                except S.SlurmError as e:
                    if attempt == PORT_ATTEMPTS or _PORT_TAKEN not in str(e):
                        raise
                    self._stop_daemons(("slurmd", "slurmctld"))  # a port was taken: again
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def exposure(self) -> str:
        """Who can reach this Slurm, in one line (after :meth:`start`)."""
        user = invoking_user()
        where = (f"listen on {self.bind_address} only (this host's name resolves to it; "
                 "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny)"
                 if self.bind_address else
                 "listen on every interface (this host's name does not resolve to a loopback "
                 "address, and Slurm binds to that address or to all: firewall ports "
                 f"{' and '.join(map(str, self.ports))} against the network)")
        return (f"slurmctld and slurmd run as {user} and {where}; every request needs a "
                f"munge credential, which only {user} can get (munge's socket folder is "
                "0700), so no other account can use this Slurm")

    def _ports_taken(self) -> list[int]:
        """This Slurm's ports that another program holds: a test bind fails and the daemon
        does not listen there (slurmctld would retry for about 10 s, then exit)."""
        taken = []
        for port in self.ports:
            with socket.socket() as probe:
                try:
                    probe.bind((self.bind_address or "127.0.0.1", port))
                    continue
                except OSError:
                    pass
            ours = set()
            for name in ("slurmctld", "slurmd"):
                with contextlib.suppress(psutil.Error, KeyError):
                    proc = psutil.Process(self.daemon_pids[name])
                    ours |= {c.laddr.port for c in proc.net_connections("inet")
                             if c.status == psutil.CONN_LISTEN}
            if port not in ours:
                taken.append(port)
        return taken

    def _log_sizes(self) -> dict[Path, int]:
        assert self.state is not None
        logs = [self.state / "log" / f"{n}{ext}" for n in ("slurmctld", "slurmd")
                for ext in (".log", ".stderr")]
        return {p: p.stat().st_size if p.exists() else 0 for p in logs}

    def _new_log_text(self, sizes: Mapping[Path, int]) -> str:
        text = []
        for path, size in sizes.items():
            if path.exists():
                with path.open("rb") as f:
                    f.seek(size)
                    text.append(f.read().decode(errors="replace"))
        return "\n".join(text)

    def _stop_daemons(self, names: Sequence[str]) -> None:
        """SIGKILL the daemons ``names`` of a failed start (nothing to save yet; slurmctld
        waiting for a taken port does not answer SIGTERM), to start them again."""
        assert self.state is not None
        for name in names:
            pid = self.daemon_pids.pop(name, None)
            if pid is not None:
                self._stop_pids([pid], 0, sig=None)  # SIGKILL at once, wait for it
        write_json_atomic(self.state / "pids.json", self.daemon_pids)

    def _spawn(self, name: str, args: Sequence[str], env: Mapping[str, str]) -> None:
        assert self.state is not None
        exe = S.daemon_path(name)
        assert exe is not None
        out = os.open(self.state / "log" / f"{name}.stderr",
                      os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600)
        try:
            proc = subprocess.Popen([exe, *args], env=dict(env), stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        finally:
            os.close(out)
        self._popens.append(proc)
        self.daemon_pids[name] = proc.pid
        write_json_atomic(self.state / "pids.json", self.daemon_pids)

    def _wait_for(self, ready: Callable[[], bool], what: str,
                  logs: Mapping[Path, int] | None = None) -> None:
        """Wait until ``ready()``; :class:`~chexnet_utils.cluster.slurm.SlurmError` with the logs'
        tails when a daemon exits, when the text the daemons logged since ``logs`` (sizes,
        :meth:`_log_sizes`) says a port is taken (slurmctld retries that for about 10 s
        before it exits), or after ``start_timeout``."""
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            dead = [n for n, p in self.daemon_pids.items() if not pid_alive(p)]
            if dead:
                raise S.SlurmError(f"{', '.join(dead)} exited during start-up:\n"
                                   f"{self.log_tails()}")
            taken = self._ports_taken() if logs is not None else []
            if taken or (logs is not None and _PORT_TAKEN in self._new_log_text(logs)):
                raise S.SlurmError(f"port {' or '.join(map(str, taken or self.ports))} was "
                                   f"taken by another program after it was chosen "
                                   f"({_PORT_TAKEN}):\n{self.log_tails()}")
            if ready():
                return
            time.sleep(0.2)
        raise S.SlurmError(f"waited {self.start_timeout:.0f} s for {what}:\n{self.log_tails()}")

    def node_state(self) -> str:
        """The node's state in ``sinfo`` (``idle``, ``alloc``, ``mixed``, ``down*``, ...);
        empty when the controller does not answer."""
        out = S.run_slurm(["sinfo", "-h", "-n", self.node, "-o", "%T"], env=self.env,
                          check=False, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else ""

    def processes(self) -> list[int]:
        """Pids of every live process of this Slurm: the daemons, the ``slurmstepd`` that
        carry its ``SLURM_CONF``, and all their descendants (job scripts, tasks)."""
        found = set()
        for name, pid in self.daemon_pids.items():  # a stale pids.json: the pid may be reused
            try:
                if psutil.Process(pid).name() == name and alive([pid]):
                    found.add(pid)
            except psutil.Error:
                pass
        if self.state is not None:  # slurmstepd outlives slurmd: found by its environment
            marker = f"SLURM_CONF={self.conf_path}".encode()
            for proc in psutil.process_iter(["name"]):
                if proc.info["name"] == "slurmstepd" and _environ_has(proc.pid, marker):
                    found.add(proc.pid)
        for pid in list(found):
            found.update(descendants(pid))
        return sorted(alive(found))

    def stop(self) -> None:
        """Cancel every job, stop the daemons, check that no process of this Slurm is left.

        Raises :class:`~chexnet_utils.cluster.slurm.SlurmError` naming any pid still alive after
        SIGKILL. Removes the state folder when it was a temporary one.
        """
        if self.state is None:
            return
        ctld = self.daemon_pids.get("slurmctld")
        if ctld is not None and pid_alive(ctld):
            S.run_slurm(["scancel", "--user", str(os.getuid())], env=self.env, check=False,
                        timeout=10)
            deadline = time.monotonic() + self.stop_timeout
            while time.monotonic() < deadline and self._running_jobs():
                time.sleep(0.2)
        # daemons first in reverse start order, then anything left that carries our SLURM_CONF
        left = self.processes()
        for name in ("slurmd", "slurmctld", "munged"):
            pid = self.daemon_pids.get(name)
            if pid is not None and pid in left:
                self._stop_pids([pid], self.stop_timeout)
        still = self._stop_pids(self.processes(), 5)  # then anything else carrying our conf
        if still:
            raise S.SlurmError(f"Slurm processes still running after SIGKILL: {still}")
        (self.state / "pids.json").unlink(missing_ok=True)
        if self._owns_dir:
            shutil.rmtree(self.state, ignore_errors=True)
        self.daemon_pids = {}
        atexit.unregister(self._stop_at_exit)
        release_watchdog(self._watchdog)   # nothing carries the token any more
        self._watchdog = self.lifeline = None

    def detach(self) -> "LocalSlurm":
        """Leave the daemons running when this interpreter exits (``up``); by default they are
        stopped then, or by the watchdog if this process is killed. :meth:`attach` and
        :meth:`stop` (``down``) find them again."""
        atexit.unregister(self._stop_at_exit)
        if self._watchdog is not None:      # ended without stopping what carries the token
            self._watchdog.kill()
            self._watchdog.wait()
            self._watchdog = None
        return self

    def _stop_at_exit(self) -> None:
        """At interpreter exit: :meth:`stop` if the daemons still run (never raises)."""
        if self.daemon_pids:
            try:
                self.stop()
            except Exception as exc:  # noqa: BLE001 - exiting anyway: say what is left
                print(f"[chexnet] local Slurm at exit: {exc}", file=sys.stderr, flush=True)

    def _running_jobs(self) -> bool:
        out = S.run_slurm(["squeue", "-h", "-o", "%i"], env=self.env, check=False, timeout=10)
        return out.returncode == 0 and bool(out.stdout.strip())

    def _stop_pids(self, pids: Sequence[int], grace: float,
                   sig: int | None = signal.SIGTERM) -> list[int]:
        """:func:`~chexnet_utils.platform.processes.stop_processes`, then reap the daemons
        this process started; returns the pids still running."""
        still = stop_processes(pids, grace, sig)
        for proc in self._popens:
            proc.poll()
        return still

    @classmethod
    def attach(cls, state_dir: str | os.PathLike[str]) -> "LocalSlurm":
        """The Slurm started earlier (``up``) in ``state_dir``, from its ``pids.json``."""
        slurm = cls(state_dir)
        pids = Path(state_dir) / "pids.json"
        if not pids.exists():
            raise S.SlurmError(f"no Slurm started in {state_dir} (no pids.json)")
        slurm.daemon_pids = {k: int(v) for k, v in json.loads(pids.read_text()).items()}
        conf = dict(line.split("=", 1) for line in slurm.conf_path.read_text().splitlines()
                    if "=" in line and not line.startswith("#")) \
            if slurm.conf_path.exists() else {}
        with contextlib.suppress(KeyError, ValueError):
            slurm.ports = (int(conf["SlurmctldPort"]), int(conf["SlurmdPort"]))
        if "CommunicationParameters" in conf:
            slurm.bind_address = conf["SlurmctldHost"].partition("(")[2].rstrip(")")
        return slurm

    def __enter__(self) -> "LocalSlurm":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- jobs ----------------------------------------------------------------------------------
    def submit(self, script: str | os.PathLike[str], args: Sequence[str] = (),
               options: Sequence[str] = (), cwd: str | os.PathLike[str] | None = None,
               env: Mapping[str, str] | None = None) -> str:
        """:func:`chexnet_utils.cluster.slurm.submit` to this Slurm (``env`` added to
        :attr:`env`)."""
        return S.submit(script, args, options, env={**self.env, **(env or {})}, cwd=cwd)

    def wait_for_job(self, job_id: str, timeout: float) -> str:
        """:func:`chexnet_utils.cluster.slurm.wait_for_job` on this Slurm."""
        return S.wait_for_job(job_id, timeout, env=self.env)

    def job_info(self, job_id: str) -> dict[str, str]:
        """:func:`chexnet_utils.cluster.slurm.job_info` on this Slurm."""
        return S.job_info(job_id, env=self.env)

    def jobcomp(self) -> dict[str, dict[str, str]]:
        """The job completion records (``jobcomp.txt``): job id -> its fields."""
        assert self.state is not None
        path = self.state / "jobcomp.txt"
        records: dict[str, dict[str, str]] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                fields = dict(f.partition("=")[::2] for f in line.split() if "=" in f)
                if "JobId" in fields:
                    records[fields["JobId"]] = fields
        return records


def _print_usage(slurm: LocalSlurm) -> None:
    print(f"Slurm is up: node {slurm.node} idle in partition {slurm.partition} "
          f"(state, logs, slurm.conf in {slurm.state})")
    if slurm.ports:
        print(f"Who can reach it: {slurm.exposure}")
    print("In another shell:")
    print(f"  export SLURM_CONF={slurm.conf_path}")
    print("  sinfo; srun -n2 hostname")
    print("  TFRECORDS=<converted folder> sbatch --nodes=1 --ntasks-per-node=2 \\")
    print("    --gpus-per-node=0 --cpus-per-task=1 scripts/slurm_horovod.sbatch --arch small \\")
    print("    --image-size 64 --epochs 1")
    print("  squeue; scontrol show job <id>; scancel <id>; cat "
          f"{slurm.state}/jobcomp.txt")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m chexnet_utils.cluster.slurm_local run|up|status|down --dir DIR``."""
    parser = argparse.ArgumentParser(prog="python -m chexnet_utils.cluster.slurm_local",
                                     description="a one-machine Slurm for this user")
    parser.add_argument("action", choices=("run", "up", "status", "down"),
                        help="run: start, wait for Ctrl-C, stop; up/down: start/stop only")
    parser.add_argument("--dir", type=Path, default=Path("build/slurm"),
                        help="state folder (default build/slurm)")
    args = parser.parse_args(argv)
    state = args.dir.resolve()
    try:
        if args.action in ("run", "up"):
            from chexnet_utils.platform.processes import command_lifetime

            if args.action == "up":
                slurm = LocalSlurm(state).start().detach()  # outlives this command: `down`
                print("started; stop with: python -m chexnet_utils.cluster.slurm_local "
                      f"down --dir {args.dir}")
                _print_usage(slurm)
                return 0
            with command_lifetime(watchdog=False), LocalSlurm(state) as slurm:
                _print_usage(slurm)
                print("Ctrl-C stops it.", flush=True)
                try:
                    while True:
                        time.sleep(3600)
                except KeyboardInterrupt:
                    print("\nstopping Slurm", flush=True)
            print("stopped: no Slurm process left")
            return 0
        slurm = LocalSlurm.attach(state)
        if args.action == "status":
            print(f"daemons: {slurm.daemon_pids}; node {slurm.node}: "
                  f"{slurm.node_state() or 'controller not answering'}")
            if slurm.ports:
                print(f"Who can reach it: {slurm.exposure}")
            print(S.run_slurm(["squeue"], env=slurm.env, check=False).stdout, end="")
            return 0
        slurm.stop()
        print("stopped: no Slurm process left")
        return 0
    except S.SlurmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
