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

:class:`LabServer` starts the same server headless for tests: a free loopback port, a random
token handed over in the environment (``JUPYTER_TOKEN``: never on a command line, which every
account can read in ``ps``; a process's environment only its owner can), its own runtime,
config, settings and workspace folders (nothing is written to the user's ``~/.jupyter`` or to
the notebook folder's workspace state), and a teardown that leaves no process behind
(JupyterLab, its kernels) even when the test fails.
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
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import psutil

PROJECT_KERNEL = "chexnet-at-scale"
"""Name of the kernel ``scripts/setup.sh`` registers (``KERNEL_NAME`` there)."""
PROJECT_KERNEL_DISPLAY = "Python (chexnet-at-scale)"
"""Its display name, as the kernel selector shows it."""
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
    """Arguments after ``jupyter lab`` that ``make lab`` and :class:`LabServer` share.

    Only ``kernel`` is offered and it is the default, so notebooks saved with another
    Python kernel open on it. A kernel idle for ``cull_idle_s`` seconds with no browser
    connected is shut down, checked every ``cull_interval_s`` (Jupyter Server's
    ``MappingKernelManager.cull_idle_timeout``; busy kernels are not culled). A kernel asked
    to shut down gets :data:`SHUTDOWN_WAIT_S` to stop its clusters before it is killed. As root
    (containers, CI) ``--allow-root`` is added, which Jupyter Server otherwise refuses.
    """
    args = [f"--ip={ip}", f"--ServerApp.root_dir={os.fspath(root_dir)}",
            f"--KernelSpecManager.allowed_kernelspecs={kernel}",
            f"--MappingKernelManager.default_kernel_name={kernel}",
            f"--MappingKernelManager.cull_idle_timeout={cull_idle_s:g}",
            f"--MappingKernelManager.cull_interval={cull_interval_s:g}",
            f"--KernelManager.shutdown_wait_time={SHUTDOWN_WAIT_S}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--allow-root")
    return args


_INLINE = [
    (re.compile(r"!\[([^\]]*)\]\([^)]*\)"), r"\1"),   # images -> alt text
    (re.compile(r"\[([^\]]*)\]\([^)]*\)"), r"\1"),    # links -> their text
    (re.compile(r"`([^`]*)`"), r"\1"),                # inline code
    (re.compile(r"(\*\*|__)(.+?)\1"), r"\2"),         # bold
    (re.compile(r"(?<!\w)[*_](.+?)[*_](?!\w)"), r"\1"),  # italics
]


def heading_text(markdown: str) -> str:
    """The text a Markdown heading line renders to: markers, inline markup and spaces removed.

    >>> heading_text("# 02 · The old vs the new `tf.data` **recipe**")
    '02 · The old vs the new tf.data recipe'
    """
    text = re.sub(r"^\s{0,3}#+\s*", "", markdown.strip())
    text = re.sub(r"\s+#+\s*$", "", text)
    for pattern, repl in _INLINE:
        text = pattern.sub(repl, text)
    return " ".join(text.split())


def notebook_title(path: str | os.PathLike[str]) -> str:
    """The rendered title of a notebook: the first ``# `` heading of its first markdown cell.

    Raises ``ValueError`` if the first markdown cell has no level-1 heading.
    """
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        for line in source.splitlines():
            if re.match(r"^\s{0,3}# ", line):
                return heading_text(line)
        raise ValueError(f"{path}: the first markdown cell has no '# ' heading")
    raise ValueError(f"{path}: no markdown cell")


def configure_mpi_profile(c: object, n: int = SIDEBAR_ENGINES) -> None:
    """Fill an ``ipcluster_config.py``'s ``c`` (``get_config()``) so that a cluster of this
    profile, started from the IPython Parallel sidebar (or ``ipcluster start --profile
    chexnet-mpi``), is what ``MPICluster(n)`` starts
    (:meth:`~chexnet_utils.cluster.distributed.MPICluster.ipyparallel_config`): MPI engines under one
    ``mpiexec``, so Horovod finds its peers; unbound, as ``horovodrun`` leaves them; shared
    memory between ranks; the controller on loopback; as root, Open MPI's allow-root
    switches; a thread budget for ``n`` engines. ``--oversubscribe`` is always passed: the
    sidebar's dialog may ask for more engines than there are cores."""
    from chexnet_utils.cluster.distributed import MPICluster

    settings = MPICluster(n=n, oversubscribe=True).ipyparallel_config(c)
    for name, value in settings.items():
        setattr(c.Cluster, name, value)  # type: ignore[attr-defined]


PROFILE_CONFIG = f'''"""ipyparallel profile "{MPI_PROFILE}": MPI engines ready for Horovod, as MPICluster starts them.

Written by chexnet_utils.lab (make lab) and rewritten there: edit the package, not this file.
Start it from JupyterLab's IPython Parallel sidebar, or: ipcluster start --profile {MPI_PROFILE}
"""
from chexnet_utils.lab import configure_mpi_profile

configure_mpi_profile(get_config())  # noqa: F821 (given by the config loader)
'''


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


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LabServer:
    """A headless JupyterLab on loopback for tests; use as a context manager.

    ``root_dir`` is served as is; pass a temporary copy of the notebooks so that nothing a
    browser does (kernel metadata, autosave, checkpoints) reaches the committed files.
    All of Jupyter's own state goes to a private temporary folder, removed by :meth:`stop`;
    its IPython folder holds the ``chexnet-mpi`` profile. ``cull_idle_s`` / ``cull_interval_s``:
    see :func:`lab_args`.
    """

    def __init__(self, root_dir: str | os.PathLike[str], *, kernel: str = PROJECT_KERNEL,
                 startup_timeout: float = 90.0, python: str = sys.executable,
                 cull_idle_s: float = CULL_IDLE_S, cull_interval_s: float = CULL_INTERVAL_S
                 ) -> None:
        self.root_dir = Path(root_dir)
        self.kernel = kernel
        self.cull = (cull_idle_s, cull_interval_s)
        self.startup_timeout = startup_timeout
        self.python = python
        self.token = secrets.token_hex(16)
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.state_dir: Path | None = None
        self._log: IO[bytes] | None = None
        self._seen: dict[int, psutil.Process] = {}
        """Every process the server has started so far (kernels included), remembered at each
        request so that :meth:`stop` finds them even if the server died and they were
        re-parented."""

    def _remember_children(self) -> None:
        if self.process is None:
            return
        try:
            for child in psutil.Process(self.process.pid).children(recursive=True):
                self._seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def url(self, path: str, *, token: bool = True) -> str:
        """Absolute URL of ``path`` (``/lab/tree/x.ipynb``), with the token as a query."""
        sep = "&" if "?" in path else "?"
        return f"{self.base_url}{path}{sep}token={self.token}" if token else self.base_url + path

    def request(self, path: str, method: str = "GET", timeout: float = 10.0) -> object:
        """Call the REST API with the token; the decoded JSON answer (``None`` if empty)."""
        req = urllib.request.Request(self.base_url + path, method=method,
                                     headers={"Authorization": f"token {self.token}"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                body = resp.read()
        finally:
            self._remember_children()
        return json.loads(body) if body.strip() else None

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's log (for failure messages)."""
        if self.state_dir is None or not (self.state_dir / "lab.log").exists():
            return ""
        text = (self.state_dir / "lab.log").read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def start(self) -> "LabServer":
        """Start the server and wait until its REST API answers; raise with its log if not."""
        self.state_dir = Path(tempfile.mkdtemp(prefix="chexnet-lab-"))
        for sub in ("config", "runtime", "settings", "workspaces", "ipython"):
            (self.state_dir / sub).mkdir()
        install_mpi_profile(self.state_dir / "ipython")
        if self.python == sys.executable:
            install_lab_overrides()
        # No news/update prompts: a test run must not ask for, or try to reach, the internet.
        notification = self.state_dir / "settings/@jupyterlab/apputils-extension"
        notification.mkdir(parents=True)
        (notification / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        env = dict(os.environ, JUPYTER_CONFIG_DIR=str(self.state_dir / "config"),
                   JUPYTER_RUNTIME_DIR=str(self.state_dir / "runtime"),
                   IPYTHONDIR=str(self.state_dir / "ipython"))
        env.pop("JUPYTER_PORT", None)
        env["JUPYTER_TOKEN"] = self.token  # jupyter_server's IdentityProvider.token default
        self.port = free_port()
        argv = [self.python, "-m", "jupyter", "lab",
                *lab_args(self.root_dir, kernel=self.kernel, cull_idle_s=self.cull[0],
                          cull_interval_s=self.cull[1]),
                f"--port={self.port}", "--ServerApp.port_retries=0", "--no-browser",
                f"--LabApp.user_settings_dir={self.state_dir / 'settings'}",
                f"--LabApp.workspaces_dir={self.state_dir / 'workspaces'}"]
        self._log = open(self.state_dir / "lab.log", "wb")
        self.process = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, cwd=self.root_dir)
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.process.returncode}:\n"
                                   + self.log_tail())
            try:
                self.request("/api/status", timeout=2)
                return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"JupyterLab did not answer within {self.startup_timeout:.0f} s:\n"
                                   + self.log_tail())
            time.sleep(0.2)

    def stop(self, timeout: float = 15.0) -> list[int]:
        """Shut down (kernels first), kill whatever is left, remove the state folder.

        Returns the pids that had to be killed (empty when the shutdown was clean).
        """
        killed: list[int] = []
        proc = self.process
        if proc is not None:
            try:
                tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                tree = []
            if proc.poll() is None:
                try:   # graceful: the server stops its kernels, then itself
                    self.request("/api/shutdown", method="POST", timeout=5)
                except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
            # Kernels and anything they started that outlived the server, also those seen
            # earlier and re-parented since (psutil checks each is still the same process).
            try:
                tree += psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                pass
            tree += [p for p in self._seen.values() if p.is_running()]
            self._seen.clear()
            _, alive = psutil.wait_procs(tree, timeout=5)
            for p in alive:
                try:
                    p.kill()
                    killed.append(p.pid)
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(alive, timeout=5)
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.state_dir is not None:
            shutil.rmtree(self.state_dir, ignore_errors=True)
            self.state_dir = None
        return killed

    def __enter__(self) -> "LabServer":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m chexnet_utils.lab [--notebook-dir DIR] [jupyter lab options...]``.

    Runs ``jupyter lab`` on loopback with the project kernel; other options are passed
    through (``--port 8801``; ``JUPYTER_PORT`` works too). Ctrl-C and SIGTERM stop the
    server (it shuts its kernels down); kernels, engines and anything else started from the
    lab do not outlive this command, even if it is killed (:mod:`chexnet_utils.platform.processes`).
    First it (re)writes the ``chexnet-mpi`` profile into the IPython folder and this
    environment's JupyterLab defaults (:func:`install_mpi_profile`,
    :func:`install_lab_overrides`). Returns the server's exit status (143 after SIGTERM).
    """
    from chexnet_utils.platform.processes import command_lifetime, exit_status, interruption

    args = list(sys.argv[1:] if argv is None else argv)
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
    with command_lifetime():
        server = None
        try:
            server = subprocess.Popen(cmd)
            rc = server.wait()
            return 128 - rc if rc < 0 else rc  # killed by signal N: 128 + N, as a shell says
        except KeyboardInterrupt as e:  # Ctrl-C (the server got it too) or SIGTERM
            if server is None:
                return exit_status(e)
            server.send_signal(signal.SIGTERM)  # Jupyter stops its kernels, then itself
            try:
                server.wait(SHUTDOWN_WAIT_S + 10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            print(f"\ninterrupted by {interruption(e)}: JupyterLab and its kernels stopped",
                  file=sys.stderr, flush=True)
            return exit_status(e)


if __name__ == "__main__":
    sys.exit(main())
