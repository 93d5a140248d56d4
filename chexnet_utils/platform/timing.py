"""The stopwatch under every input-pipeline measurement: pull, wait, count, alternate.

:mod:`chexnet_utils.bench.throughput`, :mod:`chexnet_utils.bench.idle`,
:mod:`chexnet_utils.bench.timeline` and :mod:`chexnet_utils.input.tfdata_service` all time
the same few things: batches pulled from an iterator (counting images, not batches), training steps
whose result must be *waited for* before the clock stops (a step that returns tensors is not
finished until they are on the host), warm-up batches that are never timed, and runs of
several pipelines alternated A B, B A, ... so that drifting machine load hurts them alike.
This module holds the one implementation of each:

- :func:`batch_len` / :func:`block` / :func:`next_or_none`: images in a batch, wait for a
  result, the next batch or ``None``;
- :func:`warm_up` / :func:`timed_run`: untimed batches, then ``n`` timed ones (images, s);
  :func:`pipeline_run`: both on a fresh iterator, deleted afterwards;
- :func:`fed_run`: ``warmup`` untimed then ``n_steps`` timed training steps fed by a dataset;
- :func:`first_batch`: ``(x, y)`` of a dataset's first batch, the constant in-memory batch;
- :func:`barrier_windows`: the engines' clock: ``warmup_steps`` untimed steps, then windows
  of ``steps`` steps, each opened (and closed) by a barrier so that every worker times the
  same interval (:mod:`chexnet_utils.bench.engine_steps`, :mod:`chexnet_utils.bench.scaling`,
  :mod:`chexnet_utils.bench.gpu_node`, :mod:`chexnet_utils.comm.collectives`);
- :func:`alternating`: the run order A B, B A, A B ... of ``repeats`` rounds;
- :func:`mean_std`: mean and sample standard deviation of a list of rates; :class:`RunMean`,
  the mean of a result's per-run list as an attribute.

Nothing here imports TensorFlow: anything iterable with ``.shape`` / ``.numpy()`` works.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

__all__ = ["RunMean", "Window", "alternating", "barrier_windows", "batch_len", "block",
           "fed_run", "first_batch", "idle_fraction", "mean_std", "next_or_none",
           "pipeline_run", "ratio", "timed_run", "warm_up"]


def batch_len(batch: Any) -> int:
    """Images in one element: the leading dimension of its first component."""
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    if isinstance(first, Mapping):
        first = next(iter(first.values()))
    return int(first.shape[0])


def block(value: Any) -> None:
    """Wait until ``value`` is computed (fetch a scalar of it to the host)."""
    if value is None:
        return
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for v in value:
            block(v)
        return
    numpy = getattr(value, "numpy", None)
    if callable(numpy):
        numpy()


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation of ``values`` (0, 0 when empty; std 0 for one)."""
    if not values:
        return 0.0, 0.0
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def ratio(a: float, b: float) -> float:
    """``a / b`` of two measured rates or times, NaN when ``b`` is not positive (no run, or a
    rate of 0): a figure that cannot be computed reads as "not measured" (``null`` in JSON),
    never as 0 or an exception."""
    return a / b if b > 0 else math.nan


def idle_fraction(fed_img_per_s: float, model_img_per_s: float) -> float:
    """The share of a training step spent waiting for data: ``1 - fed / model`` (training
    fed by a pipeline against the model alone on one constant batch), clipped to [0, 1];
    NaN when the model's rate is not positive."""
    return min(1.0, max(0.0, 1.0 - ratio(fed_img_per_s, model_img_per_s))) \
        if model_img_per_s > 0 else math.nan


class RunMean:
    """A read-only attribute of a result class: the mean of one of its lists of per-run
    rates (0 for none). ``pipeline = RunMean("pipeline_img_per_s", "docstring")`` in the
    class body; a class attribute without annotation, so not a dataclass field."""

    def __init__(self, runs: str, doc: str = "") -> None:
        self.runs = runs
        self.__doc__ = doc

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return mean_std(getattr(obj, self.runs))[0]


def next_or_none(it: Iterator[Any]) -> Any:
    """``next(it)``, or ``None`` when the iterator is exhausted."""
    try:
        return next(it)
    except StopIteration:
        return None


def timed_run(it: Iterator[Any], n_batches: int,
              step: Callable[[Any], Any] | None = None) -> tuple[int, float]:
    """Pull up to ``n_batches`` from ``it``, each passed to ``step`` (if given) and its
    result waited for: (images, seconds)."""
    images = 0
    t0 = time.perf_counter()
    for _ in range(n_batches):
        batch = next_or_none(it)
        if batch is None:
            break
        if step is not None:
            block(step(batch))
        images += batch_len(batch)
    return images, time.perf_counter() - t0


def warm_up(it: Iterator[Any], warmup_batches: int) -> None:
    """Pull ``warmup_batches`` untimed batches from ``it`` (fewer if it runs out)."""
    for _ in range(warmup_batches):
        if next_or_none(it) is None:
            return


def pipeline_run(dataset: Iterable[Any], n_batches: int, warmup_batches: int
                 ) -> tuple[int, float]:
    """One run of a pipeline alone: a **fresh iterator**, ``warmup_batches`` untimed, the
    next ``n_batches`` timed, then the iterator deleted (a live one would keep prefetching
    in the background): (images, seconds)."""
    it = iter(dataset)
    warm_up(it, warmup_batches)
    images, seconds = timed_run(it, n_batches)
    del it
    return images, seconds


def alternating(names: Iterable[str], repeats: int) -> list[str]:
    """The run order of ``repeats`` rounds over ``names``: A B, B A, A B, ..."""
    order = list(names)
    return [name for r in range(repeats) for name in (order if r % 2 == 0 else order[::-1])]


def first_batch(dataset: Iterable[Any], what: str = "the dataset") -> tuple[Any, Any]:
    """``(x, y)`` of the first batch of ``dataset`` (its iterator is deleted at once, so no
    background prefetching outlives the call); ``ValueError`` if it is empty."""
    it = iter(dataset)
    first = next_or_none(it)
    del it
    if first is None:
        raise ValueError(f"{what} is empty")
    return (first[0], first[1])


def fed_run(step: Callable[[Any], Any], dataset: Iterable[Any], n_steps: int, warmup: int,
            what: str = "the dataset") -> tuple[int, float]:
    """``warmup`` untimed then ``n_steps`` timed ``step(batch)`` calls, each batch pulled
    from a fresh iterator of ``dataset`` and each result waited for: (images, seconds).

    Stops early (fewer images) if the dataset runs out during the timed steps;
    ``ValueError`` if it runs out during the warm-up.
    """
    it = iter(dataset)
    for _ in range(warmup):
        b = next_or_none(it)
        if b is None:
            raise ValueError(f"{what} ran out during the warm-up; repeat it")
        block(step(b))
    images, seconds = timed_run(it, n_steps, step)
    del it
    return images, seconds


class Window(NamedTuple):
    """One timed window of :func:`barrier_windows`."""

    seconds: float
    """``time.perf_counter()`` seconds from the opening barrier to the end of the window."""
    start: float
    """Wall-clock start (``time.time()``), to line windows up with other records."""


def barrier_windows(step: Callable[[], Any], barrier: Callable[[], None], steps: int = 1,
                    repeats: int = 1, warmup_steps: int = 0,
                    finish: Callable[[Any], Any] | None = None,
                    closing_barrier: bool = True) -> list[Window]:
    """The clock of every step timer that runs on all workers at once.

    ``warmup_steps`` untimed calls of ``step`` (tracing, compilation, filling buffers), then
    ``repeats`` windows: ``barrier()``, the clock starts, ``steps`` calls of ``step``,
    ``finish(result of the last call)`` if given (wait for it: a step that returns tensors is
    not done until they are fetched), ``barrier()`` again unless ``closing_barrier=False``,
    the clock stops. With both barriers every worker reports the same interval (the slowest
    worker's); without the closing one each worker times its own calls.

    ``barrier`` is any callable that returns once every worker has called it (e.g.
    ``lambda: collectives.barrier(hvd)``; a no-op on one process).
    """
    for _ in range(warmup_steps):
        step()
    windows = []
    for _ in range(repeats):
        barrier()
        t0, wall0 = time.perf_counter(), time.time()
        last = None
        for _ in range(steps):
            last = step()
        if finish is not None:
            finish(last)
        if closing_barrier:
            barrier()
        windows.append(Window(time.perf_counter() - t0, wall0))
    return windows
