"""How the gradients travel: the façade over the modules that measure and model it.

``from chexnet_utils import comm`` then ``comm.allreduce_times``, ``comm.fit_alpha_beta``,
``comm.parse_timeline`` ...: the names notebooks 05, 06 (and the communication tests) use, while
the code lives in one module per concern:

- :mod:`chexnet_utils.collectives`: parameter server vs ring-allreduce timed on the MPI
  engines (``ps_average``, ``allreduce_times``, ``parameter_server_times``,
  ``allreduce_burst_times``, ``allreduce_scan_on_engine``) and the sweeps' tensor sizes
  (``message_sizes``, ``default_max_bytes``, ``format_bytes``, ``MIB``);
- :mod:`chexnet_utils.bench.steptimer`: one training step timed with Horovod or
  MultiWorkerMirroredStrategy (``StepConfig``, ``hvd_throughput_on_engine``,
  ``tf_config``, ``mwms_setup_on_engine``, ``backend_throughput_on_engine``) and, for
  ``TF_CONFIG``, :func:`chexnet_utils.platform.ports.free_port` (``free_port``);
- :mod:`chexnet_utils.costmodel`: bandwidths, the alpha-beta model, predictions, the numpy
  simulations of both algorithms, CheXNet's gradient sizes;
- :mod:`chexnet_utils.hvd_timeline`: Horovod timelines recorded, parsed and summarised.

The figures are :mod:`chexnet_utils.plots`' (``plots.plot_sweeps``, ``plots.plot_timeline``).
Only names somebody uses are re-exported; anything else (and new code) imports from those
modules. Nothing is defined here.
"""

from __future__ import annotations

from chexnet_utils.bench.steptimer import (
    StepConfig,
    backend_throughput_on_engine,
    hvd_throughput_on_engine,
    mwms_setup_on_engine,
    mwms_strategy,
    tf_config,
)
from chexnet_utils.collectives import (
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
from chexnet_utils.costmodel import (
    REPORTED_HOROVOD_2018,
    algbw,
    busbw,
    chexnet_gradient_sizes,
    fit_alpha_beta,
    predict,
    predict_ps,
    predict_ring,
    scaling_efficiency_prediction,
    simulate_parameter_server,
    simulate_ring_allreduce,
)
from chexnet_utils.hvd_timeline import (
    TimelineEvent,
    busy_time_us,
    parse_timeline,
    short_tensor_name,
    timeline_summary,
    wait_for_timeline,
)
from chexnet_utils.platform.ports import free_port

__all__ = [
    "MIB", "REPORTED_HOROVOD_2018",
    # collectives
    "default_max_bytes", "message_sizes", "format_bytes", "ps_average", "allreduce_times",
    "parameter_server_times", "allreduce_burst_times", "allreduce_scan_on_engine",
    # steptimer
    "StepConfig", "hvd_throughput_on_engine", "free_port", "tf_config",
    "mwms_setup_on_engine", "mwms_strategy", "backend_throughput_on_engine",
    # costmodel
    "algbw", "busbw", "fit_alpha_beta", "predict", "predict_ring", "predict_ps",
    "scaling_efficiency_prediction", "simulate_ring_allreduce", "simulate_parameter_server",
    "chexnet_gradient_sizes",
    # hvd_timeline
    "TimelineEvent", "parse_timeline", "wait_for_timeline", "timeline_summary",
    "short_tensor_name", "busy_time_us",
]
