"""``make gpu-smoke``: prove a GPU node in minutes; ``make gpu-smoke CPU=1``: its CPU stand-in.

On a GPU node it runs, with the defaults a learner gets (mixed precision, XLA where it can
compile, batches prefetched to the GPU: :mod:`chexnet_utils.model.accelerator`):

1. **notebook 03 up to section 4**, in a fresh kernel, for one epoch: the model, the loss,
   the written-out ``train_step`` with ``scale_loss``, ``fit``, the comparison with the
   package's ``training.train`` bit for bit under the same switches, and section 3.6's
   mixed-precision check; every line a checked cell prints must say ``True``;
2. ``scripts/train_horovod_minimal.py`` under ``horovodrun -np <GPUs>`` for one epoch: the
   ranks' weights must be identical;
3. ``bench gpu-node``, quick: images/s on 1 GPU and on all of them.

It prints one table (the GPUs, driver, CUDA, cuDNN and NCCL versions, the switches, each
step's verdict and time, images/s per GPU count) and exits 1 on any failure. Without a GPU it
prints one line and exits 2. With ``--cpu`` it runs the same steps on this machine's CPU with
the three switches forced on (``CHEXNET_MIXED_PRECISION``, ``CHEXNET_XLA``,
``CHEXNET_DEVICE_FEED`` = ``on``: float16 and XLA run on a CPU, the device feed prefetches to
``/cpu:0``) and 2 workers: the code path a GPU node runs, executed in ``make test``. Under
Horovod XLA then stays off on purpose (it cannot compile Horovod's allreduce on a CPU), and
the table says so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chexnet_utils import config
from chexnet_utils.notebook.cells import cells_before
from chexnet_utils.platform.lazy import lazy_module

# Horovod, nbformat, TensorFlow: imported on first use (chexnet_utils.platform.lazy)
hvd = lazy_module("horovod.tensorflow")
nbformat = lazy_module("nbformat")
tf = lazy_module("tensorflow")

NOTEBOOK = "03_training_single_worker.ipynb"
UP_TO = "## 4."
"""The notebook runs up to the markdown cell that starts section 4 (AUROC on the test split)."""
CPU_SWITCHES = {"CHEXNET_MIXED_PRECISION": "on", "CHEXNET_XLA": "on", "CHEXNET_DEVICE_FEED": "on"}
CPU_WORKERS = 2
CHECKED = "NBVAL_CHECK_OUTPUT"
_VERDICT = re.compile(r"\b(True|False)\s*$")


@dataclass
class SmokeStep:
    """One step of the smoke run: its name, verdict, seconds and a one-line detail."""

    name: str
    ok: bool
    seconds: float
    detail: str


@dataclass
class SmokeReport:
    """What ``make gpu-smoke`` found: the node, each step, images/s per worker count."""

    node: dict[str, str]
    cpu_standin: bool
    steps: list[SmokeStep] = field(default_factory=list)
    img_per_s: dict[int, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every step passed."""
        return bool(self.steps) and all(s.ok for s in self.steps)

    def __str__(self) -> str:
        from chexnet_utils.platform.markdown import markdown_table

        kind = "CPU stand-in (switches forced on)" if self.cpu_standin else "GPU node"
        lines = [f"gpu-smoke, {kind}"]
        lines += [f"  {k}: {v}" for k, v in self.node.items()]
        lines.append(markdown_table([{"step": s.name, "ok": "yes" if s.ok else "FAILED",
                                      "seconds": f"{s.seconds:.0f}", "detail": s.detail}
                                     for s in self.steps]))
        if self.img_per_s:
            unit = "CPU workers" if self.cpu_standin else "GPUs"
            lines.append(markdown_table([{unit: k, "images/s": f"{v:.1f}"}
                                         for k, v in self.img_per_s.items()]))
        lines.append("gpu-smoke: " + ("passed" if self.ok else "FAILED"))
        return "\n".join(lines)


def node_description(gpus: Sequence[Any]) -> dict[str, str]:
    """The GPUs and the versions that matter on a GPU node (``"-"`` where there is none).
    Without GPUs (the CPU stand-in) the package versions only: TensorFlow is not imported."""
    from chexnet_utils.hardware import devices
    from chexnet_utils.hardware.envcheck import package_versions

    names = ", ".join(sorted({g.name for g in gpus})) + f" x{len(gpus)}" if gpus else "-"
    v = package_versions(("tensorflow", "tensorflow-cpu", "horovod"))
    versions = f"{v['tensorflow'] or v['tensorflow-cpu'] or '-'} / {v['horovod'] or '-'}"
    desc = {"GPUs": names, "driver": "-", "CUDA / cuDNN (TensorFlow build)": "- / -",
            "NCCL (Horovod)": "-", "TensorFlow / Horovod": versions}
    if gpus:
        build = tf.sysconfig.get_build_info()
        driver = devices.run_nvidia_smi(["--query-gpu=driver_version", "--format=csv,noheader"])
        desc.update({"driver": driver.splitlines()[0].strip() if driver else "-",
                     "CUDA / cuDNN (TensorFlow build)": f"{build.get('cuda_version', '-')} / "
                                                        f"{build.get('cudnn_version', '-')}",
                     "NCCL (Horovod)": nccl_version(hvd.nccl_built())})
    return desc


def nccl_version(code: int) -> str:
    """``NCCL_VERSION_CODE`` as ``X.Y.Z``: ``X*10000+Y*100+Z`` from NCCL 2.9, ``X*1000+Y*100+Z``
    up to 2.8 (``nccl.h``); ``-`` for 0 (Horovod built without NCCL)."""
    if not code:
        return "-"
    if code < 10000:
        return f"{code // 1000}.{code // 100 % 10}.{code % 100}"
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


def checked_verdicts(nb: Mapping[str, Any]) -> list[str]:
    """Every line a checked cell printed that ends in True or False (``NBVAL_CHECK_OUTPUT``)."""
    lines = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code" or CHECKED not in "".join(cell["source"]):
            continue
        for out in cell.get("outputs", []):
            text = out.get("text", "")
            lines += [ln for ln in ("".join(text) if isinstance(text, list) else text).splitlines()
                      if _VERDICT.search(ln)]
    return lines


def run_notebook_section(notebooks: Path, epochs: int = 1, timeout: int = 1800) -> SmokeStep:
    """Notebook 03 up to section 4 in a fresh kernel (``CHEXNET_EPOCHS=epochs``); passes when no
    cell failed and every checked verdict is True. The switches come from the environment."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.reads(json.dumps(cells_before(notebooks / NOTEBOOK, UP_TO)), as_version=4)
    os.environ["CHEXNET_EPOCHS"] = str(epochs)
    t0 = time.perf_counter()
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(notebooks)}}).execute()
    except CellExecutionError as e:
        last = str(e).strip().splitlines()[-1] if str(e).strip() else repr(e)
        return SmokeStep("notebook 03 to section 4", False, time.perf_counter() - t0, last)
    verdicts = checked_verdicts(nb)
    false = [v for v in verdicts if v.rstrip().endswith("False")]
    printed = "".join("".join(o.get("text", "")) for c in nb.cells for o in c.get("outputs", []))
    detail = (f"{len(verdicts)} checks True; {switch_words(printed)}" if not false and verdicts
              else "; ".join(false) or "no checked line found")
    return SmokeStep("notebook 03 to section 4", not false and bool(verdicts),
                     time.perf_counter() - t0, detail)


def run_minimal_script(n: int, out: Path, timeout: int = 1800) -> SmokeStep:
    """``scripts/train_horovod_minimal.py --epochs 1`` under ``horovodrun -np n``; passes when
    rank 0 reports identical ranks."""
    from chexnet_utils.cluster.distributed import mpi_environment

    script = config.repo_root() / "scripts" / "train_horovod_minimal.py"
    horovodrun = str(Path(sys.executable).parent / "horovodrun")
    cmd = [horovodrun, "-np", str(n), "-H", f"localhost:{n}", sys.executable, str(script),
           "--epochs", "1", "--out", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=mpi_environment(n), capture_output=True, text=True,
                          timeout=timeout, check=False)
    seconds = time.perf_counter() - t0
    ok = proc.returncode == 0 and "ranks identical: True" in proc.stdout
    if proc.returncode == 0:
        detail = (f"ranks identical: {ok}; " + switch_words(proc.stdout))
    else:
        errors = [ln for ln in proc.stderr.splitlines() if "Error" in ln] or ["no error line"]
        detail = f"exit {proc.returncode}: {errors[-1].split('>:', 1)[-1].strip()}"
    return SmokeStep(f"minimal script, horovodrun -np {n}", ok, seconds, detail)


def switch_words(text: str) -> str:
    """``mixed precision on, XLA off, device feed on`` from the first switches line
    (:func:`chexnet_utils.model.accelerator.describe`) in ``text``."""
    found = re.findall(r"(mixed precision|XLA|device feed) (on|off) \(", text)
    return ", ".join(f"{name} {value}" for name, value in found[:3]) or "switches not printed"


def run_gpu_node_bench(tfrecords: Path, counts: Sequence[int], cpu: bool
                       ) -> tuple[SmokeStep, dict[int, float]]:
    """``bench gpu-node`` quick over ``counts`` workers (CPU stand-in: ``small`` at 64 px on CPU
    engines named as GPUs, no topology binding); the step and images/s per count."""
    from chexnet_utils.bench.gpu_node import bench_gpu_node

    quick: dict[str, Any] = (
        {"arch": "small", "image_size": 64, "batch_size": 16, "steps": 3, "warmup_steps": 1,
         "visible": [f"CPU stand-in {i}" for i in range(max(counts))], "topology": ""}
        if cpu else {"steps": 10, "warmup_steps": 5})
    t0 = time.perf_counter()
    try:
        result = bench_gpu_node(tfrecords, sorted(set(counts)), **quick)
    except Exception as e:  # the step fails, the report goes on
        return SmokeStep("bench gpu-node, quick", False, time.perf_counter() - t0,
                         f"{type(e).__name__}: {e}"), {}
    rates = {k: float(v) for k, v in result.img_per_s.items()}
    first = result.runs[result.gpus[0]]
    detail = f"{result.arch} at {result.image_size} px; " + ", ".join(
        f"{label} {'on' if first.get(key) else 'off'}" for key, label in
        (("mixed_precision", "mixed precision"), ("xla", "XLA"), ("device_feed", "device feed")))
    ok = all(r > 0 for r in rates.values())
    return SmokeStep("bench gpu-node, quick", ok, time.perf_counter() - t0, detail), rates


def gpu_smoke(cpu: bool = False, out: Path | None = None,
              log: Callable[[str], None] = print) -> SmokeReport:
    """The three steps (module docstring) on this node's GPUs, or with ``cpu`` on its CPU with
    the GPU switches forced on; raises :class:`~chexnet_utils.bench.gpu_node.NoGPUError`
    without a GPU unless ``cpu``."""
    from chexnet_utils.bench.gpu_node import NoGPUError, no_gpu_reason
    from chexnet_utils.data.prepare import prepare_tfrecords
    from chexnet_utils.hardware import devices

    gpus = devices.visible_gpus()
    if not gpus and not cpu:
        raise NoGPUError(f"no NVIDIA GPU visible here ({no_gpu_reason()})")
    if cpu:
        os.environ.update(CPU_SWITCHES)
    n = CPU_WORKERS if cpu else len(gpus)
    out = out or config.work_dir() / "gpu-smoke"
    report = SmokeReport(node_description(gpus), cpu)
    log(f"gpu-smoke: {'CPU stand-in' if cpu else f'{n} GPU(s)'}; output in {out}")
    report.steps.append(run_notebook_section(config.repo_root() / "notebooks"))
    log(f"  {report.steps[-1].name}: {report.steps[-1].detail}")
    report.steps.append(run_minimal_script(n, out / "minimal"))
    log(f"  {report.steps[-1].name}: {report.steps[-1].detail}")
    step, report.img_per_s = run_gpu_node_bench(
        prepare_tfrecords(config.scale().image_size, progress=False), [1, n], cpu)
    report.steps.append(step)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m chexnet_utils.notebook.gpu_smoke [--cpu]``: 0 passed, 1 failed, 2 no GPU."""
    from chexnet_utils.bench.gpu_node import NoGPUError

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--cpu", action="store_true",
                   help="the CPU stand-in: the same steps on this CPU, GPU switches forced on")
    p.add_argument("--out", type=Path, help="output folder (default: <work dir>/gpu-smoke)")
    args = p.parse_args(argv)
    try:
        report = gpu_smoke(cpu=args.cpu, out=args.out)
    except NoGPUError as e:
        print(f"gpu-smoke: {e}: nothing to prove; make gpu-smoke CPU=1 runs its CPU stand-in",
              file=sys.stderr)
        return 2
    print(report, flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
