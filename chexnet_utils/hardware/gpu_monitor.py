"""GPU utilisation over time, sampled with NVML while something runs.

The articles' symptom of a starved GPU: its memory is full, its utilisation jumps between
0 % and 90 %. :class:`UtilisationSampler` records it: a background thread asks NVML (the
NVIDIA Management Library, ``import pynvml`` from the ``nvidia-ml-py`` package) every
``interval`` seconds for each GPU's utilisation and memory in use, while the training runs in
the foreground (or in other processes: NVML sees every process on the GPU, so the sampler can
run in the notebook kernel while MPI engines train).

What NVML's utilisation means: the percentage of the driver's last sample period (between
1/6 s and 1 s, depending on the GPU) during which at least one kernel ran. It is not how
busy the cores were, but it is exactly the "is the GPU waiting?" signal: 0 % means no kernel
ran at all. Sampling faster than the driver's period repeats values.

Without a GPU (or without the driver's NVML library) :func:`nvml_status` says so in one
sentence that starts with :data:`NO_GPU`, and nothing is sampled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from chexnet_utils.hardware.devices import NvmlUnavailable, nvml_inventory

NO_GPU = "no NVIDIA GPU / NVML not available"
"""Start of :attr:`NvmlStatus.reason` when nothing can be sampled."""


@dataclass(frozen=True)
class Sample:
    """One reading of one GPU."""

    t: float
    """Seconds since the sampler started."""
    gpu: int
    """NVML index (the order of ``nvidia-smi``)."""
    util_percent: float
    mem_used_mib: float


@dataclass(frozen=True)
class NvmlStatus:
    """Whether NVML answers here: ``available``, the GPUs' names, or the reason it does not."""

    available: bool
    reason: str
    names: tuple[str, ...] = ()


def _load(nvml: Any | None) -> Any:
    if nvml is not None:
        return nvml
    import pynvml  # nvidia-ml-py

    return pynvml


def nvml_status(nvml: Any | None = None) -> NvmlStatus:
    """Can NVML be used here? ``nvml`` replaces the ``pynvml`` module (tests pass a fake)."""
    try:
        names = tuple(gpu.name for gpu in nvml_inventory(nvml))
    except NvmlUnavailable as e:
        return NvmlStatus(False, f"{NO_GPU}: {e}")
    if not names:
        return NvmlStatus(False, f"{NO_GPU}: the NVIDIA driver reports no GPU")
    return NvmlStatus(True, f"{len(names)} GPU(s): {', '.join(sorted(set(names)))}", names)


class UtilisationSampler:
    """Sample GPU utilisation in a background thread; use as a context manager::

        with UtilisationSampler(interval=0.1) as s:
            train_a_few_steps()
        s.samples          # [Sample(t, gpu, util_percent, mem_used_mib), ...]

    ``gpus`` are NVML indices (default: every GPU). Raises ``RuntimeError`` with the
    :func:`nvml_status` sentence when NVML is not available.
    """

    def __init__(self, interval: float = 0.1, gpus: Sequence[int] | None = None,
                 nvml: Any | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        self.interval = interval
        self.gpus = None if gpus is None else list(gpus)
        self._nvml = nvml
        self._clock = clock
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lib: Any = None
        self.t0 = 0.0
        """``clock()`` when sampling started (sample times are relative to it)."""

    def start(self) -> UtilisationSampler:
        """Initialise NVML, take a first sample, start the sampling thread."""
        status = nvml_status(self._nvml)
        if not status.available:
            raise RuntimeError(status.reason)
        self._lib = _load(self._nvml)
        self._lib.nvmlInit()
        indices = self.gpus if self.gpus is not None else range(self._lib.nvmlDeviceGetCount())
        self._handles = [(i, self._lib.nvmlDeviceGetHandleByIndex(i)) for i in indices]
        self.t0 = self._clock()
        self._stop.clear()
        self._sample()
        self._thread = threading.Thread(target=self._run, daemon=True, name="nvml-sampler")
        self._thread.start()
        return self

    def _sample(self) -> None:
        t = self._clock() - self.t0
        for i, handle in self._handles:
            util = self._lib.nvmlDeviceGetUtilizationRates(handle)
            mem = self._lib.nvmlDeviceGetMemoryInfo(handle)
            self.samples.append(Sample(t, i, float(util.gpu), float(mem.used) / 2**20))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def stop(self) -> list[Sample]:
        """Stop the thread (after one last sample) and NVML; returns the samples."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._sample()
            self._lib.nvmlShutdown()
        return self.samples

    def __enter__(self) -> UtilisationSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def summarise(samples: Sequence[Sample], idle_below: float = 10.0) -> dict[str, float]:
    """Mean utilisation, share of readings below ``idle_below`` % (the GPU waiting), the
    largest memory in use, and how many readings."""
    if not samples:
        raise ValueError("no samples")
    utils = [s.util_percent for s in samples]
    return {"mean_util_percent": sum(utils) / len(utils),
            "idle_share": sum(u < idle_below for u in utils) / len(utils),
            "max_mem_used_mib": max(s.mem_used_mib for s in samples),
            "n_samples": float(len(samples))}


def as_dicts(samples: Sequence[Sample]) -> list[dict[str, float]]:
    """JSON-friendly samples."""
    return [asdict(s) for s in samples]
