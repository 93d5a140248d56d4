"""What the browser tests share (test_browser.py, test_learner_session.py): one JupyterLab and
one headless Chromium for the whole folder, and where the screenshots go.

JupyterLab is started as ``make lab`` starts it (:class:`tests.support.lab_server.LabServer`, the
same arguments) over a temporary folder: a copy of ``notebooks/`` (so the committed notebooks get
no kernel metadata, autosave or checkpoints) and an empty ``scratch/`` folder for notebooks
the tests write. Its kernels are culled after :data:`CULL_IDLE_S` idle seconds without a
browser (``make lab``: an hour), so that a closed browser's kernel can be seen going.
Teardown stops Chromium, JupyterLab and its kernels and fails if any process the folder's
tests started is still alive.

Chromium: :mod:`tests.support.chromium` (skipped without it when not root).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.chromium import headless_chromium
from tests.support.lab_server import LabServer
from tests.support.proctree import cmdline_of

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CULL_IDLE_S, CULL_INTERVAL_S = 4, 1
"""The test server's kernel culling (``make lab``: 3600 s, checked every 60 s)."""


def own_processes() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture(scope="package")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """JupyterLab over a copy of the notebooks and a ``scratch/`` folder; afterwards no
    process of ours may remain."""
    before = own_processes()
    root = tmp_path_factory.mktemp("lab-notebooks")
    for nb in NOTEBOOKS:
        shutil.copy2(nb, root / nb.name)
    (root / "scratch").mkdir()
    server = LabServer(root, cull_idle_s=CULL_IDLE_S, cull_interval_s=CULL_INTERVAL_S)
    try:
        with server:
            # #30 item 3: the token is random and on no command line (`ps` shows those to
            # every account); the server and its kernels get it in their environment
            assert len(server.token) == 32 and server.process is not None
            cmdlines = [cmdline_of(p) for p in
                        [psutil.Process(server.process.pid),
                         *psutil.Process(server.process.pid).children(recursive=True)]]
            assert not [c for c in cmdlines if server.token in c], cmdlines
            yield server
    finally:
        shutil.rmtree(root, ignore_errors=True)
        leftover = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        _, alive = psutil.wait_procs(leftover, timeout=10)
        described = []
        for p in alive:
            try:
                described.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
                p.kill()
            except psutil.NoSuchProcess:
                pass
        assert not described, ("processes left after teardown (now killed):\n"
                               + "\n".join(described))
        assert server.state_dir is None


@pytest.fixture(scope="package")
def browser(lab: LabServer) -> Iterator[object]:
    """Headless Debian Chromium through Playwright (no browser download)."""
    with headless_chromium() as chromium:
        yield chromium


@pytest.fixture(scope="package")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go: ``$CHEXNET_BROWSER_SHOTS`` (``make browser-check``: the
    repository's ``build/browser``), else a temporary folder."""
    folder = os.environ.get("CHEXNET_BROWSER_SHOTS")
    if not folder:
        return tmp_path_factory.mktemp("browser")
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Path(folder)
