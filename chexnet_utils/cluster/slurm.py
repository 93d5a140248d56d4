"""Talking to a Slurm cluster from Python: submit a batch job, read its state, wait for it.

The same calls work on a real cluster (the system's ``slurm.conf``) and on the one-machine
Slurm of :mod:`chexnet_utils.cluster.slurm_local` (its ``SLURM_CONF`` passed in ``env``)::

    job = submit("scripts/slurm_horovod.sbatch", ["--arch", "small"], options=["--nodes=1"])
    state = wait_for_job(job, timeout=600)          # "COMPLETED", "FAILED", ...

Job state comes from ``scontrol show job`` (kept for ``MinJobAge`` seconds after the end),
so no accounting database (``sacct``) is needed. :func:`slurm_missing_reason` says why
Slurm cannot be used here, or ``None``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence

SLURM_COMMANDS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
"""The client commands this module runs."""

DAEMONS = ("munged", "slurmctld", "slurmd")
"""The daemons :mod:`chexnet_utils.cluster.slurm_local` starts."""

INSTALL_HINT = "apt-get install -y slurm-wlm munge (make setup installs them as root)"

ENDED_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                          "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"})
"""Job states after which a job runs no more."""


class SlurmError(RuntimeError):
    """A Slurm command failed, or a job did not end in time."""


def slurm_missing_reason(daemons: bool = True) -> str | None:
    """Why Slurm cannot be used on this machine, or ``None`` when it can.

    Checks the client commands and, with ``daemons``, ``munged``/``slurmctld``/``slurmd``
    (searched in ``PATH`` and ``/usr/sbin``) and that this process may call ``setgroups``,
    which ``slurmd`` does at start. Root is not needed: the one-machine Slurm runs its daemons
    as the user who starts it. A user namespace made without root (``make lab PRIVATE=1`` as
    a normal user) forbids ``setgroups``.
    """
    missing = [c for c in SLURM_COMMANDS if shutil.which(c) is None]
    if daemons:
        missing += [d for d in DAEMONS if daemon_path(d) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing): {INSTALL_HINT}"
    if daemons and setgroups_denied():
        return ("slurmd cannot start in this user namespace (setgroups is denied here, as in "
                "make lab PRIVATE=1 started by a normal user): run the Slurm appendix from a "
                "lab outside it (make lab; the local Slurm is usable by you only anyway)")
    return None


def setgroups_denied(path: str = "/proc/self/setgroups") -> bool:
    """True in a user namespace that forbids ``setgroups`` (its ``/proc/self/setgroups``
    says ``deny``: one made without root, ``unshare --map-root-user``)."""
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip() == "deny"
    except OSError:
        return False


def daemon_path(name: str) -> str | None:
    """Full path of a daemon (``munged``, ``slurmctld``, ``slurmd``), or ``None``."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")


def run_slurm(args: Sequence[str], env: Mapping[str, str] | None = None,
              timeout: float = 30, check: bool = True, cwd: str | None = None
              ) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command; raise :class:`SlurmError` with its stderr when it fails
    or does not answer within ``timeout`` seconds (with ``check=False``: return code -1)."""
    try:
        out = subprocess.run(list(args), env=dict(env) if env is not None else None, cwd=cwd,
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        if check:
            raise SlurmError(f"{' '.join(args)} did not answer within {timeout:.0f} s") from e
        return subprocess.CompletedProcess(list(args), -1, "", f"timed out after {timeout} s")
    if check and out.returncode != 0:
        raise SlurmError(f"{' '.join(args)} exited with {out.returncode}: "
                         f"{(out.stderr or out.stdout).strip()}")
    return out


def submit(script: str | os.PathLike[str], args: Sequence[str] = (),
           options: Sequence[str] = (), env: Mapping[str, str] | None = None,
           cwd: str | os.PathLike[str] | None = None) -> str:
    """``sbatch --parsable [options] script [args]``; returns the job id.

    ``options`` override the script's ``#SBATCH`` lines; ``args`` reach the script as
    ``"$@"``; ``cwd`` becomes the job's ``SLURM_SUBMIT_DIR``.
    """
    script = os.path.abspath(script)  # relative to this process's directory, not cwd's
    out = run_slurm(["sbatch", "--parsable", *options, script, *args], env=env,
                    cwd=os.fspath(cwd) if cwd is not None else None)
    return out.stdout.strip().split(";")[0]


def job_info(job_id: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``scontrol show job -o ID`` as a dict (``JobState``, ``ExitCode``, ``StdOut``, ...);
    empty when the controller no longer knows the job."""
    out = run_slurm(["scontrol", "show", "job", "-o", str(job_id)], env=env, check=False)
    if out.returncode != 0:
        return {}
    info: dict[str, str] = {}
    for field in out.stdout.split():
        key, sep, value = field.partition("=")
        if sep and key not in info:
            info[key] = value
    return info


def job_state(job_id: str, env: Mapping[str, str] | None = None) -> str:
    """The job's state (``PENDING``, ``RUNNING``, ``COMPLETED``, ``FAILED``, ...), or
    ``"UNKNOWN"`` when the controller no longer knows it."""
    return job_info(job_id, env).get("JobState", "UNKNOWN")


def wait_for_job(job_id: str, timeout: float, env: Mapping[str, str] | None = None,
                 poll: float = 0.5) -> str:
    """Wait until the job has ended; return its final state.

    After ``timeout`` seconds the job is cancelled and :class:`SlurmError` raised.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = job_state(job_id, env)
        if state in ENDED_STATES:
            return state
        time.sleep(poll)
    cancel(job_id, env)
    raise SlurmError(f"job {job_id} did not end within {timeout:.0f} s (state {state}); "
                     "cancelled it")


def cancel(job_id: str, env: Mapping[str, str] | None = None) -> None:
    """``scancel ID`` (no error when the job has ended already)."""
    run_slurm(["scancel", str(job_id)], env=env, check=False)


def wait_until_gone(job_id: str, timeout: float, env: Mapping[str, str] | None = None,
                    poll: float = 0.2) -> str:
    """Wait until the job is no longer pending, running or completing (after ``scancel``);
    return its last state. Raises :class:`SlurmError` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    state = job_state(job_id, env)
    while time.monotonic() < deadline:
        state = job_state(job_id, env)
        if state in ENDED_STATES or state == "UNKNOWN":
            return state
        time.sleep(poll)
    raise SlurmError(f"job {job_id} still {state} {timeout:.0f} s after scancel")
