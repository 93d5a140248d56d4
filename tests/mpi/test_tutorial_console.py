"""``make tutorial``'s console (issue 49, item 4): one line per notebook, the kernels' own
output in ``<out>/tutorial.log``, a failing notebook's error and log shown in full.

Two small notebooks run through ``python -m chexnet_utils tutorial`` as ``make tutorial`` runs
it: the first writes a TensorFlow-like log line straight to the kernel's file descriptor 2
(where TensorFlow's C++ logging and the kernel's own warnings go, outside any cell's output),
the second fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CHATTER = "I0000 00:00:1.0 1 cpu_feature_guard.cc:227] oneDNN custom operations are on"


def notebook(path: Path, source: str) -> Path:
    path.write_text(json.dumps({
        "cells": [{"cell_type": "code", "id": "c1", "metadata": {}, "execution_count": None,
                   "outputs": [], "source": source}],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_the_console_shows_a_line_per_notebook_and_the_log_the_rest(tmp_path: Path):
    quiet = notebook(tmp_path / "91_chatty.ipynb",
                     f"import os\nos.write(2, {(CHATTER + chr(10)).encode()!r})\nprint('cell')")
    broken = notebook(tmp_path / "92_broken.ipynb", "raise ValueError('a broken cell')")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "chexnet_utils", "tutorial", "--out", str(out),
                           str(quiet), str(broken)],
                          capture_output=True, text=True, timeout=300)
    console = done.stdout + done.stderr
    assert done.returncode != 0  # a notebook failed
    lines = console.splitlines()
    assert any(ln.startswith("91_chatty.ipynb") and ln.endswith(" ok") for ln in lines)
    assert any(ln.startswith("92_broken.ipynb") and ln.endswith(" FAILED") for ln in lines)
    assert "ValueError: a broken cell" in console
    log = (out / "tutorial.log").read_text()
    assert CHATTER in log and f"library messages:            {out / 'tutorial.log'}" in console
    # the chatter is in the log, not on the console: neither the cell's fd-2 line nor the
    # kernel's TCP warning (it shows in the broken notebook's log, printed under its error)
    before_failure = console[:console.index("92_broken.ipynb")]
    assert CHATTER not in before_failure
    assert "without encryption" not in before_failure
