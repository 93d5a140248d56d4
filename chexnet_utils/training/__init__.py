"""Training CheXNet: one :func:`train` for the CLI, Horovod, Slurm and the tests (notebooks 03-04).

``from chexnet_utils import training`` then ``training.train(training.TrainConfig(...))``: the
names notebooks, the CLI and the tests use, re-exported from one module per concern:

- :mod:`~chexnet_utils.training.loop`: :class:`TrainConfig` (``TrainConfig.from_scale``: one
  run of a scale preset, notebooks 04 and 08), :class:`TrainResult`,
  :func:`train` (what one call does, step by step, and Horovod's six changes: its docstring)
  and :func:`train_on_engine` (the same on an ipyparallel MPI engine);
- :mod:`~chexnet_utils.training.dataparallel`: the data-parallel seams (``init_world``,
  ``Recipe``, the one compile of train() and the benchmarks, ``gradient_averager``,
  ``broadcast_initial_state``, ``scaled_learning_rate``,
  and from :mod:`~chexnet_utils.training.horovod_keras` ``weights_sha256``, the one weights
  fingerprint);
- :mod:`~chexnet_utils.training.callbacks`: the Keras callbacks of a run (warm-up, metric
  average, validation AUROC, checkpoints);
- :mod:`~chexnet_utils.training.checkpoints`: the files of ``out_dir`` (checkpoints, state,
  CSV log, ``metrics.json``), written crash-safe and read back for ``resume``;
- :mod:`~chexnet_utils.training.splits`: the manifest's counts and label sums, a split as an
  evaluation dataset, its predictions and loss;
- :mod:`~chexnet_utils.training.horovod_keras`: Horovod on Keras 3, the ways to average
  gradients and the documented one that does not, ranks compared by weight digests;
- :mod:`~chexnet_utils.training.experiments`: notebook 04's experiments that prove those on
  its engines, and the trials its exercises are judged by (not re-exported here).

No module here but :mod:`~chexnet_utils.training.callbacks` imports TensorFlow at import time
(``import chexnet_utils.training`` is cheap): the callbacks import Keras at their top, and
:func:`train` imports them when it runs; the others name TensorFlow, Keras and Horovod at
their top with :func:`chexnet_utils.platform.lazy.lazy_module`, imported on first use.
"""

from __future__ import annotations

from chexnet_utils.training.checkpoints import (
    BEST_NAME,
    CHECKPOINT_DIR,
    CSV_NAME,
    LAST_NAME,
    METRICS_NAME,
    STATE_FORMAT,
    STATE_NAME,
    TENSORBOARD_DIR,
    load_checkpoint,
    read_csv_log,
)
from chexnet_utils.training.dataparallel import (
    LR_SCALINGS,
    Recipe,
    broadcast_initial_state,
    gradient_averager,
    init_world,
    scaled_learning_rate,
)
from chexnet_utils.training.horovod_keras import weights_sha256
from chexnet_utils.training.loop import TrainConfig, TrainResult, train, train_on_engine
from chexnet_utils.training.splits import predict_split, training_label_sums

__all__ = [
    "BEST_NAME", "CHECKPOINT_DIR", "CSV_NAME", "LAST_NAME", "METRICS_NAME", "STATE_FORMAT",
    "STATE_NAME", "TENSORBOARD_DIR", "load_checkpoint", "read_csv_log",
    "LR_SCALINGS", "Recipe", "broadcast_initial_state", "gradient_averager", "init_world",
    "scaled_learning_rate", "weights_sha256",
    "TrainConfig", "TrainResult", "train", "train_on_engine",
    "predict_split", "training_label_sums",
]
