"""A learner's session in a real browser (issue 27): run cells, watch engines, interrupt,
restart, close the tab, start engines from the sidebar; nothing is left behind.

Debian's Chromium, driven by Playwright, works in the JupyterLab of conftest.py (started as
``make lab`` starts it) as a learner would, through the menus, the toolbar and the IPython
Parallel sidebar, and reads what the page shows:

1. notebook 00 (its title, kernel and sidebar checked as test_browser.py checks the other
   notebooks), Run > Run All Cells: every code cell runs, no error in the page or in the
   saved notebook, tables among the outputs;
2. a scratch notebook (``scratch/``, not ``notebooks/``) on the project kernel starts a
   2-engine ``MPICluster`` as notebook 04 does and runs a ``%%px`` cell: both ranks print;
3. a long ``%%px`` cell, the toolbar's Interrupt: the cell ends within a bound with the
   package's one-line message, and the next ``%%px`` cell prints on both ranks again;
4. Kernel > Restart Kernel...: within a bound no process the old kernel started (controller,
   ``mpiexec``, engines, nannies, the watchdog) is alive, checked by pid
   (:class:`tests.support.proctree.ProcessTree`, as the kill tests do);
5. a new cluster, then the notebook's tab is closed: the kernel is shut down (the project's
   ``kernelShutdown`` default), and the same pid check;
6. the sidebar's ``chexnet-mpi`` card: START, the card's "<>" button writes the connection
   code into a notebook, a cell runs on its engines (one MPI job of 2), STOP: every process
   of that cluster gone;
7. the browser closed: the kernel it left is culled (``make lab``: after an hour idle) and
   its processes are gone.

The kernel SIGKILLed and the Jupyter server killed under a kernel with a cluster are tested
without a browser (tests/mpi/test_killed_cleanly.py). Screenshots: ``learner-*.png`` in the
screenshot folder (``make browser-check``: ``build/browser/``). The module prints its wall
time.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import psutil
import pytest

from chexnet_utils.lab import MPI_PROFILE, PROJECT_KERNEL
from tests.notebooks.conftest import CULL_IDLE_S, CULL_INTERVAL_S
from tests.support.lab_server import PROJECT_KERNEL_DISPLAY, LabServer, notebook_title
from tests.support.proctree import ProcessTree, cmdline_of

pytestmark = pytest.mark.slow

LOAD_MS = 90_000          # JupyterLab's first load and a kernel start on a busy 2-core machine
RUN_ALL_S = 300           # notebook 00 (30 s under nbval on an idle machine)
CLUSTER_S = 120           # a 2-engine cluster up
INTERRUPTED_WITHIN_S = 20  # Interrupt -> the %%px cell has ended (the package waits <= 10 s)
GONE_WITHIN_S = 20        # restart / tab close / STOP -> every process of the cluster gone

CLUSTER_CELL = ("from chexnet_utils.cluster.distributed import MPICluster\n\n"
                "cluster = MPICluster(n=2).start()\n"
                "print(f\"2 engines up in {cluster.start_seconds:.1f} s; engine pids "
                "{cluster.engine_pids}\")\n"
                "cluster.view.activate()  # registers the %px / %%px magics for these engines")
# ipyparallel 9.2's blocking %%px waits for the engines' output only while its progress
# timer (2 s) runs: a result that arrives just before it ends leaves no time for the output
# that is still on its way (client/magics.py, `result.wait(timeout=progress_after)` then
# `wait_for_output(remaining)`; seen on a loaded machine: rank 1's line shown, rank 0's not).
# So the cell flushes its line first and keeps running 3 s: the output streams in while the
# cell is still running, as it does in every real %%px cell that trains.
# And it waits 1 s before it prints: output that reaches the kernel before `%%px` has
# registered its streaming callbacks is replayed by AsyncResult.stream_output() as messages
# without a parent header, so every engine's replay gets the one display id "-stdout" and the
# second replaces the first (client/asyncresult.py, `display_id =
# f"{parent_msg_id}-{stream_name}"`; seen in CI: only "[stdout:1]" on the page).
HELLO_CELL = ("%%px\nimport os\nimport time\n\n"
              "from chexnet_utils.cluster.distributed import mpi_rank\n\n"
              "time.sleep(1)\n"
              "print(f\"rank {mpi_rank()} says hello from pid {os.getpid()}\", flush=True)\n"
              "time.sleep(3)")
LONG_CELL = ("%%px\nimport time\n\ntime.sleep(1)\n"
             "print(f\"rank {mpi_rank()} at work\", flush=True)\n"
             "for step in range(600):\n    time.sleep(1)")
AGAIN_CELL = ("%%px\ntime.sleep(1)\nprint(f\"rank {mpi_rank()} is back\", flush=True)\n"
              "time.sleep(3)")  # the same two races as HELLO_CELL's
SIDEBAR_CHECK_CELL = ("from mpi4py import MPI\n\n"
                      "rc.wait_for_engines(2, timeout=120)  # 'running': the controller; "
                      "engines follow\n"
                      "world = rc[:].apply_sync(lambda: (MPI.COMM_WORLD.rank, "
                      "MPI.COMM_WORLD.size))\n"
                      "print(\"ranks and world size per engine:\", sorted(world))")


def notebook_json(*sources: str) -> str:
    cells = [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
              "source": s} for s in sources]
    return json.dumps({"cells": cells, "nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"name": PROJECT_KERNEL, "display_name": PROJECT_KERNEL_DISPLAY,
                       "language": "python"}}})


# --- what a learner sees and does -----------------------------------------------------------

def open_notebook(browser, lab: LabServer, path: str, workspace: str):  # noqa: ANN001, ANN201
    """A new browser tab on ``path`` (its own workspace), once its kernel is idle."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(LOAD_MS)
    page.goto(lab.url(f"/lab/workspaces/{workspace}/tree/{quote(path)}"))
    expect(page.locator(".jp-NotebookPanel-toolbar .jp-KernelName")).to_have_text(
        PROJECT_KERNEL_DISPLAY, timeout=LOAD_MS)
    wait_until(lambda: session_kernel(lab, path, states=("idle",)), LOAD_MS / 1000,
               f"the kernel of {path} idle", lab)
    return context, page


def wait_until(predicate, timeout: float, what: str, lab: LabServer | None = None):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:.0f} s"
                        + (f"\n{lab.log_tail()}" if lab is not None else ""))
        time.sleep(0.2)


def session_kernel(lab: LabServer, path: str, states=("idle", "busy")) -> dict | None:  # noqa: ANN001
    for session in lab.request("/api/sessions"):
        if session["path"] == path and session["kernel"]["execution_state"] in states:
            return session["kernel"]
    return None


def kernel_pid(lab: LabServer, kernel_id: str) -> int:
    """The pid of the kernel process (its command line names its connection file)."""
    assert lab.process is not None
    for p in psutil.Process(lab.process.pid).children(recursive=True):
        if f"kernel-{kernel_id}.json" in cmdline_of(p):
            return p.pid
    raise AssertionError(f"no process for kernel {kernel_id}")


def prompts(page) -> list[str]:  # noqa: ANN001
    """The execution prompts of the code cells (``[3]:``, ``[*]:``, ``[ ]:``); a cell that
    JupyterLab has not rendered (windowing: out of view in a long notebook) shows ``""``."""
    return [t.strip() for t in page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()]


def prompt(page, index: int) -> str:  # noqa: ANN001
    """Code cell ``index``'s prompt, scrolled into view (so that it is rendered)."""
    cell = page.locator(".jp-CodeCell").nth(index)
    cell.scroll_into_view_if_needed()
    return cell.locator(".jp-InputPrompt").inner_text().strip()


def run_cell(page, index: int, timeout: float, *, wait: bool = True) -> None:  # noqa: ANN001
    """Select code cell ``index`` (click its prompt) and press Shift+Enter; with ``wait``,
    until its prompt shows a new execution number."""
    before = prompts(page)[index]
    page.locator(".jp-CodeCell .jp-InputPrompt").nth(index).click()
    page.keyboard.press("Shift+Enter")
    if wait:
        # "[*]:" while it runs (after a restart the new number may equal the old one); a
        # cell quicker than the polling goes from `before` to its number unseen
        deadline = time.monotonic() + 5
        while prompts(page)[index] == before and time.monotonic() < deadline:
            time.sleep(0.05)
        wait_until(lambda: re.fullmatch(r"\[\d+\]:", prompts(page)[index]), timeout,
                   f"end of cell {index}")


def output_text(page, index: int) -> str:  # noqa: ANN001
    return page.locator(".jp-CodeCell").nth(index).locator(".jp-OutputArea").inner_text()


def errors_in_page(page, scroll: bool = False) -> list[str]:  # noqa: ANN001
    """Outputs that are errors: a Python traceback in a rendered output; with ``scroll``,
    every code cell is scrolled into view first (rendered) and read."""
    if not scroll:
        texts = page.locator(".jp-OutputArea-output").all_inner_texts()
    else:
        texts = []
        cells = page.locator(".jp-CodeCell")
        for i in range(cells.count()):
            cells.nth(i).scroll_into_view_if_needed()
            texts += cells.nth(i).locator(".jp-OutputArea-output").all_inner_texts()
    return [t[:400] for t in texts if "Traceback (most recent call last)" in t]


def menu(page, bar: str, command: str) -> None:  # noqa: ANN001
    """Click menu ``bar`` (``Run``, ``Kernel``) and its item for ``command``."""
    page.locator(".lm-MenuBar-item", has_text=bar).first.click()
    page.locator(f'.lm-Menu-item[data-command="{command}"]').click()


def shoot(page, shots: Path, name: str) -> None:  # noqa: ANN001
    try:
        page.screenshot(path=str(shots / f"learner-{name}.png"))
    except Exception as e:  # a missing screenshot must not hide the real failure
        print(f"screenshot {name} failed: {e}")


# --- the session ----------------------------------------------------------------------------

@dataclass
class Session:
    """State that the steps hand on (each step needs the one before)."""

    lab: LabServer
    browser: object
    shots: Path
    contexts: list = field(default_factory=list)
    page: object = None
    kernel_id: str | None = None
    cluster_up: bool = False
    sidebar_page: object = None
    sidebar_kernel_id: str | None = None

    def need(self, attr: str, step: str) -> object:
        value = getattr(self, attr)
        if not value:
            pytest.skip(f"needs {step}, which failed")
        return value


@pytest.fixture(scope="module")
def session(lab: LabServer, browser, shots: Path) -> Iterator[Session]:  # noqa: ANN001
    t0 = time.monotonic()
    state = Session(lab, browser, shots)
    try:
        yield state
    finally:
        for context in state.contexts:
            try:
                context.close()
            except Exception:
                pass
        lab.shut_down_sessions(lambda path: path.startswith(("scratch/", "00_")))
        print(f"\nlearner session: {time.monotonic() - t0:.1f} s wall time")


def test_run_all_cells_of_notebook_00_shows_outputs_and_no_error(session: Session):
    lab, path = session.lab, "00_environment_check.ipynb"
    context, page = open_notebook(session.browser, lab, path, "learner00")
    session.contexts.append(context)
    try:
        # what test_browser.py checks of the other notebooks: title, kernel (open_notebook),
        # the sidebar
        heading = page.locator(".jp-NotebookPanel .jp-RenderedMarkdown h1").first
        assert (heading.inner_text().strip().rstrip("¶").strip()
                == notebook_title(lab.root_dir / path))
        assert page.locator('.jp-SideBar .lm-TabBar-tab[title="IPython Parallel"]').count() == 1
        # the committed notebook says how many code cells there are; JupyterLab attaches them
        # to the page in idle time after opening (windowing "defer"), so wait for them all
        n_code = sum(c["cell_type"] == "code"
                     for c in json.loads((lab.root_dir / path).read_text())["cells"])
        wait_until(lambda: len(prompts(page)) == n_code, 30,
                   f"the {n_code} code cells of notebook 00 on the page", lab)
        t0 = time.monotonic()
        menu(page, "Run", "runmenu:run-all")
        # the cells run in order, and Run All stops at an error: the last one tells
        wait_until(lambda: re.fullmatch(r"\[\d+\]:", prompt(page, n_code - 1))
                   or (not session_kernel(lab, path, ("busy",)) and errors_in_page(page)),
                   RUN_ALL_S, "end of the last cell of notebook 00", lab)
        took = time.monotonic() - t0
        assert not errors_in_page(page, scroll=True), errors_in_page(page, scroll=True)
        table = page.locator(".jp-OutputArea-output table").first
        table.scroll_into_view_if_needed()
        shoot(page, session.shots, "00-run-all-table")
        assert page.locator(".jp-OutputArea-output table").count() >= 2, "tables among the outputs"
        page.locator(".jp-CodeCell").last.scroll_into_view_if_needed()
        shoot(page, session.shots, "00-run-all-end")
        # the saved notebook: every code cell ran, none has an error output
        page.locator('.jp-NotebookPanel-toolbar [data-command="docmanager:save"]').click()
        saved = lab.root_dir / path
        wait_until(lambda: all(c.get("execution_count") for c in json.loads(
            saved.read_text())["cells"] if c["cell_type"] == "code"), 30, "the saved notebook")
        cells = [c for c in json.loads(saved.read_text())["cells"] if c["cell_type"] == "code"]
        assert len(cells) == n_code
        assert not [o for c in cells for o in c["outputs"] if o["output_type"] == "error"]
        print(f"notebook 00, Run All Cells: {n_code} code cells in {took:.1f} s")
    finally:
        context.close()
        session.contexts.remove(context)
        lab.shut_down_sessions(lambda p: p == path)


def test_px_cell_shows_both_ranks(session: Session):
    lab = session.lab
    (lab.root_dir / "scratch" / "engines.ipynb").write_text(
        notebook_json(CLUSTER_CELL, HELLO_CELL, LONG_CELL, AGAIN_CELL))
    context, page = open_notebook(session.browser, lab, "scratch/engines.ipynb", "engines")
    session.contexts.append(context)
    session.page = page
    session.kernel_id = session_kernel(lab, "scratch/engines.ipynb")["id"]
    run_cell(page, 0, CLUSTER_S)
    assert "2 engines up in" in output_text(page, 0), output_text(page, 0)
    session.cluster_up = True
    run_cell(page, 1, 60)
    out = output_text(page, 1)
    shoot(page, session.shots, "px-both-ranks")
    assert re.search(r"\[stdout:0\]\s*rank 0 says hello", out), out
    assert re.search(r"\[stdout:1\]\s*rank 1 says hello", out), out
    assert not errors_in_page(page)


def test_interrupt_ends_the_cell_and_the_engines_run_the_next(session: Session):
    page = session.need("page", "test_px_cell_shows_both_ranks")
    session.need("cluster_up", "the cluster of test_px_cell_shows_both_ranks")
    run_cell(page, 2, 0, wait=False)
    wait_until(lambda: "rank 0 at work" in output_text(page, 2)
               and "rank 1 at work" in output_text(page, 2), 60, "both ranks at work")
    t0 = time.monotonic()
    page.locator('.jp-NotebookPanel-toolbar [data-command="notebook:interrupt-kernel"]').click()
    wait_until(lambda: re.fullmatch(r"\[\d+\]:", prompts(page)[2]), INTERRUPTED_WITHIN_S,
               "end of the interrupted cell")
    took = time.monotonic() - t0
    out = output_text(page, 2)
    shoot(page, session.shots, "interrupt")
    assert "[MPICluster] interrupted: engine(s) 0, 1 stopped their task" in out, out
    assert "ready for the next cell" in out
    run_cell(page, 3, 60)
    again = output_text(page, 3)
    assert re.search(r"\[stdout:0\]\s*rank 0 is back", again), again
    assert re.search(r"\[stdout:1\]\s*rank 1 is back", again), again
    print(f"Interrupt -> %%px cell ended after {took:.1f} s; the engines ran the next cell")


def restarted_or_closed(session: Session, action, what: str) -> None:  # noqa: ANN001
    """Record the kernel's process tree, do ``action``, check it is all gone in time."""
    kernel = kernel_pid(session.lab, session.kernel_id)
    tree = ProcessTree(kernel)
    assert len(tree) >= 6, f"controller, mpiexec, 2 engines, 2 nannies expected: {len(tree)}"
    t0 = time.monotonic()
    action()
    tree.procs.setdefault(kernel, psutil.Process(kernel))
    tree.assert_gone_by(t0 + GONE_WITHIN_S, f"{GONE_WITHIN_S} s after {what}")
    print(f"{what}: {len(tree)} processes of the kernel gone after {time.monotonic() - t0:.1f} s")


def test_kernel_restart_leaves_no_process_of_the_old_kernel(session: Session):
    from playwright.sync_api import expect

    page = session.need("page", "test_px_cell_shows_both_ranks")
    session.need("cluster_up", "the cluster of test_px_cell_shows_both_ranks")
    old = session.kernel_id

    def restart() -> None:
        menu(page, "Kernel", "kernelmenu:restart")
        page.locator(".jp-Dialog .jp-mod-accept", has_text="Restart").click()
        expect(page.locator(".jp-Dialog")).to_have_count(0)

    restarted_or_closed(session, restart, "Kernel > Restart Kernel")
    session.cluster_up = False
    new = wait_until(lambda: session_kernel(session.lab, "scratch/engines.ipynb", ("idle",)),
                     60, "the restarted kernel idle")
    assert new["id"] == old  # a restart keeps the kernel's id, in a new process
    shoot(page, session.shots, "restart")


def test_closing_the_notebook_shuts_its_kernel_and_cluster_down(session: Session):
    from playwright.sync_api import expect

    page = session.need("page", "test_px_cell_shows_both_ranks")
    run_cell(page, 0, CLUSTER_S)  # the learner starts the cluster again after the restart
    assert "2 engines up in" in output_text(page, 0)

    def close_tab() -> None:
        tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="engines.ipynb")
        tab.locator(".lm-TabBar-tabCloseIcon").click()
        # the kernel added its language_info: JupyterLab asks whether to save
        page.locator(".jp-Dialog button", has_text="Save").click()
        expect(page.locator(".jp-NotebookPanel")).to_have_count(0)

    restarted_or_closed(session, close_tab, "closing the notebook's tab")
    wait_until(lambda: not session_kernel(session.lab, "scratch/engines.ipynb",
                                          ("idle", "busy", "starting")), 10, "no session left")
    shoot(page, session.shots, "tab-closed")


def sidebar_card(page):  # noqa: ANN001, ANN201
    return page.locator(".ipp-ClusterListingItem", has_text=f"{MPI_PROFILE}:")


def test_sidebar_cluster_start_connect_run_stop(session: Session):
    lab = session.lab
    (lab.root_dir / "scratch" / "sidebar.ipynb").write_text(notebook_json(SIDEBAR_CHECK_CELL))
    context, page = open_notebook(session.browser, lab, "scratch/sidebar.ipynb", "sidebar")
    session.contexts.append(context)
    session.sidebar_kernel_id = session_kernel(lab, "scratch/sidebar.ipynb")["id"]
    page.locator('.jp-SideBar .lm-TabBar-tab[title="IPython Parallel"]').click()
    card = sidebar_card(page)
    assert "Number of engines: 2" in card.inner_text()
    server = psutil.Process(lab.process.pid)
    before = {p.pid for p in server.children(recursive=True)}
    t0 = time.monotonic()
    card.locator(".ipp-ClusterListingItem-start").click()
    wait_until(lambda: "state: running" in sidebar_card(page).inner_text().lower(), CLUSTER_S,
               "the sidebar's cluster running", lab)
    started = time.monotonic() - t0
    page.locator(".jp-CodeCell .jp-InputPrompt").first.click()  # the notebook is active
    sidebar_card(page).locator(".ipp-ClusterListingItem-code").click()  # "<>": connect code
    wait_until(lambda: len(prompts(page)) == 2, 10, "the injected connection cell")
    code = page.locator(".jp-CodeCell .jp-InputArea-editor").first.inner_text()
    assert "ipp.Cluster.from_file(" in code and f"profile_{MPI_PROFILE}" in code, code
    run_cell(page, 0, 60)
    run_cell(page, 1, CLUSTER_S)
    out = output_text(page, 1)
    shoot(page, session.shots, "sidebar-running")
    assert "ranks and world size per engine: [(0, 2), (1, 2)]" in out, out  # one MPI job of 2
    kernels = {kernel_pid(lab, session.sidebar_kernel_id)}
    cluster = {p for p in server.children(recursive=True) if p.pid not in before
               and not kernels & {p.pid, p.ppid()}}
    names = " ".join(cmdline_of(p) for p in cluster)
    assert "mpiexec" in names and "ipyparallel.controller" in names, names
    t1 = time.monotonic()
    sidebar_card(page).locator(".ipp-ClusterListingItem-stop").click()
    wait_until(lambda: "state: stopped" in sidebar_card(page).inner_text().lower(),
               GONE_WITHIN_S, "the sidebar's cluster stopped", lab)
    left = [p for p in psutil.wait_procs(list(cluster), timeout=GONE_WITHIN_S)[1]]
    shoot(page, session.shots, "sidebar-stopped")
    assert not left, f"alive after STOP: {[cmdline_of(p)[:100] for p in left]}"
    session.sidebar_page = page
    print(f"sidebar: {len(cluster)} processes, running after {started:.1f} s, "
          f"gone {time.monotonic() - t1:.1f} s after STOP")


def test_a_closed_browser_s_kernel_is_shut_down(session: Session):
    page = session.need("sidebar_page", "test_sidebar_cluster_start_connect_run_stop")
    lab = session.lab
    kernel = psutil.Process(kernel_pid(lab, session.sidebar_kernel_id))
    tree = ProcessTree(kernel.pid)
    tree.procs[kernel.pid] = kernel
    context = page.context
    t0 = time.monotonic()
    context.close()  # the learner closes the browser: no tab is connected to the kernel
    session.contexts.remove(context)
    within = CULL_IDLE_S + CULL_INTERVAL_S + GONE_WITHIN_S
    tree.assert_gone_by(t0 + within, f"{within} s after the browser closed")
    print(f"closed browser: its kernel culled and gone after {time.monotonic() - t0:.1f} s "
          f"(culling after {CULL_IDLE_S} s idle here, {3600} s in make lab)")
