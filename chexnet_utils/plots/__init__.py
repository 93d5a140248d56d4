"""Figures the notebooks draw, one function per figure, each returning the matplotlib Figure.

Kept here so the notebooks stay short and every figure is drawn the same way in
``make tutorial`` (saved as PNG with :func:`chexnet_utils.notebook.results.save_figure`).

One module per subject (each function returns the matplotlib Figure):
:mod:`~chexnet_utils.plots.data` (labels, images), :mod:`~chexnet_utils.plots.charts` (bars,
step timelines, scaling curves, GPU use), :mod:`~chexnet_utils.plots.training` (learning and
ROC curves, Grad-CAM) and :mod:`~chexnet_utils.plots.comm` (Horovod timelines, allreduce
sweeps). Import them from here: ``from chexnet_utils import plots; plots.bars(...)``.
"""

from chexnet_utils.plots.charts import (
                                        bars,
                                        bars_with_runs,
                                        gpu_utilisation,
                                        grouped_bars,
                                        scaling,
                                        scaling_panels,
                                        timelines,
                                        worker_learning_curves,
)
from chexnet_utils.plots.comm import (
                                        allreduce_overlap,
                                        alpha_beta_fit,
                                        backend_throughput,
                                        binding,
                                        fp16_compression,
                                        plot_sweeps,
                                        plot_timeline,
                                        scaling_prediction,
                                        tensor_fusion,
)
from chexnet_utils.plots.data import (
                                        NIH_PREVALENCE,
                                        conversion_throughput,
                                        cooccurrence,
                                        cooccurrence_matrix,
                                        image_grid,
                                        label_distribution,
                                        similarity_histogram,
)
from chexnet_utils.plots.training import (
                                        elastic_runs,
                                        grad_cam_overlay,
                                        learning_curves,
                                        roc_curves,
)

__all__ = ["NIH_PREVALENCE", "label_distribution", "cooccurrence", "conversion_throughput",
           "similarity_histogram",
           "cooccurrence_matrix", "image_grid", "bars", "timelines", "scaling",
           "grouped_bars", "learning_curves", "roc_curves", "grad_cam_overlay",
           "gpu_utilisation", "plot_timeline", "plot_sweeps",
           "bars_with_runs", "scaling_panels", "worker_learning_curves", "allreduce_overlap",
           "alpha_beta_fit", "backend_throughput", "binding", "fp16_compression",
           "scaling_prediction", "tensor_fusion", "elastic_runs"]
