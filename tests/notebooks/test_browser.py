"""Browser check: each notebook opens in JupyterLab (as ``make lab`` starts it) and renders.

JupyterLab runs headless on loopback (a free port, a random token passed in its environment) over a temporary copy of
``notebooks/``, so the committed notebooks get no kernel metadata, autosave or checkpoints.
Debian's Chromium, driven by Playwright, opens each ``notebooks/NN_*.ipynb`` and must show
the notebook's title (the first ``# `` heading of its first markdown cell) as a rendered h1,
the project kernel in the kernel selector, and ipyparallel's "IPython Parallel" sidebar.
A screenshot per notebook goes to ``$CHEXNET_BROWSER_SHOTS`` (``make browser-check`` sets it to
``build/browser/``), else to the test's temporary folder. Teardown stops Chromium, JupyterLab
and its kernels and fails if any process this module started is still alive.

Chromium comes from ``scripts/setup.sh`` (``apt-get install chromium`` as root). Without it
the browser tests are skipped when not root (say so in the reason), and fail as root, where
setup should have installed it.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from urllib.parse import quote

import psutil
import pytest

from chexnet_utils import lab as lab_module
from chexnet_utils.lab import (PROJECT_KERNEL, PROJECT_KERNEL_DISPLAY, LabServer, heading_text,
                               lab_args, main, notebook_title)

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CHROMIUM = Path(os.environ.get("CHEXNET_CHROMIUM") or shutil.which("chromium")
                or "/usr/bin/chromium")  # the same lookup as scripts/setup.sh (PATH)
TIMEOUT_MS = 90_000   # per notebook: JupyterLab's first load on a busy 2-core machine


# --- without a browser ---------------------------------------------------------------------

def test_heading_text_strips_markdown():
    assert heading_text("# 02 · The old vs the new `tf.data` recipe") == \
        "02 · The old vs the new tf.data recipe"
    assert heading_text("#  A **bold** and *italic* [link](x.md) title ##") == \
        "A bold and italic link title"
    assert heading_text("# snake_case_name stays") == "snake_case_name stays"


def test_notebook_title_is_first_heading_of_first_markdown_cell(tmp_path):
    import json
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps({"cells": [
        {"cell_type": "code", "source": "# not this\n", "metadata": {}, "outputs": []},
        {"cell_type": "markdown", "source": ["Intro\n", "# 07 · The `title`\n", "# later\n"],
         "metadata": {}},
    ]}))
    assert notebook_title(path) == "07 · The title"
    path.write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": "## only h2"}]}))
    with pytest.raises(ValueError, match="no '# ' heading"):
        notebook_title(path)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_has_a_numbered_title(notebook):
    assert notebook_title(notebook).startswith(notebook.name[:2] + " ")


def test_make_lab_is_loopback_with_only_the_project_kernel(monkeypatch, capsys):
    args = lab_args("notebooks")
    assert "--ip=127.0.0.1" in args
    assert f"--KernelSpecManager.allowed_kernelspecs={PROJECT_KERNEL}" in args
    assert f"--MappingKernelManager.default_kernel_name={PROJECT_KERNEL}" in args
    calls = []

    class FakeServer:  # `make lab` runs the server as a child and waits for it
        def wait(self, timeout=None):
            return 0

    real_popen = lab_module.subprocess.Popen

    def popen(argv, **kwargs):
        if "chexnet_utils.processes" in argv:  # the command's watchdog: the real thing
            return real_popen(argv, **kwargs)
        calls.append(argv)
        return FakeServer()

    monkeypatch.setattr(lab_module.subprocess, "Popen", popen)
    assert main(["--notebook-dir", "nb", "--port", "8801"]) == 0
    (argv,) = calls
    assert argv[1:4] == ["-m", "jupyter", "lab"]
    assert "--ServerApp.root_dir=nb" in argv and argv[-2:] == ["--port", "8801"]
    assert "jupyter lab" in capsys.readouterr().out


# --- JupyterLab and Chromium ---------------------------------------------------------------

def _own_processes() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab over a copy of the notebooks; afterwards no process of ours may remain."""
    before = _own_processes()
    root = tmp_path_factory.mktemp("lab-notebooks")
    for nb in NOTEBOOKS:
        shutil.copy2(nb, root / nb.name)
    server = LabServer(root)
    try:
        with server:
            # #30 item 3: the token is random and on no command line (`ps` shows those to
            # every account); the server and its kernels get it in their environment
            assert len(server.token) == 32 and server.process is not None
            cmdlines = [" ".join(p.cmdline()) for p in
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
        assert not described, "processes left after teardown (now killed):\n" + "\n".join(described)
        assert server.state_dir is None


@pytest.fixture(scope="module")
def browser(lab):
    """Headless Debian Chromium through Playwright (no browser download)."""
    if not CHROMIUM.exists():
        how = "sudo apt-get update && sudo apt-get install -y chromium"
        release = Path("/etc/os-release")
        if release.exists() and re.search(r"^ID=\"?ubuntu", release.read_text(), re.M):
            pytest.skip("browser check skipped: Ubuntu's chromium apt package is a snap shim "
                        "that `make setup` does not install; put a Chromium binary on PATH "
                        "or name it in CHEXNET_CHROMIUM")
        if os.geteuid() == 0:
            pytest.fail(f"{CHROMIUM} is missing although this is root: `make setup` installs it "
                        f"(or run: {how})")
        pytest.skip(f"browser check skipped: Debian chromium is not installed at {CHROMIUM} and "
                    f"this is not root, so `make setup` could not install it; run: {how}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:   # pinned in requirements/base.txt
        pytest.fail(f"playwright is not installed ({exc}); run `make setup`")
    pw = sync_playwright().start()
    try:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                      args=["--disable-dev-shm-usage", "--disable-gpu"])
        try:
            yield chromium
        finally:
            chromium.close()
    finally:
        pw.stop()


def test_lab_serves_project_kernel_and_ipyparallel(lab):
    specs = lab.request("/api/kernelspecs")
    assert specs["default"] == PROJECT_KERNEL
    assert list(specs["kernelspecs"]) == [PROJECT_KERNEL], "only the project kernel is offered"
    assert specs["kernelspecs"][PROJECT_KERNEL]["spec"]["display_name"] == PROJECT_KERNEL_DISPLAY
    extensions = {e["name"]: e for e in lab.request("/lab/api/extensions")}
    ipp = extensions.get("ipyparallel-labextension")
    assert ipp and ipp["enabled"] and ipp["status"] == "ok", "ipyparallel's JupyterLab extension"
    assert isinstance(lab.request("/ipyparallel/clusters"), list), "ipyparallel's server extension"


def _shut_down_kernels(lab: LabServer, path: str) -> None:
    for session in lab.request("/api/sessions"):
        if session["path"] == path:
            lab.request(f"/api/sessions/{session['id']}", method="DELETE")


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go: ``$CHEXNET_BROWSER_SHOTS`` (``make browser-check``: the
    repository's ``build/browser``), else a temporary folder."""
    folder = os.environ.get("CHEXNET_BROWSER_SHOTS")
    if not folder:
        return tmp_path_factory.mktemp("browser")
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Path(folder)


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_renders_title_with_project_kernel(lab, browser, shots, notebook):
    from playwright.sync_api import expect

    title = notebook_title(notebook)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    try:
        # A workspace per notebook: each page opens this notebook only.
        page.goto(lab.url(f"/lab/workspaces/t{notebook.name[:2]}/tree/{quote(notebook.name)}"))
        heading = page.locator(".jp-NotebookPanel .jp-RenderedMarkdown h1").first
        # The rendered text, less the heading's anchor link (a hidden "¶").
        expect(heading).to_have_text(re.compile(rf"^\s*{re.escape(title)}\s*¶?\s*$"),
                                     timeout=TIMEOUT_MS)
        expect(page.locator(".jp-NotebookPanel-toolbar .jp-KernelName")).to_have_text(
            PROJECT_KERNEL_DISPLAY, timeout=TIMEOUT_MS)
        expect(page.locator('.jp-SideBar .lm-TabBar-tab[title="IPython Parallel"]')).to_have_count(1)
        deadline = time.monotonic() + TIMEOUT_MS / 1000
        while True:   # the kernel behind the selector really is the project kernel, alive
            kernels = [s["kernel"] for s in lab.request("/api/sessions")
                       if s["path"] == notebook.name]
            if kernels and kernels[0]["execution_state"] in ("idle", "busy"):
                break
            assert time.monotonic() < deadline, f"kernel did not start: {kernels}\n{lab.log_tail()}"
            time.sleep(0.25)
        assert kernels[0]["name"] == PROJECT_KERNEL
    finally:
        try:
            page.screenshot(path=str(shots / f"{notebook.stem}.png"))
        except Exception as e:  # a missing screenshot must not hide the real failure
            print(f"screenshot of {notebook.name} failed: {e}")
        finally:
            context.close()
            _shut_down_kernels(lab, notebook.name)
