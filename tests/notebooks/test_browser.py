"""Browser check: each notebook opens in JupyterLab (as ``make lab`` starts it) and renders.

JupyterLab runs headless on loopback (a free port, a random token passed in its environment)
over a temporary copy of ``notebooks/`` (the ``lab`` fixture of conftest.py, shared with
test_learner_session.py, which runs cells as a learner would).
Debian's Chromium, driven by Playwright, opens each ``notebooks/NN_*.ipynb`` (but 00, which
test_learner_session.py opens, checks the same way and runs) and must show
the notebook's title (the first ``# `` heading of its first markdown cell) as a rendered h1,
the project kernel in the kernel selector, and ipyparallel's "IPython Parallel" sidebar.
A screenshot per notebook goes to ``$CHEXNET_BROWSER_SHOTS`` (``make browser-check`` sets it to
``build/browser/``), else to the test's temporary folder. Teardown stops Chromium, JupyterLab
and its kernels and fails if any process these tests started is still alive (conftest.py,
which also says when the browser tests are skipped).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from chexnet_utils import lab as lab_module
from chexnet_utils.lab import (
    CULL_IDLE_S,
    LAB_OVERRIDES,
    MPI_PROFILE,
    PROJECT_KERNEL,
    SIDEBAR_ENGINES,
    install_lab_overrides,
    install_mpi_profile,
    lab_args,
    main,
)
from tests.notebooks.conftest import NOTEBOOKS
from tests.support.lab_server import PROJECT_KERNEL_DISPLAY, heading_text, notebook_title

COLLAPSED_TITLE_BLOCKS = 3   # notebooks whose title cell holds a collapsed block, at least


def first_markdown(notebook) -> str:  # noqa: ANN001
    """The source of the notebook's first markdown cell (its title cell)."""
    cells = json.loads(notebook.read_text())["cells"]
    return next("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def test_title_cells_hold_collapsed_blocks_the_browser_test_opens():
    """Enough title cells carry a <details> block for the browser check to see one render."""
    assert sum("<details>" in first_markdown(nb) for nb in NOTEBOOKS[1:]) >= COLLAPSED_TITLE_BLOCKS

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


def test_make_lab_is_loopback_with_only_the_project_kernel(monkeypatch, capsys, tmp_path):
    args = lab_args("notebooks")
    assert "--ip=127.0.0.1" in args
    assert f"--KernelSpecManager.allowed_kernelspecs={PROJECT_KERNEL}" in args
    assert f"--MappingKernelManager.default_kernel_name={PROJECT_KERNEL}" in args
    assert f"--MappingKernelManager.cull_idle_timeout={CULL_IDLE_S}" in args  # closed browsers
    assert "--KernelManager.shutdown_wait_time=30" in args  # time for a cluster's clean stop
    calls = []
    # what `make lab` installs first: the sidebar's profile (IPython's folder) and the
    # JupyterLab defaults (this environment's): here into temporary folders
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setattr(lab_module, "install_lab_overrides",
                        lambda: install_lab_overrides(tmp_path / "prefix"))

    class FakeServer:  # `make lab` runs the server as a child and waits for it
        def wait(self, timeout=None):
            return 0

    real_popen = lab_module.subprocess.Popen

    def popen(argv, **kwargs):
        if "chexnet_utils.platform.processes" in argv:  # the command's watchdog: the real thing
            return real_popen(argv, **kwargs)
        calls.append(argv)
        return FakeServer()

    monkeypatch.setattr(lab_module.subprocess, "Popen", popen)
    assert main(["--notebook-dir", "nb", "--port", "8801"]) == 0
    (argv,) = calls
    assert argv[1:4] == ["-m", "jupyter", "lab"]
    assert "--ServerApp.root_dir=nb" in argv and argv[-2:] == ["--port", "8801"]
    out = capsys.readouterr().out
    assert "jupyter lab" in out and f"profile '{MPI_PROFILE}'" in out
    assert (tmp_path / "ipython" / f"profile_{MPI_PROFILE}" / "ipcluster_config.py").exists()
    assert (tmp_path / "prefix/share/jupyter/lab/settings/overrides.json").exists()


def test_make_lab_runs_without_its_defaults_where_it_cannot_write_them(monkeypatch, capsys,
                                                                         tmp_path):
    def read_only(*args):  # noqa: ANN002, ANN202
        raise PermissionError(13, "Permission denied", "/usr/share/jupyter/lab/settings")

    class FakeServer:
        def wait(self, timeout=None):  # noqa: ANN001, ANN202
            return 0

    real_popen = lab_module.subprocess.Popen
    monkeypatch.setattr(lab_module, "install_lab_overrides", read_only)
    monkeypatch.setattr(lab_module, "install_mpi_profile", read_only)
    monkeypatch.setattr(lab_module.subprocess, "Popen", lambda argv, **kw: real_popen(argv, **kw)
                        if "chexnet_utils.platform.processes" in argv else FakeServer())
    assert main(["--notebook-dir", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "closing a notebook shuts its kernel down: not installed" in err
    assert f"profile '{MPI_PROFILE}': not installed" in err


def test_lab_defaults_are_merged_into_the_environment_s_overrides(tmp_path):
    settings = tmp_path / "share/jupyter/lab/settings/overrides.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"@jupyterlab/notebook-extension:tracker": {"x": 1},
                                    "@other/ext:plugin": {"y": 2}}))
    assert install_lab_overrides(tmp_path) == settings
    assert json.loads(settings.read_text()) == {
        "@jupyterlab/notebook-extension:tracker": {"x": 1, "kernelShutdown": True},
        "@other/ext:plugin": {"y": 2}}
    assert LAB_OVERRIDES == {"@jupyterlab/notebook-extension:tracker": {"kernelShutdown": True}}


def test_the_sidebar_profile_starts_mpi_engines_as_mpicluster_does(tmp_path, monkeypatch):
    """The ``chexnet-mpi`` profile as ipyparallel's cluster manager loads it (what the
    sidebar's card shows and starts): MPI engines, MPICluster's mpiexec arguments and
    environment, loopback controller, two engines."""
    import ipyparallel as ipp

    from chexnet_utils.cluster.distributed import MPICluster

    folder = install_mpi_profile(tmp_path)
    assert folder == tmp_path / f"profile_{MPI_PROFILE}"
    assert install_mpi_profile(tmp_path) == folder  # idempotent
    cluster = ipp.Cluster(profile_dir=str(folder))
    assert cluster.engine_launcher_class.__name__ == "MPIEngineSetLauncher"
    assert cluster.n == SIDEBAR_ENGINES == 2 and cluster.controller_ip == "127.0.0.1"
    reference = MPICluster(n=2, oversubscribe=True)
    mpi_args = list(cluster.config.MPIEngineSetLauncher.mpi_args)
    assert mpi_args == reference._mpiexec_args() and "--bind-to" in mpi_args
    assert dict(cluster.config.MPIEngineSetLauncher.environment) == reference.env_overrides()
    assert cluster.config.LocalControllerLauncher.environment["IPP_ENABLE_CURVE"] == "0"


# --- JupyterLab and Chromium (fixtures: conftest.py) ---------------------------------

def test_lab_serves_project_kernel_and_ipyparallel(lab):
    specs = lab.request("/api/kernelspecs")
    assert specs["default"] == PROJECT_KERNEL
    assert list(specs["kernelspecs"]) == [PROJECT_KERNEL], "only the project kernel is offered"
    assert specs["kernelspecs"][PROJECT_KERNEL]["spec"]["display_name"] == PROJECT_KERNEL_DISPLAY
    extensions = {e["name"]: e for e in lab.request("/lab/api/extensions")}
    ipp = extensions.get("ipyparallel-labextension")
    assert ipp and ipp["enabled"] and ipp["status"] == "ok", "ipyparallel's JupyterLab extension"
    assert isinstance(lab.request("/ipyparallel/clusters"), list), "ipyparallel's server extension"


@pytest.fixture(scope="module")
def lab_page(lab, browser):  # noqa: ANN001, ANN201
    """One JupyterLab page for every notebook: the application loads once (6-8 s each on a
    busy 2-core machine), and each test opens its notebook from the file browser, as a
    learner does, then closes its tab (which shuts its kernel down under ``make lab``)."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    try:
        page.goto(lab.url("/lab/workspaces/browser-check"))
        expect(page.locator(".jp-DirListing-item", has_text=NOTEBOOKS[-1].name)).to_be_visible(
            timeout=TIMEOUT_MS)
        yield page
    finally:
        context.close()


def _close_current_tab(page) -> None:  # noqa: ANN001
    """Close the notebook's tab; "Discard" if JupyterLab asks to save (the kernel adds its
    language_info to the notebook's metadata)."""
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current "
                 ".lm-TabBar-tabCloseIcon").click()
    deadline = time.monotonic() + 15
    while page.locator(".jp-NotebookPanel:visible").count() and time.monotonic() < deadline:
        discard = page.locator(".jp-Dialog button", has_text="Discard")
        if discard.count():
            discard.click()
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS[1:], ids=lambda p: p.name)
def test_notebook_renders_title_with_project_kernel(lab, lab_page, shots, notebook):
    """(Notebook 00 is opened, checked the same way and run by test_learner_session.py.)"""
    from playwright.sync_api import expect

    title = notebook_title(notebook)
    page = lab_page
    try:
        page.locator(".jp-DirListing-item", has_text=notebook.name).dblclick()
        panel = page.locator(".jp-NotebookPanel:visible")
        heading = panel.locator(".jp-RenderedMarkdown h1").first
        # The rendered text, less the heading's anchor link (a hidden "¶").
        expect(heading).to_have_text(re.compile(rf"^\s*{re.escape(title)}\s*¶?\s*$"),
                                     timeout=TIMEOUT_MS)
        expect(panel.locator(".jp-NotebookPanel-toolbar .jp-KernelName")).to_have_text(
            PROJECT_KERNEL_DISPLAY, timeout=TIMEOUT_MS)
        expect(page.locator(
            '.jp-SideBar .lm-TabBar-tab[title="IPython Parallel"]')).to_have_count(1)
        if "<details>" in first_markdown(notebook):   # the title cell's collapsed block
            block = panel.locator(".jp-RenderedMarkdown").first.locator("details").first
            expect(block.locator("summary")).to_be_visible(timeout=TIMEOUT_MS)
            assert block.get_attribute("open") is None, "a <details> block renders open"
            # the markdown inside rendered as HTML (a blank line after </summary>), hidden
            assert block.locator("p, ul, ol, pre, table").count() > 0
            expect(block.locator("p, ul, ol, pre, table").first).to_be_hidden()
        deadline = time.monotonic() + TIMEOUT_MS / 1000
        while True:   # the kernel behind the selector really is the project kernel, alive
            kernels = [s["kernel"] for s in lab.request("/api/sessions")
                       if s["path"] == notebook.name]
            if kernels and kernels[0]["execution_state"] in ("idle", "busy"):
                break
            assert time.monotonic() < deadline, (f"kernel did not start: {kernels}\n"
                                                 f"{lab.log_tail()}")
            time.sleep(0.25)
        assert kernels[0]["name"] == PROJECT_KERNEL
    finally:
        try:
            page.screenshot(path=str(shots / f"{notebook.stem}.png"))
        except Exception as e:  # a missing screenshot must not hide the real failure
            print(f"screenshot of {notebook.name} failed: {e}")
        finally:
            _close_current_tab(page)
            lab.shut_down_sessions(lambda path: path == notebook.name)
