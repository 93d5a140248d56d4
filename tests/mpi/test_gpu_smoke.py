"""``make gpu-smoke CPU=1`` in ``make test`` (issue 45): what a GPU node runs, run on this CPU.

The stand-in runs notebook 03 up to section 4 (the lesson's ``train_step``, ``fit``, the
comparison with the package bit for bit, section 3.6), ``scripts/train_horovod_minimal.py``
under ``horovodrun -np 2`` and the gpu-node benchmark's step on 1 and 2 CPU engines, each with
mixed precision, XLA and the device feed forced on. The minimal script runs under
``horovodrun`` only here (float32, notebook 04 runs it on its engines with ``%run``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.mpi


def processes_with(marker: str) -> list[int]:
    """Pids of live processes whose environment holds ``marker`` (a path only this run uses)."""
    found = []
    for p in psutil.process_iter():
        try:
            if any(marker in v for v in p.environ().values()):
                found.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return found


def test_cpu_standin_passes_with_the_switches_forced_on(hvd_tfrecords: Path,
                                                         tmp_path: Path) -> None:
    work = tmp_path / "work"
    env = {**os.environ, "CHEXNET_DATA_DIR": str(hvd_tfrecords.parent / "data"),
           "CHEXNET_WORK_DIR": str(work), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "chexnet_utils.notebook.gpu_smoke", "--cpu"],
                          env=env, capture_output=True, text=True, timeout=900, check=False)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "gpu-smoke: passed" in out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines()
            if line.startswith("| ") and line.count("|") >= 5}
    notebook = rows["notebook 03 to section 4"]
    assert "checks True" in notebook and "mixed precision on, XLA on" in notebook, notebook
    minimal = rows["minimal script, horovodrun -np 2"]
    assert "ranks identical: True" in minimal, minimal
    assert "mixed precision on, XLA off, device feed on" in minimal, minimal  # XLA: on purpose
    assert "mixed precision on, XLA off, device feed on" in rows["bench gpu-node, quick"]
    assert (work / "gpu-smoke" / "minimal" / "last.keras").is_file()
    assert processes_with(str(work)) == [], "the smoke run left processes behind"
