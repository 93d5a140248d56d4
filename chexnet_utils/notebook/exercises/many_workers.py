"""Answer checks of notebooks 04 (Horovod on MPI engines) and 05 (communication and
scaling)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from chexnet_utils import comm
from chexnet_utils.notebook.exercises.verdict import close, missing, number, verdict


def check_old_pipeline_efficiency(answer: float | None, rate_1: float, rate_m: float,
                                  m: int, n: int = 4) -> bool:
    """04, exercise 4: the old pipeline's scaling efficiency on ``n`` workers, predicted from
    its measured images/s on 1 and on ``m`` workers (a fraction, 0..1).

    Every worker decodes every image and keeps 1/N, so a useful image costs ``N d + c``
    (decode ``d``, model ``c``): ``1/rate_1 = d + c`` and ``m/rate_m = m d + c`` give ``d`` and
    ``c``, and the efficiency on ``n`` workers is ``(d + c) / (n d + c)``.
    """
    if m < 2:
        raise ValueError(f"needs a measurement on m >= 2 workers, got m={m}")
    t1, tm = 1.0 / rate_1, m / rate_m
    d = (tm - t1) / (m - 1)
    c = t1 - d
    if missing(answer, "1/rate(1) = d + c and m/rate(m) = m d + c: solve for d and c"):
        return False
    if d <= 0:
        print(f"Not yet: these rates scale at least linearly ({rate_1:.1f} -> {rate_m:.1f} "
              f"img/s on {m} workers), so nothing is decoded twice: that is the new pipeline's "
              "behaviour; use the old pipeline's rates")
        return False
    if c <= 0:
        print(f"Not yet: {rate_1:.1f} -> {rate_m:.1f} img/s on {m} workers is worse than "
              "decoding every image on every worker explains (the model time comes out "
              "negative): something else slowed the workers down (a busy machine, MPI "
              "spinning). Measure again on a quiet machine")
        return False
    expected = (d + c) / (n * d + c)
    value = number(answer)
    return verdict(
        value is not None and abs(value - expected) <= 0.01,
        f"{expected:.1%} on {n} workers (d = {d * 1e3:.1f} ms decode, c = {c * 1e3:.1f} "
        f"ms model per image). However many workers, the job never beats 1/d = "
        f"{1 / d:.0f} img/s.",
        "give a fraction between 0 and 1, not a percentage" if value is not None and value > 1
        else f"d = (m/rate(m) - 1/rate(1)) / (m - 1); c = 1/rate(1) - d; then "
             f"(d + c) / ({n} d + c)")


def check_efficiency(answer: float | None, n_workers: int, grad_bytes: float,
                     compute_s: float, alpha: float, beta: float, overhead_s: float = 0.0,
                     n_messages: int = 1) -> bool:
    """05, exercises 1 and 2: the ring's predicted scaling efficiency (a fraction, 0..1).

    Recomputes :func:`comm.scaling_efficiency_prediction` with your fitted ``alpha``,
    ``beta`` and ``overhead_s``; ``n_messages`` > 1 is the gradient sent without fusion.
    """
    def eff(messages: int) -> float:
        return comm.scaling_efficiency_prediction(n_workers, grad_bytes, compute_s, alpha, beta,
                                                  overhead_s=overhead_s, n_messages=messages)

    expected = eff(n_messages)
    if missing(answer, "use comm.scaling_efficiency_prediction (or eff() of section 7)"):
        return False
    value = number(answer)
    unfused = (f" Fused into one message it would be {eff(1):.1%}: each of the {n_messages} "
               f"messages pays 2(N-1) = {2 * (n_workers - 1)} latencies."
               if n_messages > 1 else "")
    return verdict(
        value is not None and abs(value - expected) <= 0.01,
        f"{expected:.1%} on {n_workers} workers with {compute_s * 1e3:g} ms of compute per step."
        + unfused,
        "give a fraction between 0 and 1, not a percentage" if value is not None and value > 1
        else "compute / (compute + overhead + messages x ring time per message); the ring "
             "time is 2(N-1) alpha + 2(N-1)/N x bytes x beta.")


def check_ps_shards(answer: int | None, n_workers: int = 64) -> bool:
    """05, exercise 3: the fewest parameter-server shards whose busiest link carries no more
    than a ring-allreduce worker's link.

    With ``k`` shards a server link carries ``N x size / k`` each way, a ring worker's link
    ``2(N-1)/N x size``: so ``k >= N^2 / (2(N-1))``.
    """
    bound = n_workers ** 2 / (2 * (n_workers - 1))
    expected = math.ceil(bound)
    if missing(answer, "one shard's link carries N x size / k each way; a ring worker's "
                        "2(N-1)/N x size"):
        return False
    value = number(answer)
    return verdict(
        close(answer, expected),
        f"k >= N^2 / (2(N-1)) = {bound:.2f}, so {expected} shards for {n_workers} workers: "
        "about one server per two workers. As many shards as workers *is* an allreduce.",
        (f"close: with {value:g} shards a server link carries {n_workers / value:.3f} x size, "
         f"a ring worker's {2 * (n_workers - 1) / n_workers:.3f} x size"
         if value is not None and value > 0 and abs(value - bound) < 2 else
         "set N x size / k <= 2(N-1)/N x size and solve for the smallest whole k."))


def check_uneven_shards(answer: Callable[..., Any] | None, n_workers: int = 2,
                        run: Callable[..., list[Any]] | None = None, timeout: float = 90) -> bool:
    """04 exercise 7: your ``train_all(step, batches, model)`` on shards of unequal size
    (:func:`chexnet_utils.training.experiments.join_trial`: 4 batches on rank 0, 2 on rank 1):
    every rank trains on all its batches, no rank hangs, the ranks end identical."""
    from chexnet_utils.cluster.distributed import EngineFailure
    from chexnet_utils.training.experiments import join_problem, join_trial, run_on_engines

    if missing(answer, "write train_all (the cell above) and set answer = train_all"):
        return False
    try:  # a rank left in an allreduce never returns: the timeout ends the job
        ranks = run_on_engines(join_trial, answer, n_workers=n_workers, run=run, timeout=timeout)
    except EngineFailure as e:
        return verdict(False, "", f"the job hung ({e}): the rank with more batches waits in "
                        "an allreduce nobody joins; call hvd.join() after your loop.")
    problem = join_problem(ranks)
    return verdict(problem is None, "every rank trained on all its batches, nobody hung, "
                    "and the ranks ended identical.", problem or "")
