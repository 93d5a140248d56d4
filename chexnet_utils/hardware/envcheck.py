"""What is installed and what Horovod was built with: the tutorial's environment check.

The source articles list their software stack side by side (TensorFlow, Horovod, Open MPI,
NCCL, cuDNN) because the right versions matter as much as the code. :func:`environment_report`
gathers the same facts for this machine; :func:`require_capabilities` turns missing pieces
into a loud error (``make setup`` ends with it).
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from chexnet_utils.hardware.devices import usable_cores
from chexnet_utils.platform.lazy import lazy_module

# Keras: imported on first use (chexnet_utils.platform.lazy)
keras = lazy_module("keras")

PACKAGES: tuple[str, ...] = (
    "tensorflow-cpu",
    "tensorflow",
    "keras",
    "horovod",
    "ipyparallel",
    "mpi4py",
    "jupyterlab",
    "matplotlib",
    "numpy",
    "nbval",
)
"""Distributions whose versions the report lists (``None`` when not installed)."""

CAPABILITIES: tuple[str, ...] = ("tensorflow", "horovod", "mpi", "gloo", "nccl", "cuda", "gpu")


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution, or ``None``."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def mpi_version() -> str | None:
    """First line of ``mpirun --version`` (e.g. ``mpirun (Open MPI) 4.1.4``), or ``None``."""
    exe = shutil.which("mpirun")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    return lines[0].strip() if lines else None


def horovod_capabilities() -> dict[str, bool | str | None]:
    """Which controllers and collectives the installed Horovod was built with.

    Keys: ``horovod`` (version or ``None``), ``mpi``, ``gloo``, ``nccl``, ``cuda``.
    Uses ``horovod.tensorflow``'s ``*_built()`` functions, which need no ``hvd.init()``.
    """
    caps: dict[str, bool | str | None] = {"horovod": None, "mpi": False, "gloo": False,
                                           "nccl": False, "cuda": False}
    try:
        hvd = importlib.import_module("horovod.tensorflow")
    except Exception as e:  # ImportError, or a broken build raising NotFoundError
        caps["error"] = f"{type(e).__name__}: {e}"
        return caps
    caps["horovod"] = getattr(importlib.import_module("horovod"), "__version__", None)
    caps["mpi"] = bool(hvd.mpi_built())
    caps["gloo"] = bool(hvd.gloo_built())
    caps["nccl"] = bool(hvd.nccl_built())
    caps["cuda"] = bool(hvd.cuda_built())
    return caps


def tensorflow_facts() -> dict[str, Any]:
    """TensorFlow version, Keras version, visible CPUs/GPUs, CUDA build flag."""
    try:
        import tensorflow as tf
    except Exception as e:
        return {"tensorflow": None, "error": f"{type(e).__name__}: {e}"}

    gpus = tf.config.list_physical_devices("GPU")
    return {
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "built_with_cuda": tf.test.is_built_with_cuda(),
        "gpus": [g.name for g in gpus],
        "cpus": [c.name for c in tf.config.list_physical_devices("CPU")],
    }


def environment_report() -> dict[str, Any]:
    """Everything the environment check notebook shows, as one flat-ish dict."""
    tf_facts = tensorflow_facts()
    hvd = horovod_capabilities()
    return {
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpu_cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "mpi": mpi_version(),
        "packages": package_versions(),
        "tensorflow": tf_facts,
        "horovod_build": hvd,
    }


def capability_status(report: Mapping[str, Any]) -> dict[str, bool]:
    """Reduce a report to ``{capability: present}`` for :data:`CAPABILITIES`."""
    tf_facts = report.get("tensorflow") or {}
    hvd = report.get("horovod_build") or {}
    return {
        "tensorflow": bool(tf_facts.get("tensorflow")),
        "horovod": bool(hvd.get("horovod")),
        "mpi": bool(hvd.get("mpi")) and bool(report.get("mpi")),
        "gloo": bool(hvd.get("gloo")),
        "nccl": bool(hvd.get("nccl")),
        # both halves of a GPU build: TensorFlow compiled with CUDA, Horovod with CUDA
        "cuda": bool(tf_facts.get("built_with_cuda")) and bool(hvd.get("cuda")),
        "gpu": bool(tf_facts.get("gpus")),
    }


def require_capabilities(report: Mapping[str, Any], required: Iterable[str]) -> None:
    """Raise ``RuntimeError`` listing every required capability that is missing."""
    wanted = [r.strip().lower() for r in required if r.strip()]
    unknown = [r for r in wanted if r not in CAPABILITIES]
    if unknown:
        raise ValueError(f"unknown capability {unknown}; choose from {list(CAPABILITIES)}")
    status = capability_status(report)
    missing = [r for r in wanted if not status[r]]
    if missing:
        hints = {
            "tensorflow": "pip install the pinned TensorFlow (make setup)",
            "horovod": "Horovod is not importable: rebuild it (make setup HOROVOD_REBUILD=1)",
            "mpi": "Horovod lacks MPI or mpirun is missing: install Open MPI "
                   "(apt-get install openmpi-bin libopenmpi-dev) and rebuild Horovod",
            "gloo": "Horovod was built without Gloo: rebuild with HOROVOD_WITH_GLOO=1 "
                    "(needs cmake)",
            "nccl": "Horovod was built without NCCL: on a GPU node run make setup GPU=1 "
                    "HOROVOD_GPU_OPERATIONS=NCCL",
            "cuda": "not a CUDA build (TensorFlow built with CUDA: "
                    f"{bool((report.get('tensorflow') or {}).get('built_with_cuda'))}, Horovod "
                    f"built with CUDA: {bool((report.get('horovod_build') or {}).get('cuda'))}): "
                    "make setup GPU=1",
            "gpu": "TensorFlow sees no GPU",
        }
        detail = "; ".join(f"{m}: {hints[m]}" for m in missing)
        error = (report.get("horovod_build") or {}).get("error")
        if error:
            detail += f" (import error: {error})"
        raise RuntimeError(f"environment check failed, missing {missing}. {detail}")


def versions_table(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(component, version)`` rows like the source articles' environment table."""
    pk = report.get("packages", {})
    tf_facts = report.get("tensorflow") or {}
    hvd = report.get("horovod_build") or {}
    def v(x: Any) -> str:
        return "not installed" if x in (None, "") else str(x)
    return [
        ("Python", v(report.get("python"))),
        ("TensorFlow", v(tf_facts.get("tensorflow"))),
        ("Keras", v(tf_facts.get("keras"))),
        ("Horovod", v(hvd.get("horovod"))),
        ("MPI", v(report.get("mpi"))),
        ("ipyparallel", v(pk.get("ipyparallel"))),
        ("mpi4py", v(pk.get("mpi4py"))),
        ("JupyterLab", v(pk.get("jupyterlab"))),
        ("matplotlib", v(pk.get("matplotlib"))),
        ("CUDA build of TF", v(tf_facts.get("built_with_cuda"))),
        ("GPUs visible", v(len(tf_facts.get("gpus", [])))),
        ("CPU cores", v(report.get("usable_cores"))),
    ]
