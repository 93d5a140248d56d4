"""How the gradients travel: collectives timed, a cost model, Horovod timelines (notebooks 05, 06).

``from chexnet_utils import comm`` then ``comm.allreduce_times``, ``comm.fit_alpha_beta``,
``comm.parse_timeline`` ...: the names notebooks 05 and 06 (and the communication tests) use,
re-exported from one module per concern:

- :mod:`~chexnet_utils.comm.collectives`: parameter server vs ring-allreduce timed on the MPI
  engines (``ps_average``, ``allreduce_times``, ``parameter_server_times``,
  ``allreduce_burst_times``, ``allreduce_scan_on_engine``) and the sweeps' tensor sizes
  (``message_sizes``, ``default_max_bytes``, ``format_bytes``, ``MIB``);
- :mod:`~chexnet_utils.comm.costmodel`: bandwidths, the alpha-beta model, predictions, the numpy
  simulations of both algorithms, CheXNet's gradient sizes (no TensorFlow but for those);
- :mod:`~chexnet_utils.comm.timeline`: Horovod timelines recorded, parsed and summarised;
- :mod:`~chexnet_utils.comm.experiments`: what notebooks 05 and 06 run *around* a collective
  (both averages of one tiny tensor, the fusion bursts, idle CPU).

And for ``TF_CONFIG``, :func:`chexnet_utils.platform.ports.free_port` (``free_port``). One
training step timed with Horovod or MultiWorkerMirroredStrategy is a measurement:
:mod:`chexnet_utils.bench.engine_steps` (it uses this wing, so it cannot be re-exported here). The
figures are :mod:`chexnet_utils.plots`' (``plots.plot_sweeps``, ``plots.plot_timeline``); the
two-node link benchmark is :mod:`chexnet_utils.bench.link`. Nothing is defined here.
"""

from __future__ import annotations

from chexnet_utils.comm.collectives import (
    MIB,
    allreduce_burst_times,
    allreduce_scan_on_engine,
    allreduce_times,
    default_max_bytes,
    format_bytes,
    message_sizes,
    parameter_server_times,
    ps_average,
)
from chexnet_utils.comm.costmodel import (
    REPORTED_HOROVOD_2018,
    algbw,
    busbw,
    chexnet_gradient_sizes,
    fit_alpha_beta,
    predict,
    predict_efficiencies,
    predict_ps,
    predict_ring,
    scaling_efficiency_prediction,
    simulate_parameter_server,
    simulate_ring_allreduce,
)
from chexnet_utils.comm.experiments import idle_cpu_percent, ps_and_ring_once, run_bursts
from chexnet_utils.comm.timeline import (
    TimelineEvent,
    busy_time_us,
    parse_timeline,
    short_tensor_name,
    timeline_summary,
    wait_for_timeline,
)
from chexnet_utils.platform.ports import free_port

__all__ = [
    "MIB", "REPORTED_HOROVOD_2018", "free_port",
    # collectives
    "default_max_bytes", "message_sizes", "format_bytes", "ps_average", "allreduce_times",
    "parameter_server_times", "allreduce_burst_times", "allreduce_scan_on_engine",
    # costmodel
    "algbw", "busbw", "fit_alpha_beta", "predict", "predict_ring", "predict_ps",
    "scaling_efficiency_prediction", "simulate_ring_allreduce", "simulate_parameter_server",
    "chexnet_gradient_sizes", "predict_efficiencies",
    # experiments
    "ps_and_ring_once", "run_bursts", "idle_cpu_percent",
    # timeline
    "TimelineEvent", "parse_timeline", "wait_for_timeline", "timeline_summary",
    "short_tensor_name", "busy_time_us",
]
