"""ipyparallel engines started as a Slurm job, driven from a notebook like :class:`MPICluster`.

The controller runs where the notebook runs; the engines are one Slurm batch job (ipyparallel's
``SlurmEngineSetLauncher``) whose tasks are MPI ranks: ``srun --mpi=pmix`` starts them
(or ``mpirun`` inside the allocation, as :class:`~chexnet_utils.cluster.distributed.MPICluster`
does on one machine). Horovod initialises on them as on any MPI job, and everything written for
``MPICluster`` (``cluster.run(training.train_on_engine, cfg)``, ``%%px``) runs unchanged::

    with SlurmCluster(n=2, sbatch_options=["--partition=gpu", "--gpus-per-task=1"]) as c:
        print(c.job_id, c.run(rank_info))
    # teardown: scancel, wait until Slurm reports the job ended, no engine process left

``slurm_conf``: the ``slurm.conf`` to use (default: the system's, or ``$SLURM_CONF``; the
one-machine Slurm of :mod:`chexnet_utils.cluster.slurm_local` passes its own). On a real cluster
the engines on other nodes must reach the controller and read its connection file: pass
``controller_ip`` (the address of the cluster-network interface: CurveZMQ encryption is then
on, see :class:`~chexnet_utils.cluster.distributed.MPICluster`), ``location`` (the address engines
dial) and ``profile_parent`` (a folder on the shared file system, e.g. in ``$HOME``).
"""

from __future__ import annotations

import getpass
import os
import shlex
import socket
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from chexnet_utils.cluster import slurm as S
from chexnet_utils.cluster.distributed import MPICluster, mpirun_option_given

if TYPE_CHECKING:
    from traitlets.config import Config

LAUNCHERS = ("srun", "mpirun")


class SlurmCluster(MPICluster):
    """:class:`~chexnet_utils.cluster.distributed.MPICluster` whose ``n`` engines are a Slurm job.

    * ``sbatch_options``: extra ``#SBATCH`` options (``--partition=...``, ``--nodes=2``,
      ``--gpus-per-task=1``, ``--time=01:00:00``); ``--ntasks=n`` is always set.
    * ``launcher``: ``"srun"`` (``srun --mpi=pmix``: Slurm starts the ranks) or ``"mpirun"``
      (Open MPI's ``mpirun`` inside the allocation, with ``map_by`` / ``bind_to`` /
      ``mpi_args`` as for ``MPICluster``).
    * ``engine_timeout``: seconds to wait for the engines, including time in the queue.

    After :meth:`start`: :attr:`job_id`. After :meth:`stop`: :attr:`final_state` (what
    ``scontrol show job`` said once the job had ended, normally ``CANCELLED``).

    Tied to this process's lifetime like ``MPICluster``: the kernel restarted or shut down
    stops the cluster on its way out (``scancel``); a kernel that dies without a clean-up
    (SIGKILL, its Jupyter server gone) leaves the job to the cluster's watchdog, told before
    the job is submitted to run ``scancel --name ipengine-<cluster id>`` then
    (:func:`chexnet_utils.platform.processes.watchdog_on_death`): queued or running, on any node,
    the job is cancelled.
    """

    def __init__(self, n: int = 2, *, sbatch_options: Sequence[str] = (),
                 launcher: str = "srun", slurm_conf: str | os.PathLike[str] | None = None,
                 profile_parent: str | os.PathLike[str] | None = None,
                 engine_timeout: float = 120, **kwargs: Any) -> None:
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")
        super().__init__(n, engine_timeout=engine_timeout, oversubscribe=False, **kwargs)
        self.sbatch_options = list(sbatch_options)
        self.launcher = launcher
        self.slurm_conf = os.fspath(slurm_conf) if slurm_conf is not None else None
        self.profile_parent = os.fspath(profile_parent) if profile_parent is not None else None
        self.job_id: str | None = None
        self.final_state: str | None = None
        self._engine_hosts: list[str] | None = None

    # -- Slurm --------------------------------------------------------------------------------
    def slurm_env(self) -> dict[str, str]:
        """Environment for Slurm commands: this process's, plus ``SLURM_CONF`` if given."""
        env = dict(os.environ)
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        return env

    def env_overrides(self) -> dict[str, str]:
        """:meth:`MPICluster.env_overrides` plus ``SLURM_CONF`` (the job is submitted, and
        its ``srun`` runs, with this environment: ``#SBATCH --export=ALL``)."""
        env = super().env_overrides()
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        return env

    def batch_template(self) -> str:
        """The engines' batch script as an ipyparallel template (``{n}``,
        ``{program_and_args}``, ``{output_file}``, ``{cluster_id}`` are filled in)."""
        def escape(text: str) -> str:
            return text.replace("{", "{{").replace("}", "}}")

        broken = [o for o in self.sbatch_options if "\n" in o or "\r" in o or "\0" in o]
        if broken:  # it would end the #SBATCH line and start a line of the script
            raise ValueError(f"sbatch option {broken[0]!r} contains a line break")
        lines = ["#!/bin/sh", "#SBATCH --export=ALL", "#SBATCH --job-name=ipengine-{cluster_id}",
                 "#SBATCH --ntasks={n}", "#SBATCH --output={output_file}"]
        lines += [f"#SBATCH {escape(opt)}" for opt in self.sbatch_options]
        if self.launcher == "srun":
            start = "srun --mpi=pmix"
        else:
            args = []
            if self.map_by:
                args += ["--map-by", self.map_by]
            if self.bind_to and not mpirun_option_given(self.mpi_args, "bind-to"):
                args += ["--bind-to", self.bind_to]
            start = " ".join(["mpiexec", "-n", "{n}", escape(shlex.join(args + self.mpi_args))])
            start = start.rstrip()
        lines.append(f"exec {start} {{program_and_args}} --mpi")
        return "\n".join(lines) + "\n"

    def _engine_launcher(self, cfg: Config, env: Mapping[str, str]) -> str:
        launcher = cfg.SlurmEngineSetLauncher
        launcher.batch_template = self.batch_template()
        # the script goes to the private profile folder, not the current directory
        assert self._profile_dir is not None
        launcher.batch_file_name = os.path.join(self._profile_dir, "slurm_engine.sbatch")
        launcher.environment = dict(env)
        if self.slurm_conf:  # ipyparallel runs scancel with this process's environment
            conf = ["env", f"SLURM_CONF={self.slurm_conf}"]
            launcher.submit_command = [*conf, "sbatch"]
            launcher.delete_command = [*conf, "scancel"]
            launcher.signal_command = [*conf, "scancel", "-s"]
        return "slurm"

    # -- life cycle ------------------------------------------------------------------------
    def cancel_command(self) -> list[str]:
        """The ``scancel`` that ends this cluster's job whatever its state, by the job name
        ipyparallel gives it (``ipengine-<cluster id>``) and this user; with ``SLURM_CONF``
        when a ``slurm_conf`` was given."""
        assert self.cluster is not None, "the ipyparallel cluster does not exist yet"
        conf = ["env", f"SLURM_CONF={self.slurm_conf}"] if self.slurm_conf else []
        return [*conf, "scancel", f"--name=ipengine-{self.cluster.cluster_id}",
                f"--user={getpass.getuser()}"]

    def _before_engines(self) -> None:
        from chexnet_utils.platform.processes import watchdog_on_death

        watchdog_on_death(self._watchdog, self.cancel_command())

    def start(self) -> "SlurmCluster":
        """Submit the engines' job, start the controller, wait until all ``n`` engines are up."""
        reason = S.slurm_missing_reason(daemons=False)
        if reason:
            raise S.SlurmError(reason)
        super().start()
        assert self.cluster is not None
        launchers = list(self.cluster.engines.values())
        self.job_id = str(launchers[0].job_id) if launchers else None
        return self

    def job_state(self) -> str:
        """The engines' job state now (``RUNNING``, ...), ``"UNKNOWN"`` before :meth:`start`."""
        return S.job_state(self.job_id, self.slurm_env()) if self.job_id else "UNKNOWN"

    def _local_engine_pids(self) -> list[int]:
        """Engine pids on this host (a pid on another node means nothing here)."""
        if self._engine_hosts is None and self.view is not None:
            self._engine_hosts = [str(h) for h in self.view.apply_sync(socket.gethostname)]
        hosts = self._engine_hosts or []
        me = socket.gethostname()
        return [pid for pid, host in zip(self.engine_pids, hosts, strict=False) if host == me]

    def _track_processes(self) -> None:
        for pid in self._local_engine_pids():
            self._track(pid)
        for pid in self._launcher_pids():  # the local controller
            self._track(pid, with_children=False)

    def _engines_alive(self) -> bool:
        if self.cluster is None:
            return False
        from chexnet_utils.platform.processes import pid_alive

        if not all(pid_alive(p) for p in self._local_engine_pids()):
            return False
        return self.job_state() in ("RUNNING", "UNKNOWN")

    def stop(self) -> None:
        """Cancel the engines' job (``scancel``), stop the controller, wait until Slurm reports
        the job ended and every local engine process is gone (SIGKILL after
        ``stop_timeout``)."""
        job = self.job_id
        if job is None and self.cluster is not None:  # start failed: the job may be queued
            launchers = list(self.cluster.engines.values())
            job = str(launchers[0].job_id) if launchers and \
                getattr(launchers[0], "job_id", None) else None
        if self.cluster is not None and self.view is not None:
            try:
                self._track_processes()
            except Exception:
                pass
        super().stop()   # stop_cluster_sync runs the launcher's scancel
        if job is not None:
            S.cancel(job, self.slurm_env())  # again: harmless, and sure
            try:
                self.final_state = S.wait_until_gone(job, self.stop_timeout, self.slurm_env())
            except S.SlurmError:
                self.final_state = self.job_state()
                raise
