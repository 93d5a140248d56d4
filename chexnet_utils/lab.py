"""JupyterLab for the notebooks: ``make lab`` and the headless server the browser test drives.

``make lab`` runs ``python -m chexnet_utils.lab``, which starts JupyterLab on loopback with
the project kernel (``Python (chexnet-at-scale)``, registered by ``scripts/setup.sh``) as the
only kernel offered. The notebooks are saved with the generic ``python3`` kernel; JupyterLab
falls back to the one Python kernel it is offered, so each notebook opens on the project
kernel without a dialog. ipyparallel's JupyterLab extension (the "IPython Parallel" sidebar)
and its server extension come with the ipyparallel wheel; setup checks they are enabled.

What a learner leaves behind is bounded (issue 27):

* the sidebar offers the **``chexnet-mpi``** profile (:data:`MPI_PROFILE`, written into the
  IPython folder by :func:`install_mpi_profile`): its clusters are MPI engines under one
  ``mpiexec``, set up as :class:`~chexnet_utils.cluster.distributed.MPICluster` sets up its own
  (:func:`configure_mpi_profile`), ready for Horovod;
* closing a notebook's tab in JupyterLab shuts its kernel down, and with it the clusters
  and services the kernel started (:data:`LAB_OVERRIDES`, JupyterLab's ``kernelShutdown``
  setting, off by default, installed as an application default by
  :func:`install_lab_overrides`);
* a kernel that no browser tab is connected to any more (the browser was closed) is shut
  down after :data:`CULL_IDLE_S` idle seconds (Jupyter Server's kernel culling; a busy
  kernel, one running a cell, is left alone).

The tests start the same server headless (``tests/support/lab_server.py``: a free loopback port,
a token handed over in the environment, its own runtime, config and settings folders).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from chexnet_utils.platform.root import root_switches

if TYPE_CHECKING:
    from traitlets.config import Config

PROJECT_KERNEL = "chexnet-at-scale"
"""Name of the kernel ``scripts/setup.sh`` registers (``KERNEL_NAME`` there)."""
LOOPBACK = "127.0.0.1"
MPI_PROFILE = "chexnet-mpi"
"""The ipyparallel profile the IPython Parallel sidebar offers for Horovod-ready MPI engines."""
SIDEBAR_ENGINES = 2
"""Engines of a ``chexnet-mpi`` cluster unless the sidebar's "+ NEW" dialog asks otherwise."""
LAB_OVERRIDES = {"@jupyterlab/notebook-extension:tracker": {"kernelShutdown": True}}
"""JupyterLab settings this project changes: closing a notebook shuts its kernel down."""
CULL_IDLE_S = 3600
"""A kernel idle this long with no browser tab connected is shut down (``make lab``)."""
CULL_INTERVAL_S = 60
SHUTDOWN_WAIT_S = 30
"""Seconds a kernel gets to exit on its own (Kernel > Restart / Shut Down) before Jupyter
sends SIGTERM, then SIGKILL: jupyter_client's ``KernelManager.shutdown_wait_time`` is 5 s,
shorter than a cluster's or a local Slurm's clean stop at exit (engines, ``scancel``, the
daemons; the security review's finding 10). A kernel that exits sooner is not kept waiting."""


def lab_args(root_dir: str | os.PathLike[str], *, kernel: str = PROJECT_KERNEL,
             ip: str = LOOPBACK, cull_idle_s: float = CULL_IDLE_S,
             cull_interval_s: float = CULL_INTERVAL_S) -> list[str]:
    """Arguments after ``jupyter lab`` that ``make lab`` and the tests' ``LabServer`` share.

    Only ``kernel`` is offered and it is the default, so notebooks saved with another
    Python kernel open on it. A kernel idle for ``cull_idle_s`` seconds with no browser
    connected is shut down, checked every ``cull_interval_s`` (Jupyter Server's
    ``MappingKernelManager.cull_idle_timeout``; busy kernels are not culled). A kernel asked
    to shut down gets :data:`SHUTDOWN_WAIT_S` to stop its clusters before it is killed. As root
    in a container, in a namespace of one's own or with ``CHEXNET_ALLOW_ROOT=1``
    ``--allow-root`` is added, which Jupyter Server otherwise refuses
    (:mod:`chexnet_utils.platform.root`).
    """
    args = [f"--ip={ip}", f"--ServerApp.root_dir={os.fspath(root_dir)}",
            f"--KernelSpecManager.allowed_kernelspecs={kernel}",
            f"--MappingKernelManager.default_kernel_name={kernel}",
            f"--MappingKernelManager.cull_idle_timeout={cull_idle_s:g}",
            f"--MappingKernelManager.cull_interval={cull_interval_s:g}",
            f"--KernelManager.shutdown_wait_time={SHUTDOWN_WAIT_S}"]
    if root_switches():  # RootRefused as the host's root without CHEXNET_ALLOW_ROOT=1
        args.append("--allow-root")
    return args


def configure_mpi_profile(c: Config, n: int = SIDEBAR_ENGINES) -> None:
    """Fill an ``ipcluster_config.py``'s ``c`` (``get_config()``) so that a cluster of this
    profile, started from the IPython Parallel sidebar (or ``ipcluster start --profile
    chexnet-mpi``), is what ``MPICluster(n)`` starts
    (:meth:`~chexnet_utils.cluster.distributed.MPICluster.ipyparallel_config`): MPI engines under
    one ``mpiexec``, so Horovod finds its peers; unbound, as ``horovodrun`` leaves them; shared
    memory between ranks; the controller on loopback; as root, Open MPI's allow-root
    switches; a thread budget for ``n`` engines. ``--oversubscribe`` is always passed: the
    sidebar's dialog may ask for more engines than there are cores."""
    from chexnet_utils.cluster.distributed import MPICluster

    settings = MPICluster(n=n, oversubscribe=True).ipyparallel_config(c)
    for name, value in settings.items():
        setattr(c.Cluster, name, value)


PROFILE_CONFIG = (f'''"""ipyparallel profile "{MPI_PROFILE}": MPI engines ready for Horovod, '''
                  f'''as MPICluster starts them.

Written by chexnet_utils.lab (make lab) and rewritten there: edit the package, not this file.
Start it from JupyterLab's IPython Parallel sidebar, or: ipcluster start --profile {MPI_PROFILE}
"""
from chexnet_utils.lab import configure_mpi_profile

configure_mpi_profile(get_config())  # noqa: F821 (given by the config loader)
''')


def install_mpi_profile(ipython_dir: str | os.PathLike[str] | None = None) -> Path:
    """Write the ``chexnet-mpi`` profile (:data:`PROFILE_CONFIG`) into ``ipython_dir``
    (default: IPython's, ``$IPYTHONDIR`` or ``~/.ipython``); return its folder. The sidebar
    lists every ``profile_*`` folder there."""
    if ipython_dir is None:
        from IPython.paths import get_ipython_dir

        ipython_dir = get_ipython_dir()
    folder = Path(ipython_dir) / f"profile_{MPI_PROFILE}"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "ipcluster_config.py"
    if not config.exists() or config.read_text(encoding="utf-8") != PROFILE_CONFIG:
        config.write_text(PROFILE_CONFIG, encoding="utf-8")
    return folder


def install_lab_overrides(prefix: str | os.PathLike[str] = sys.prefix) -> Path:
    """Merge :data:`LAB_OVERRIDES` into JupyterLab's application defaults of this
    environment (``<prefix>/share/jupyter/lab/settings/overrides.json``, read by every
    JupyterLab run from it); a learner's own settings still win. Returns the file."""
    path = Path(prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    current: dict[str, dict[str, object]] = {}
    if path.exists():
        current = json.loads(path.read_text(encoding="utf-8") or "{}")
    merged = {**current, **{k: {**current.get(k, {}), **v} for k, v in LAB_OVERRIDES.items()}}
    if merged != current or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(merged, indent=2) + "\n", encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m chexnet_utils.lab [--notebook-dir DIR] [jupyter lab options...]``.

    Runs ``jupyter lab`` on loopback with the project kernel; other options are passed
    through (``--port 8801``; ``JUPYTER_PORT`` works too). Ctrl-C and SIGTERM stop the
    server (it shuts its kernels down); kernels, engines and anything else started from the
    lab do not outlive this command, even if it is killed
    (:mod:`chexnet_utils.platform.processes`). First it (re)writes the ``chexnet-mpi`` profile into
    the IPython folder and this environment's JupyterLab defaults (:func:`install_mpi_profile`,
    :func:`install_lab_overrides`). Returns the server's exit status (143 after SIGTERM).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if "--private" in args:
        args.remove("--private")
        return run_private(args)
    root = "notebooks"
    for i, arg in enumerate(args):
        if arg.startswith("--notebook-dir="):
            root = args.pop(i).split("=", 1)[1]
            break
        if arg == "--notebook-dir" and i + 1 < len(args):
            root = args[i + 1]
            del args[i:i + 2]
            break
    cmd = [sys.executable, "-m", "jupyter", "lab", *lab_args(root), *args]
    for what, install in (("IPython Parallel sidebar: profile " + repr(MPI_PROFILE),
                           install_mpi_profile),
                          ("closing a notebook shuts its kernel down", install_lab_overrides)):
        try:
            print(f"{what} ({install()})", flush=True)
        except OSError as e:  # a read-only environment or home: the lab runs without it
            print(f"warning: {what}: not installed ({e})", file=sys.stderr, flush=True)
    print("+", " ".join(cmd), flush=True)
    return _serve(cmd, stop_wait_s=SHUTDOWN_WAIT_S + 10, say_stopped=True)


def _serve(cmd: list[str], *, env: dict[str, str] | None = None, stop_wait_s: float,
           say_stopped: bool) -> int:
    """Run the server ``cmd`` (in ``env``) until it ends or this command is interrupted;
    return its exit status as a shell says it (killed by signal N: 128 + N). On Ctrl-C (the
    server got it too) or SIGTERM the server gets SIGTERM and ``stop_wait_s`` to stop its
    kernels, then SIGKILL; ``say_stopped``: one line on stderr says so. Nothing it started
    outlives this command (:func:`~chexnet_utils.platform.processes.command_lifetime`)."""
    from chexnet_utils.platform.processes import (
        command_lifetime,
        exit_status,
        interruption,
        stop_processes,
    )

    with command_lifetime():
        server = None
        try:
            server = subprocess.Popen(cmd, env=env)
            rc = server.wait()
            return 128 - rc if rc < 0 else rc
        except KeyboardInterrupt as e:
            if server is None:
                return exit_status(e)
            stop_processes([server], stop_wait_s)
            if say_stopped:
                print(f"\ninterrupted by {interruption(e)}: JupyterLab and its kernels stopped",
                      file=sys.stderr, flush=True)
            return exit_status(e)


def _pop_port(args: list[str], default: int) -> int:
    """Take ``--port N`` / ``--port=N`` out of ``args`` (the forwarder's port in private mode)."""
    for i, arg in enumerate(args):
        if arg.startswith("--port="):
            return int(args.pop(i).split("=", 1)[1])
        if arg == "--port" and i + 1 < len(args):
            port = int(args[i + 1])
            del args[i:i + 2]
            return port
    return int(os.environ.get("JUPYTER_PORT", default))


def run_private(args: list[str], port: int | None = None) -> int:
    """``make lab``'s default: the lab, and every kernel, cluster and server it starts, in a
    network namespace of the learner's own (:mod:`chexnet_utils.platform.exposure`), JupyterLab
    on a Unix socket there, and ``127.0.0.1:PORT`` (``--port``, default 8888, the next free
    one when taken) forwarded to it from this namespace (:class:`~chexnet_utils.platform.forward.
    UnixForwarder`), so the browser opens the usual URL. The token is made here and handed to
    Jupyter in its environment. Where this account cannot make a namespace (unprivileged user
    namespaces off, e.g. Ubuntu 24.04's AppArmor default), one line says so and the lab runs
    on loopback as without ``--private``: everything but the servers of notebooks 06 and 07
    works, and those refuse to start with their own line (the gate fails closed). Returns the
    lab's exit status."""
    from chexnet_utils.platform.exposure import namespace_problem, private_network_command
    from chexnet_utils.platform.forward import UnixForwarder

    problem = namespace_problem()
    if problem is not None:
        print(f"note: no network namespace of your own here ({problem}); JupyterLab runs on "
              f"loopback instead, and the unauthenticated servers of notebooks 06 and 07 will "
              f"refuse to start", file=sys.stderr, flush=True)
        return main(args)
    wanted = _pop_port(args, 8888) if port is None else port
    folder = tempfile.mkdtemp(prefix="chexnet-lab-")  # mode 0700: the socket's folder
    sock = os.path.join(folder, "lab.sock")
    token = secrets.token_hex(24)
    forwarder = UnixForwarder(sock, LOOPBACK, wanted)
    try:
        try:
            forwarder.start()
        except OSError:  # the port is taken: a free one
            forwarder = UnixForwarder(sock, LOOPBACK, 0).start()
        inner = private_network_command([sys.executable, "-m", "chexnet_utils.lab", *args,
                                         f"--ServerApp.sock={sock}", "--no-browser"])
        print(f"JupyterLab in a network namespace of your own (nothing it starts is reachable "
              f"by another account or host): http://{LOOPBACK}:{forwarder.port}/lab?token="
              f"{token}", flush=True)
        # the lab inside stops its own server and says so: wait for it a little longer
        return _serve(inner, env={**os.environ, "JUPYTER_TOKEN": token},
                      stop_wait_s=SHUTDOWN_WAIT_S + 20, say_stopped=False)
    finally:
        forwarder.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
