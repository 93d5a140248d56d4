"""``make tutorial``: execute every notebook headless, export HTML, print the results.

Notebooks run in order in a fresh kernel each (the project's installed environment), the
executed copies and their HTML land in ``<out>/executed/``, the figures the notebooks save in
``<out>/figures/``, and the headline figures in ``<out>/results.json``.

The console is what a newcomer reads first, so it stays quiet: one line per notebook (name,
seconds, ok), then the results table and where things are. What the kernels and the
processes they start write to their own stdout and stderr (TensorFlow's oneDNN and absl lines,
the kernel's "running over TCP without encryption" warning, the engines' start-up) goes to
``<out>/tutorial.log``, named at the end; a failing notebook's part of it is printed in full
under its error.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from chexnet_utils.notebook import results
from chexnet_utils.notebook.run_record import run_record, stamp
from chexnet_utils.platform.atomic import atomic_path, write_text_atomic
from chexnet_utils.platform.lazy import lazy_module
from chexnet_utils.platform.processes import check_terminated, note_termination

# nbformat: imported on first use (chexnet_utils.platform.lazy)
nbformat = lazy_module("nbformat")

LOG_NAME = "tutorial.log"
"""Where ``make tutorial`` puts what the kernels print outside the notebooks' cells."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class NotebookRun:
    """Outcome of one executed notebook."""

    notebook: Path
    executed: Path
    html: Path | None
    seconds: float
    error: str | None = None


def execute_notebook(path: Path, out_dir: Path, timeout: int = 3600,
                     log: IO[bytes] | None = None) -> NotebookRun:
    """Run ``path`` top to bottom in a fresh kernel; write the executed copy and its HTML.
    ``log``: a binary file that gets the kernel process's own stdout and stderr (and that of
    everything it starts); ``None``: this process's.

    A failing cell does not raise: the run's ``error`` says which cell failed and why, and
    the partly executed notebook is still written so the learner can look at it. The
    executed copy carries where it ran in its metadata (:mod:`~chexnet_utils.notebook.run_record`).
    """
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
        client.execute(**({"stdout": log, "stderr": log} if log is not None else {}))
    except CellExecutionError as e:
        check_terminated()  # nbclient reports a SIGTERM as a failed cell
        text = _ANSI.sub("", str(e)).strip()  # IPython colours its traceback
        error = text.splitlines()[-1] if text else repr(e)
    except Exception:
        check_terminated()  # ... or fails while cleaning up after it
        raise
    finally:
        if our_handler is not None and signal.getsignal(signal.SIGTERM) != our_handler:
            signal.signal(signal.SIGTERM, our_handler)  # nbclient leaves SIG_DFL behind
    check_terminated()
    seconds = time.perf_counter() - t0
    stamp(nb, run_record("make tutorial"))  # where its numbers come from, for make book
    executed = out_dir / path.name
    with atomic_path(executed) as tmp:
        nbformat.write(nb, tmp)
    html_path = out_dir / (path.stem + ".html")
    body, _ = HTMLExporter().from_notebook_node(nb)
    write_text_atomic(html_path, body)
    return NotebookRun(path, executed, html_path, seconds, error)


def run_tutorial(notebooks: Sequence[Path], out_dir: Path) -> list[NotebookRun]:
    """Execute ``notebooks`` in order, print a line each and the results table (library
    messages to ``<out>/tutorial.log``, :data:`LOG_NAME`); return the runs."""
    os.environ.setdefault("CHEXNET_WORK_DIR", str(out_dir.resolve()))
    executed_dir = out_dir / "executed"
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / LOG_NAME
    runs = []
    width = max((len(Path(nb).name) for nb in notebooks), default=0)
    with open(log_path, "wb") as log:
        for nb in notebooks:
            print(f"{Path(nb).name:<{width}}  ", end="", flush=True)
            log.write(f"===== {nb} =====\n".encode())
            log.flush()
            start = log.tell()
            run = execute_notebook(Path(nb), executed_dir, log=log)
            log.flush()
            print(f"{run.seconds:7.1f} s  " + ("ok" if run.error is None else "FAILED"),
                  flush=True)
            if run.error is not None:
                print(f"  error: {run.error}")
                print(f"  what its kernel printed ({log_path}):")
                print(_read_from(log_path, start), flush=True)
            runs.append(run)
    print()
    print(results.format_table(results.load()))
    print()
    print(f"executed notebooks and HTML: {executed_dir}")
    print(f"figures:                     {results.figures_dir()}")
    print(f"results:                     {results.results_path()}")
    print(f"library messages:            {log_path}")
    return runs


def _read_from(path: Path, offset: int) -> str:
    """The text of ``path`` from byte ``offset`` on, each line indented."""
    with open(path, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    return "\n".join(f"    {line}" for line in text.splitlines())
