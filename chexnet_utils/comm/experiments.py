"""Notebooks 05 and 06's experiments that are not a collective themselves: the glue around them.

The collectives and step timers live in :mod:`chexnet_utils.comm.collectives` and
:mod:`chexnet_utils.bench.engine_steps`; this module holds what notebooks 05 and 06 run
*around* them, so the notebook shows the calls and not the bookkeeping:

- :func:`ps_and_ring_once`: one tiny tensor averaged both ways (parameter server and
  ring-allreduce) on every engine, what notebook 05's own collectives cell is checked against;
- :func:`run_bursts`: the tensor-fusion bursts, one result per burst of tensors;
- :func:`idle_cpu_percent`: how much CPU processes use while they should be idle.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import psutil

from chexnet_utils.comm.collectives import allreduce_burst_times
from chexnet_utils.platform.lazy import lazy_module

# Horovod, TensorFlow: imported on first use (chexnet_utils.platform.lazy)
hvd = lazy_module("horovod.tensorflow")
tf = lazy_module("tensorflow")


def ps_and_ring_once() -> dict[str, Any]:
    """On every engine at once: average ``x = [0, 1, ..., 5] x (rank + 1)`` with
    :func:`chexnet_utils.comm.collectives.ps_average` (gather to rank 0, average, broadcast) and
    with ``hvd.allreduce(x, op=hvd.Average)``; both must give the same mean."""
    from chexnet_utils.comm.collectives import ps_average

    hvd.init()
    x = tf.constant(np.arange(6, dtype=np.float32) * (hvd.rank() + 1))
    return {"rank": hvd.rank(), "mine": x.numpy().tolist(),
            "ps": ps_average(x).numpy().tolist(),
            "ring": hvd.allreduce(x, op=hvd.Average).numpy().tolist()}


def run_bursts(cluster: Any, bursts: Mapping[str, Sequence[int]], repeats: int,
               timeout: float = 600.0) -> dict[str, dict[str, Any]]:
    """Rank 0's :func:`~chexnet_utils.comm.collectives.allreduce_burst_times` for every burst of
    ``bursts`` (name -> elements of each tensor), run on ``cluster`` (an
    :class:`~chexnet_utils.cluster.distributed.MPICluster`) one burst after the other."""
    return {name: cluster.run(allreduce_burst_times, list(elems), repeats, timeout=timeout,
                              stream_rank0=False)[0]
            for name, elems in bursts.items()}


def idle_cpu_percent(pids: Iterable[int], seconds: float = 2.0) -> list[float]:
    """Percent of one core each process of ``pids`` used over the next ``seconds`` (the
    measurement window; the caller makes sure the processes have nothing to do)."""
    procs = [psutil.Process(pid) for pid in pids]
    for p in procs:
        p.cpu_percent()
    time.sleep(seconds)
    return [p.cpu_percent() for p in procs]
