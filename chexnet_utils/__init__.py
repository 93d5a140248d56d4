"""chexnet_utils: the tested code behind the chexnet-at-scale notebooks.

Notebooks narrate; this package implements. It is built in wings, one subpackage per concern,
each ``__init__`` docstring the wing's map (the floor plan with who uses what:
docs/architecture.md):

- :mod:`~chexnet_utils.platform`: process lifetime, crash-safe writes, the stopwatch, argument
  checks, the exposure gate before a listener;
- :mod:`~chexnet_utils.hardware`: devices and cores, GPU utilisation and topology, the
  environment check;
- :mod:`~chexnet_utils.data`: labels, the NIH layout, leakage, the synthetic stand-in, the
  TFRecords conversion, the data of the current scale;
- :mod:`~chexnet_utils.input`: the old and the new ``tf.data`` pipeline, feeding at scale, the
  tf.data service;
- :mod:`~chexnet_utils.model`: CheXNet, AUROC, mixed precision and XLA, Grad-CAM;
- :mod:`~chexnet_utils.cluster`: MPI engines driven from a notebook, interrupts, Slurm, engines
  on other hosts, two nodes in network namespaces;
- :mod:`~chexnet_utils.comm`: how the gradients travel: parameter server vs ring-allreduce
  timed, the alpha-beta cost model, Horovod timelines;
- :mod:`~chexnet_utils.training`: :func:`~chexnet_utils.training.train` for the CLI, Horovod and
  Slurm, the data-parallel seams, callbacks, checkpoints, Horovod on Keras 3;
- :mod:`~chexnet_utils.bench`: the measurements (pipelines, idle time, timelines, timed steps,
  scaling, the GPU node, the tf.data service, the two-node link);
- :mod:`~chexnet_utils.plots`: every figure, one function each;
- :mod:`~chexnet_utils.notebook`: tables, results, the exercises' checks, ``make tutorial``,
  clean notebooks in git.

At the top: :mod:`~chexnet_utils.config` (every setting), :mod:`~chexnet_utils.cli`
(``python -m chexnet_utils``) and :mod:`~chexnet_utils.lab` (JupyterLab for ``make lab``).
What only the tests use (a headless JupyterLab, the notebook linters, the closing table, a
packet sniffer, the data-set fixtures) lives in ``tests/support/``, not here.
"""

from chexnet_utils.data.labels import NO_FINDING, NUM_CLASSES, PATHOLOGIES

__all__ = ["PATHOLOGIES", "NUM_CLASSES", "NO_FINDING", "__version__"]
__version__ = "0.1.0"
