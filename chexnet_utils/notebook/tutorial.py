"""``make tutorial``: execute every notebook headless, export HTML, print the results.

Notebooks run in order in a fresh kernel each (the project's installed environment), the
executed copies and their HTML land in ``<out>/executed/``, the figures the notebooks save in
``<out>/figures/``, and the headline figures in ``<out>/results.json``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from chexnet_utils.notebook import results
from chexnet_utils.platform.atomic import atomic_path, write_text_atomic
from chexnet_utils.platform.processes import check_terminated, note_termination


@dataclass
class NotebookRun:
    """Outcome of one executed notebook."""

    notebook: Path
    executed: Path
    html: Path | None
    seconds: float
    error: str | None = None


def execute_notebook(path: Path, out_dir: Path, timeout: int = 3600) -> NotebookRun:
    """Run ``path`` top to bottom in a fresh kernel; write the executed copy and its HTML.

    A failing cell does not raise: the run's ``error`` says which cell failed and why, and
    the partly executed notebook is still written so the learner can look at it.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    from nbconvert import HTMLExporter

    out_dir.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})

    def keep_termination(**_: object) -> None:
        # nbclient answers SIGTERM by shutting the kernel down, then reports a failed cell
        # and forgets the signal; do the same shutdown but remember it, so the command stops.
        loop = asyncio.get_event_loop()

        def on_sigterm() -> None:
            note_termination(signal.SIGTERM)
            asyncio.ensure_future(client._async_cleanup_kernel())

        try:
            loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        except (NotImplementedError, RuntimeError):  # Windows; not the main thread
            pass

    client.on_notebook_start = keep_termination
    our_handler = signal.getsignal(signal.SIGTERM)
    t0 = time.perf_counter()
    error = None
    try:
        client.execute()
    except CellExecutionError as e:
        check_terminated()  # nbclient reports a SIGTERM as a failed cell
        error = str(e).strip().splitlines()[-1] if str(e).strip() else repr(e)
    except Exception:
        check_terminated()  # ... or fails while cleaning up after it
        raise
    finally:
        if our_handler is not None and signal.getsignal(signal.SIGTERM) != our_handler:
            signal.signal(signal.SIGTERM, our_handler)  # nbclient leaves SIG_DFL behind
    check_terminated()
    seconds = time.perf_counter() - t0
    executed = out_dir / path.name
    with atomic_path(executed) as tmp:
        nbformat.write(nb, tmp)
    html_path = out_dir / (path.stem + ".html")
    body, _ = HTMLExporter().from_notebook_node(nb)
    write_text_atomic(html_path, body)
    return NotebookRun(path, executed, html_path, seconds, error)


def run_tutorial(notebooks: Sequence[Path], out_dir: Path) -> list[NotebookRun]:
    """Execute ``notebooks`` in order, print progress and the results table; return the runs."""
    os.environ.setdefault("CHEXNET_WORK_DIR", str(out_dir.resolve()))
    executed_dir = out_dir / "executed"
    runs = []
    for nb in notebooks:
        print(f"running {nb} ...", flush=True)
        run = execute_notebook(Path(nb), executed_dir)
        status = "ok" if run.error is None else f"FAILED: {run.error}"
        print(f"  {run.seconds:7.1f} s  {status}", flush=True)
        runs.append(run)
    print()
    print(results.format_table(results.load()))
    print()
    print(f"executed notebooks and HTML: {executed_dir}")
    print(f"figures:                     {results.figures_dir()}")
    print(f"results:                     {results.results_path()}")
    return runs
