"""A headless JupyterLab for the browser and learner-session tests (repository tooling, not part
of the package): :class:`LabServer` starts JupyterLab as ``make lab`` does
(:func:`chexnet_utils.lab.lab_args`), on a free loopback port, with a random token handed over
in the environment (``JUPYTER_TOKEN``: never on a command line, which every account can read in
``ps``; a process's environment only its owner can), its own runtime, config, settings and
workspace folders (nothing is written to the user's ``~/.jupyter`` or to the notebook folder's
workspace state), and a teardown that leaves no process behind (JupyterLab, its kernels) even
when the test fails. :func:`notebook_title` is the title JupyterLab shows for a notebook.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO

import psutil

from chexnet_utils.lab import (
    CULL_IDLE_S,
    CULL_INTERVAL_S,
    LOOPBACK,
    PROJECT_KERNEL,
    SHUTDOWN_WAIT_S,
    install_lab_overrides,
    install_mpi_profile,
    lab_args,
)
from chexnet_utils.platform.ports import free_port

PROJECT_KERNEL_DISPLAY = "Python (chexnet-at-scale)"
"""The display name ``scripts/setup.sh`` gives the project's kernel, as the kernel selector
shows it."""

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

    def shut_down_sessions(self, which: Callable[[str], bool]) -> None:
        """DELETE every session whose path ``which(path)`` accepts, and its kernel; one already
        gone (404: closing its tab shut it down, or it was culled) is no error. The server gives
        a kernel up to ``SHUTDOWN_WAIT_S`` to stop its clusters before it kills it, and answers
        only then, so each request waits that long and a margin (the default 10 s timed out on
        a loaded machine)."""
        for session in self.request("/api/sessions"):
            if not which(session["path"]):
                continue
            try:
                self.request(f"/api/sessions/{session['id']}", method="DELETE",
                             timeout=SHUTDOWN_WAIT_S + 15.0)
            except urllib.error.HTTPError as e:
                if e.code != 404:
                    raise

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
                raise TimeoutError("JupyterLab did not answer within "
                                   f"{self.startup_timeout:.0f} s:\n" + self.log_tail())
            time.sleep(0.2)

    def stop(self, timeout: float = 15.0) -> list[int]:
        """Shut down (kernels first), kill whatever is left, remove the state folder.

        Returns the pids that had to be killed (empty when the shutdown was clean).
        """
        killed: list[int] = []
        proc = self.process
        if proc is not None:
            try:
                tree = [psutil.Process(proc.pid),
                        *psutil.Process(proc.pid).children(recursive=True)]
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
