"""*When* does the accelerator wait? Per-step timelines of waiting for data vs computing.

The timeline measurements of :mod:`chexnet_utils.bench.benchmark` (notebooks 02 and 03 reach them
as ``benchmark.X``; :func:`chexnet_utils.plots.timelines` draws them):

:func:`record_timeline`
    Per training step: when the batch was requested, when it was ready, when the step
    finished - the "waiting for data" vs "computing" bars of the articles' figures
    (:class:`Timeline`).
:func:`accel_wait_fraction`
    The share of an emulated accelerator's time (a sleep per step, no CPU used) spent
    waiting for the pipeline: the articles' idle GPU.

Not to be confused with :mod:`chexnet_utils.comm.timeline` (Horovod's own timeline of
collective operations).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from chexnet_utils.platform.timing import block, next_or_none

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["Timeline", "accel_wait_fraction", "record_timeline"]


# --------------------------------------------------------------------------------------------
# Timelines: when does the accelerator wait?
# --------------------------------------------------------------------------------------------

@dataclass
class Timeline:
    """Per training step: when its batch was requested, ready, and the step done.

    Times are seconds since the first recorded request. ``wait`` = ready - request (the
    accelerator idles, waiting for data); ``compute`` = done - ready (the step itself).
    """

    t_request: list[float] = field(default_factory=list)
    t_batch_ready: list[float] = field(default_factory=list)
    t_step_done: list[float] = field(default_factory=list)
    label: str = ""

    @property
    def wait_s(self) -> list[float]:
        return [r - q for q, r in zip(self.t_request, self.t_batch_ready, strict=True)]

    @property
    def compute_s(self) -> list[float]:
        return [d - r for r, d in zip(self.t_batch_ready, self.t_step_done, strict=True)]

    @property
    def total_s(self) -> float:
        return self.t_step_done[-1] if self.t_step_done else 0.0

    @property
    def step_s(self) -> float:
        """Mean wall time per step."""
        return self.total_s / len(self.t_step_done) if self.t_step_done else 0.0

    @property
    def wait_fraction(self) -> float:
        """Share of the wall time spent waiting for data."""
        return sum(self.wait_s) / self.total_s if self.total_s > 0 else 0.0

    def segments(self) -> dict[str, list[tuple[float, float]]]:
        """``{"wait": [(start, duration), ...], "compute": [...]}`` for matplotlib's
        ``broken_barh``."""
        return {"wait": [(q, r - q)
                         for q, r in zip(self.t_request, self.t_batch_ready, strict=True)],
                "compute": [(r, d - r)
                            for r, d in zip(self.t_batch_ready, self.t_step_done, strict=True)]}

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(wait_fraction=self.wait_fraction, step_s=self.step_s, total_s=self.total_s)
        return d


def record_timeline(dataset: tf.data.Dataset | Any, step_fn: Callable[[Any], Any],
                    n_steps: int, warmup: int = 1, label: str = "") -> Timeline:
    """Run ``n_steps`` of ``step_fn(batch)`` fed by ``dataset`` and record each step's
    (t_request, t_batch_ready, t_step_done).

    ``warmup`` steps run first, unrecorded (tracing). ``step_fn`` may return tensors: the
    recorder waits for them (fetches them to the host) before stamping "done", so a step is
    not counted as finished while the device still works on it. Any iterable works as
    ``dataset``.
    """
    it = iter(dataset)
    for _ in range(warmup):
        batch = next_or_none(it)
        if batch is None:
            raise ValueError("the dataset ran out during the warm-up; repeat it")
        block(step_fn(batch))
    tl = Timeline(label=label)
    t0 = time.perf_counter()
    for _ in range(n_steps):
        t_req = time.perf_counter()
        batch = next_or_none(it)
        if batch is None:
            break
        t_ready = time.perf_counter()
        block(step_fn(batch))
        t_done = time.perf_counter()
        tl.t_request.append(t_req - t0)
        tl.t_batch_ready.append(t_ready - t0)
        tl.t_step_done.append(t_done - t0)
    del it
    return tl


def accel_wait_fraction(dataset: tf.data.Dataset, accelerator_ms: float, n_steps: int = 20,
                        warmup: int = 2) -> float:
    """Share of an emulated accelerator's time spent waiting for data (the articles' idle
    GPU): each step "computes" by sleeping ``accelerator_ms`` (no CPU used, so the pipeline
    keeps every core, as on a GPU host), fed by ``dataset``; the result is
    :attr:`Timeline.wait_fraction` of :func:`record_timeline`."""
    if accelerator_ms <= 0:
        raise ValueError(f"accelerator_ms must be > 0, got {accelerator_ms}")

    def step(_batch: Any) -> None:
        time.sleep(accelerator_ms / 1000.0)

    return record_timeline(dataset, step, n_steps, warmup=warmup).wait_fraction

