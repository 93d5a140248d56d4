"""Process lifetime: every command stops cleanly on SIGTERM and leaves nothing behind.

Four pieces, used by every command that starts processes (``python -m chexnet_utils ...``,
``make lab``):

- :func:`command_lifetime`, a context manager around a command: SIGTERM (and SIGHUP) raise
  :class:`Terminated`, a :class:`KeyboardInterrupt`, so the command runs exactly the cleanup
  it runs on Ctrl-C (pools terminated, MPI clusters stopped) and exits with 143. It also
  starts a small **watchdog** process that outlives the command by a few seconds: every
  process the command starts inherits a marker in its environment (``CHEXNET_LIFELINE``),
  and when the command ends, normally or by SIGKILL, the watchdog sends SIGTERM, then
  SIGKILL, to whatever still carries the marker (MPI engines, Jupyter kernels, spawned pool
  workers), however deep in the process tree and whoever their parent is now. (The marker
  is read from ``/proc/PID/environ``, the environment a process was *exec*'d with: workers
  forked without exec do not show it, and rely on the parent-death signal below.)
- :func:`worker_init`, the initializer of the package's multiprocessing pools: SIGTERM back
  to its default action (a worker never ignores it) and a parent-death signal, so a worker
  dies with its parent even when it is blocked in C code.
- :func:`stop_processes`: the one terminate-then-kill (SIGTERM, a grace period, SIGKILL,
  reaped) on ``psutil``, used by every ``stop()`` that ends processes it started;
- :func:`pid_alive`, :func:`descendants`: small process-table queries shared by the
  package, the tests and the notebooks.

Linux only for the parent-death signal and the watchdog's ``pidfd``; elsewhere both fall
back to polling the parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psutil

LIFELINE_ENV = "CHEXNET_LIFELINE"
"""Environment variable carrying the tokens of the commands a process belongs to."""

_TERMINATING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP")
                    if hasattr(signal, name))
EXIT_SIGTERM = 128 + signal.SIGTERM  # 143, what a shell reports for a SIGTERM'd command
EXIT_SIGINT = 128 + signal.SIGINT    # 130

_PR_SET_PDEATHSIG = 1


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM/SIGHUP inside :func:`command_lifetime`.

    A subclass of :class:`KeyboardInterrupt`, so every ``except KeyboardInterrupt`` and
    ``finally`` that cleans up after Ctrl-C cleans up after ``kill`` too.
    """

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (exited, waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    # "pid (comm) S ...": the state follows the last ')', comm may contain anything
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] not in (b"Z", b"X")


def alive(pids: Iterable[int]) -> list[int]:
    """The ``pids`` that are still running (zombies count as gone)."""
    return [p for p in pids if pid_alive(p)]


def wait_pids_gone(pids: Iterable[int], timeout: float, poll: float = 0.02) -> list[int]:
    """Wait until none of ``pids`` is running (zombies count as gone, :func:`alive`); return
    those still running after ``timeout`` seconds."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(poll)
    return left


def wait_gone(procs: Iterable[Any], timeout: float) -> list[Any]:
    """Wait until the :class:`psutil.Process` objects in ``procs`` have exited; return those
    still running after ``timeout`` seconds.

    Unlike ``psutil.wait_procs``, an exited process that nobody has reaped yet (a zombie,
    e.g. an orphan waiting for init) counts as gone at once.
    """
    def running(p: Any) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    left = list(procs)
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in left if running(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


MPIEXEC_KILL_SEQUENCE = "SIGCONT, 1 s, SIGTERM, 1 s, SIGKILL"
"""What Open MPI 4.1's ``mpiexec``, told to stop, does to its ranks that still run
(``orte/mca/odls/base/odls_base_default_fns.c``, ``odls_base_default_kill_local_procs``;
the 1 s is ``odls_base_sigkill_timeout``: ``ompi_info --param odls all --level 9``). Ranks
that have already exited are not waited for: :func:`terminate_below` ends them first."""


def terminate_below(parents: Iterable[Any], procs: Iterable[Any], timeout: float) -> list[Any]:
    """SIGTERM those of ``procs`` (``psutil.Process`` objects captured earlier, so never a
    process that reused a pid) that run below one of ``parents``; wait up to ``timeout`` s.
    Returns the ones still running."""
    below: set[int] = set()
    for parent in parents:
        try:
            below |= {child.pid for child in parent.children(recursive=True)}
        except psutil.Error:
            continue
    chosen = [p for p in procs if p.pid in below]
    for proc in chosen:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    return wait_gone(chosen, timeout)


def stop_within(procs: list[Any], timeout: float,
                kill_at_once: Callable[[Any], bool] | None = None) -> None:
    """Wait up to ``timeout`` s for ``procs`` (``psutil.Process`` objects, already told to
    stop) to exit, then SIGKILL the rest and wait 5 s more. Meanwhile any process for which
    ``kill_at_once(proc)`` is true is killed at once. (A zombie counts as gone:
    :func:`wait_gone`.)"""
    deadline = time.monotonic() + timeout
    alive = procs
    while alive and time.monotonic() < deadline:
        alive = wait_gone(alive, timeout=0.1)
        for proc in alive:
            try:
                if kill_at_once is not None and kill_at_once(proc):
                    proc.kill()
            except psutil.Error:
                pass
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    wait_gone(alive, timeout=5)


def stop_processes(procs: Iterable[subprocess.Popen[Any] | int | Any], grace: float,
                   sig: int | None = signal.SIGTERM) -> list[int]:
    """Stop ``procs`` (``subprocess.Popen`` objects, ``psutil.Process`` ones or pids): send ``sig``
    (SIGTERM; ``None``: they were already told to stop) to those still running, wait up to
    ``grace`` s, SIGKILL the rest (:func:`stop_within`) and reap the ``Popen`` ones, so no
    zombie is left. Returns the pids still running after that (``[]`` normally).

    The one terminate-then-kill of the package: each process is captured as a
    ``psutil.Process`` first (a pid: here), so a pid reused after that is never signalled."""
    procs = list(procs)
    captured = []
    for proc in procs:
        if isinstance(proc, subprocess.Popen) and proc.poll() is not None:
            continue  # exited and reaped: its pid may belong to somebody else by now
        with contextlib.suppress(psutil.NoSuchProcess):
            captured.append(proc if isinstance(proc, psutil.Process) else
                            psutil.Process(proc if isinstance(proc, int) else proc.pid))
    for proc in captured:
        if sig is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(sig)
    stop_within(captured, grace)
    for proc in procs:
        if isinstance(proc, subprocess.Popen):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1.0)
    return [proc.pid for proc in wait_gone(captured, 0)]


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` in the process tree (children, grandchildren, ...)."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return alive(k.pid for k in kids)


def set_parent_death_signal(sig: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux).

    Returns False where that is not available. With ``parent`` (the pid the parent had when
    it started us), a process whose parent is already another one (the parent died between
    the fork and this call) exits at once. (Not "parent is pid 1": the command itself may
    be pid 1 in a container, and orphans may go to a subreaper.)
    """
    if not sys.platform.startswith("linux"):
        return False

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if parent is not None and os.getppid() != parent:  # orphaned before it took effect
        os._exit(EXIT_SIGTERM)
    return True


def worker_init(parent: int | None = None) -> None:
    """Initializer for worker processes: default SIGTERM, and die with the parent.

    Pass the parent's pid (``initargs=(os.getpid(),)``) so that a worker whose parent died
    before this ran exits too.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    set_parent_death_signal(signal.SIGKILL, parent)


def lifeline_tokens(environ: dict[str, str] | None = None) -> list[str]:
    """The command tokens in ``environ`` (default: this process's environment)."""
    value = (os.environ if environ is None else environ).get(LIFELINE_ENV, "")
    return [t for t in value.split(",") if t]


def marked_processes(token: str, exclude: Iterable[int] = ()) -> list[int]:
    """Live processes whose environment carries ``token`` (those of this user only)."""
    skip = set(exclude)
    found: list[int] = []
    if not os.path.isdir("/proc"):
        return found
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone, a kernel thread, or another user's
            continue
        for entry in env.split(b"\0"):
            if entry.startswith(LIFELINE_ENV.encode() + b"="):
                tokens = entry.split(b"=", 1)[1].decode(errors="replace").split(",")
                if token in tokens and pid_alive(int(name)) and not _exits_by_itself(name):
                    found.append(int(name))
                break
    return found


def _exits_by_itself(pid: str) -> bool:
    """Processes left to end on their own rather than killed: multiprocessing's resource
    tracker (it ignores SIGTERM by design and exits, after unlinking what the workers leaked,
    once every process holding its pipe is gone) and another watchdog of this module (a
    cluster's, inside a command: once its parent is dead it stops that cluster and removes the
    cluster's folder, :func:`watchdog_remove_on_death`; killed by the command's watchdog, it
    left the folder behind)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    return (b"multiprocessing.resource_tracker" in cmdline
            or f"-m\0{WATCHDOG_MODULE}\0".encode() in cmdline)


def stop_marked(token: str, exclude: Iterable[int] = (), grace: float = 3.0,
                log: bool = False) -> list[int]:
    """SIGTERM every process carrying ``token``, SIGKILL what is left after ``grace`` s.

    Keeps looking until none is left (a dying parent may still start one), at most
    ``grace + 3`` seconds. Returns the pids it signalled.
    """
    skip = set(exclude) | {os.getpid()}
    signalled: dict[int, float] = {}
    deadline = time.monotonic() + grace
    give_up = deadline + 3.0
    while True:
        now = time.monotonic()
        pids = marked_processes(token, skip)
        if not pids:
            break
        for pid in pids:
            sig = signal.SIGKILL if now >= deadline else signal.SIGTERM
            if pid not in signalled or sig == signal.SIGKILL:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
                signalled.setdefault(pid, now)
        if now >= give_up:
            break
        time.sleep(0.1)
    if log and signalled:
        print(f"[chexnet] stopped {len(signalled)} process(es) the command left behind",
              file=sys.stderr, flush=True)
    return sorted(signalled)


class DeathPlan:
    """What a watchdog does beyond stopping the marked processes when its parent dies:
    ``commands`` run first (:func:`watchdog_on_death`), ``paths`` removed once the processes
    are gone (:func:`watchdog_remove_on_death`)."""

    def __init__(self) -> None:
        self.commands: list[list[str]] = []
        self.paths: list[str] = []

    def add(self, line: bytes) -> bool:
        """Take one ``on-death [argv]`` or ``remove-on-death "path"`` line; False for any
        other line (``done``)."""
        verb, _, payload = line.partition(b" ")
        if verb not in (b"on-death", b"remove-on-death"):
            return False
        with contextlib.suppress(ValueError):
            value = json.loads(payload)
            if verb == b"on-death" and isinstance(value, list) and value:
                self.commands.append([str(a) for a in value])
            elif verb == b"remove-on-death" and isinstance(value, str) and value:
                self.paths.append(value)
        return True


def _read_lines(fd: int, pending: bytearray, on_death: DeathPlan | None,
                block: bool) -> str:
    """Read what ``fd`` has (all of it unless ``block``: one read); add the ``on-death`` and
    ``remove-on-death`` lines to ``on_death``. Returns ``"done"`` when the parent said so,
    ``"closed"`` when the pipe closed without it (the parent died), else ``""``."""
    plan = on_death if on_death is not None else DeathPlan()
    while True:
        if not block and not select.select([fd], [], [], 0)[0]:
            return ""
        chunk = os.read(fd, 4096)
        if not chunk:
            return "closed"
        pending += chunk
        while b"\n" in pending:
            end = pending.index(b"\n")
            line = bytes(pending[:end])
            del pending[:end + 1]
            if not plan.add(line):
                return "done"
        if block:
            return ""


def _wait_for_parent_or_done(parent: int, on_death: DeathPlan | None = None) -> bool:
    """Block until the parent dies, or says ``done`` on our stdin (or closes it). The
    ``on-death`` and ``remove-on-death`` lines written before either go into ``on_death``
    (what the pipe still holds when the parent has died is read too). True when the parent said
    ``done``; False when it died. A pipe closed without ``done`` counts as a death: a dying
    process closes its files before it becomes a zombie, so at that moment it may still look
    alive (a race that once skipped a Slurm job's ``scancel``)."""
    stdin = sys.stdin.fileno()
    pending = bytearray()
    watched: list[int] = [stdin]
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(parent)
            watched.append(pidfd)
        except ProcessLookupError:  # already gone
            return _read_lines(stdin, pending, on_death, block=False) == "done"
        except OSError:
            pidfd = None
    while True:
        ready, _, _ = select.select(watched, [], [], None if pidfd is not None else 0.5)
        if stdin in ready:
            state = _read_lines(stdin, pending, on_death, block=True)
            if state:
                return state == "done"
        if (pidfd is not None and pidfd in ready) or (pidfd is None and not pid_alive(parent)):
            return _read_lines(stdin, pending, on_death, block=False) == "done"


WATCHDOG_MODULE = "chexnet_utils.platform.processes"
"""What a watchdog runs (``python -m``): this module, by the name it is imported as."""


def watchdog_main(argv: list[str] | None = None) -> int:
    """``python -m chexnet_utils.platform.processes PARENT_PID TOKEN``: the watchdog process."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(f"usage: python -m {WATCHDOG_MODULE} PARENT_PID TOKEN", file=sys.stderr)
        return 2
    parent, token = int(args[0]), args[1]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the command, not for us
    started = time.time()
    plan = DeathPlan()
    died = not _wait_for_parent_or_done(parent, plan)
    if died:
        for command in plan.commands:  # what no signal reaches: a Slurm job (scancel)
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=30)
    stopped = stop_marked(token, exclude=(parent,), log=died)
    if died:  # what the parent's own clean-up would have removed

        for path in plan.paths:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)
    if died or stopped:  # Open MPI segments of ranks killed here: after the parent's own
        # clean-up (released) or instead of it (died), once those ranks have exited (one
        # killed on a loaded machine may take seconds to let go of its memory)
        wait_pids_gone(stopped, timeout=10)
        remove_orphan_shm_segments(since=started)
    return 0


def start_watchdog(parent: int, token: str) -> subprocess.Popen[bytes] | None:
    """Start a watchdog (:func:`watchdog_main`) for ``parent``: when ``parent`` dies, or when
    :func:`release_watchdog` is called, it stops every process carrying ``token`` (and, if
    ``parent`` died, first runs the commands given by :func:`watchdog_on_death`, and after
    the stop removes the paths given by :func:`watchdog_remove_on_death`); whenever it had
    processes to stop, it then removes the Open MPI shared-memory segments they left. In its own
    session, so a signal to ``parent``'s process group does not reach it. ``None`` where
    there is no ``/proc`` (the token cannot be read there)."""
    if not os.path.isdir("/proc"):
        return None
    return subprocess.Popen([sys.executable, "-m", WATCHDOG_MODULE, str(parent), token],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            start_new_session=True)


def watchdog_on_death(proc: subprocess.Popen[bytes] | None, argv: list[str]) -> bool:
    """Ask a watchdog of :func:`start_watchdog` to run ``argv`` too if its parent dies (not
    when it is released): for what lives beyond this machine's process tree, a Slurm job
    (``scancel``). Returns False when the watchdog cannot be told (none, or gone)."""
    return _tell_watchdog(proc, "on-death", [str(a) for a in argv])


def watchdog_remove_on_death(proc: subprocess.Popen[bytes] | None, path: str) -> bool:
    """Ask a watchdog of :func:`start_watchdog` to remove ``path`` (a folder with what is in
    it, or a file) if its parent dies, once the marked processes are gone: what the parent's
    clean-up would have removed (a cluster's profile folder with its connection files).
    Returns False when the watchdog cannot be told (none, or gone)."""
    return _tell_watchdog(proc, "remove-on-death", str(path))


def _tell_watchdog(proc: subprocess.Popen[bytes] | None, verb: str, value: object) -> bool:
    """Write one ``VERB <json>`` line of :class:`DeathPlan` to the watchdog's stdin."""
    if proc is None or proc.stdin is None or proc.poll() is not None:
        return False
    try:
        proc.stdin.write(f"{verb} {json.dumps(value)}\n".encode())
        proc.stdin.flush()
    except OSError:
        return False
    return True


def release_watchdog(proc: subprocess.Popen[bytes] | None, timeout: float = 15) -> None:
    """Tell a watchdog of :func:`start_watchdog` that its parent is done: it stops what still
    carries its token (normally nothing) and exits; wait for it (kill it after ``timeout``)."""
    if proc is None:
        return
    assert proc.stdin is not None  # start_watchdog opens it (stdin=PIPE)
    with contextlib.suppress(OSError):
        proc.stdin.write(b"done\n")
        proc.stdin.close()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class _Lifetime:
    """State of one :func:`command_lifetime` (the watchdog process and the token)."""

    def __init__(self, token: str, watchdog: subprocess.Popen[bytes] | None) -> None:
        self.token = token
        self.watchdog = watchdog


_received: list[int] = []
_depth = [0]  # command_lifetime blocks active in this process


def _note_only(signum: int, frame: object) -> None:
    _received.append(signum)


TERM_GRACE_S = 8.0
"""After SIGTERM/SIGHUP, once the command's code has finished (its main thread ended), the
interpreter still waits for non-daemon threads; if that takes longer than this (a library's
worker that never ends, or a signal that landed inside an import in C code and surfaced as a
``SystemError``), the process exits anyway with 128 + signal, and the command's watchdog stops
whatever it started."""


def _exit_if_stuck_after(signum: int) -> None:
    """Daemon thread: after the grace period, exit once the main thread has been over for
    2 s while the process lives on (stuck joining threads at shutdown). A process that
    handled the signal and goes on working is left alone."""
    time.sleep(TERM_GRACE_S)
    dead_since = None
    while True:
        if threading.main_thread().is_alive():
            dead_since = None
        elif dead_since is None:
            dead_since = time.monotonic()
        elif time.monotonic() - dead_since > 2.0:
            os._exit(128 + signum)
        time.sleep(0.25)


def _raise_terminated(signum: int, frame: object) -> None:
    _received.append(signum)
    # A second signal while the command cleans up is noted, not raised: the cleanup the
    # first one started runs to its end.
    for sig in _TERMINATING:
        signal.signal(sig, _note_only)
    threading.Thread(target=_exit_if_stuck_after, args=(signum,), daemon=True,
                     name="exit-if-stuck").start()
    raise Terminated(signum)


def note_termination(signum: int) -> None:
    """Remember a SIGTERM/SIGHUP that a library's own handler received in our place."""
    _received.append(signum)


def check_terminated() -> None:
    """Raise :class:`Terminated` again if a SIGTERM/SIGHUP arrived in this command.

    For loops over long steps whose library turns the exception into a result (nbclient
    reports it as a failed cell): call it between steps so the command still stops.
    """
    if _received and _depth[0] > 0:
        raise Terminated(_received[-1])


@contextlib.contextmanager
def command_lifetime(watchdog: bool = True) -> Iterator[_Lifetime]:
    """Run a command so that SIGTERM cleans up like Ctrl-C and nothing outlives it.

    Inside the block SIGTERM and SIGHUP raise :class:`Terminated` in the main thread; every
    process started inside inherits this command's token in ``CHEXNET_LIFELINE``; on leaving
    the block (or if this process is killed) the watchdog stops whatever still carries the
    token, and the block waits for it (a few seconds at most). Nested commands (a notebook
    that runs ``python -m chexnet_utils ...``) append their own token.
    """
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    old_env = os.environ.get(LIFELINE_ENV)
    # started before the token is set: the watchdog does not carry it
    proc = start_watchdog(os.getpid(), token) if watchdog else None
    os.environ[LIFELINE_ENV] = ",".join(lifeline_tokens() + [token])
    handlers = {}  # signal number -> its handler before (what signal.signal returned)

    outer_received = list(_received)
    _received.clear()
    _depth[0] += 1
    if threading.current_thread() is threading.main_thread():
        for sig in _TERMINATING:
            handlers[sig] = signal.signal(sig, _raise_terminated)
    try:
        yield _Lifetime(token, proc)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if old_env is None:
            os.environ.pop(LIFELINE_ENV, None)
        else:
            os.environ[LIFELINE_ENV] = old_env
        _depth[0] -= 1
        _received[:] = outer_received
        release_watchdog(proc)  # "done": clean up now


def interruption(exc: KeyboardInterrupt) -> str:
    """``"Ctrl-C"`` or ``"signal 15 (SIGTERM)"``: what stopped the command, for its message."""
    if isinstance(exc, Terminated):
        return f"signal {exc.signum} ({signal.Signals(exc.signum).name})"
    return "Ctrl-C"


def exit_status(exc: KeyboardInterrupt) -> int:
    """143 for SIGTERM (:class:`Terminated`), 129 for SIGHUP, 130 for Ctrl-C."""
    if isinstance(exc, Terminated):
        return 128 + exc.signum
    return EXIT_SIGINT



def _paths_in_use() -> set[str]:
    """Every file some process has open or mapped (``/proc/*/fd`` and ``/proc/*/maps``;
    processes we may not look into are skipped)."""
    used: set[str] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/maps", encoding="utf-8", errors="replace") as f:
                used.update(line.split(None, 5)[5].strip() for line in f
                            if line.count(" ") >= 5 and "/" in line)
            for fd in os.scandir(f"/proc/{entry.name}/fd"):
                with contextlib.suppress(OSError):
                    used.add(os.readlink(fd.path))
        except (OSError, IndexError):
            continue
    return {u.removesuffix(" (deleted)") for u in used}


def orphan_shm_segments(since: float = 0.0, prefix: str = "vader_segment.",
                        shm_dir: str = "/dev/shm") -> list[str]:
    """This account's Open MPI shared-memory segments (``/dev/shm/vader_segment.*``) changed
    at or after ``since`` (a ``time.time()``) that no process has open or mapped any more.

    Open MPI removes its segments when its ranks end normally; a rank killed with SIGKILL
    (a dead worker, a cancelled job, a test of exactly that) leaves its segment behind, 4 MiB
    of RAM each. A segment nobody maps can no longer be used: it is garbage. Only segments
    owned by this process's user are considered: another account's processes cannot be
    looked into (``/proc/PID/maps`` is private), so its live segments would look unused,
    and they are not ours to delete (not even as root).
    """
    me = os.geteuid()
    found: list[str] = []
    try:
        entries = list(os.scandir(shm_dir))
    except OSError:
        return []
    for e in entries:
        if not e.name.startswith(prefix):
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:                  # gone meanwhile
            continue
        if st.st_uid == me and e.is_file(follow_symlinks=False) and st.st_mtime >= since:
            found.append(e.path)
    if not found:
        return []
    used = _paths_in_use()
    return [p for p in found if p not in used]


def remove_orphan_shm_segments(since: float = 0.0, prefix: str = "vader_segment.",
                               shm_dir: str = "/dev/shm") -> list[str]:
    """Delete :func:`orphan_shm_segments` and return the paths removed. Never raises: a
    segment that cannot be removed (gone meanwhile, not ours after all) is left alone."""
    removed = []
    for path in orphan_shm_segments(since, prefix, shm_dir):
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed.append(path)
    return removed


if __name__ == "__main__":  # last: the watchdog uses everything above (the shm clean-up too)
    raise SystemExit(watchdog_main())
