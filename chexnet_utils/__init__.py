"""chexnet_utils: the tested code behind the chexnet-at-scale notebooks.

Notebooks narrate; this package implements. Modules, one concern each (the floor plan with
who uses what: docs/architecture.md):

- data: :mod:`~chexnet_utils.data.labels` (the 14 pathologies, ``Finding Labels`` <-> multi-hot),
  :mod:`~chexnet_utils.data.nih` (the ChestX-ray14 layout, patient-level split, leakage check),
  :mod:`~chexnet_utils.data.leakage` (what an image-level split does),
  :mod:`~chexnet_utils.data.synthetic` (a stand-in in the exact NIH layout),
  :mod:`~chexnet_utils.data.tfrecords` (sharded, resumable, verified conversion; a package:
  ``wire``, ``images``, ``plan``, ``convert``, ``verify``, ``bench``),
  :mod:`~chexnet_utils.data.prepare` (the data set and TFRecords for the current scale);
- input: :mod:`~chexnet_utils.pipelines` (the old and the new ``tf.data`` pipeline),
  :mod:`~chexnet_utils.feeding` (cache, snapshot, ``list_files`` and its trap, Options, Keras
  ``PyDataset``),
  :mod:`~chexnet_utils.tfdata_service` (tf.data service dispatcher/worker processes,
  ``bench service``);
- model and training: :mod:`~chexnet_utils.models` (AUROC from scikit-learn),
  :mod:`~chexnet_utils.training` (one ``train``), :mod:`~chexnet_utils.dataparallel` (the
  Horovod seams), :mod:`~chexnet_utils.checkpoints`, :mod:`~chexnet_utils.train_data`,
  :mod:`~chexnet_utils.train_callbacks`, :mod:`~chexnet_utils.run_configs`,
  :mod:`~chexnet_utils.explain` (Grad-CAM);
- many workers: :mod:`~chexnet_utils.devices` (visible GPUs, workers per node, one process
  per GPU), :mod:`~chexnet_utils.accelerator` (mixed precision and XLA switches),
  :mod:`~chexnet_utils.gpu_monitor` (GPU utilisation sampled with NVML),
  :mod:`~chexnet_utils.gpu_topology` (``nvidia-smi topo -m`` -> binding to the GPU's socket),
  :mod:`~chexnet_utils.gpu_node` (``bench gpu-node``: images/s on 1..N GPUs),
  :mod:`~chexnet_utils.distributed` (MPI, ipyparallel MPI engines),
  :mod:`~chexnet_utils.remote_engines` (engines on other hosts: one interface, CurveZMQ),
  :mod:`~chexnet_utils.slurm`, :mod:`~chexnet_utils.slurm_local`,
  :mod:`~chexnet_utils.slurm_engines` (a Slurm client, a Slurm on this machine, engines as a
  Slurm job), :mod:`~chexnet_utils.netns`, :mod:`~chexnet_utils.linkbench`,
  :mod:`~chexnet_utils.sniff` (two hosts in network namespaces, the link measured, packet
  capture),
  :mod:`~chexnet_utils.horovod_keras` (averaging gradients on Keras 3, the pitfall, the
  rank-agreement check),
  :mod:`~chexnet_utils.scaling` (images/s on 1..N workers),
  :mod:`~chexnet_utils.collectives` (parameter server vs ring-allreduce timed on the engines),
  :mod:`~chexnet_utils.steptimer` (one training step timed with Horovod or
  MultiWorkerMirroredStrategy), :mod:`~chexnet_utils.costmodel` (alpha-beta model, numpy
  simulations, gradient sizes), :mod:`~chexnet_utils.hvd_timeline` (Horovod timelines),
  :mod:`~chexnet_utils.comm_experiments` (notebooks 05 and 06's experiment glue),
  :mod:`~chexnet_utils.comm` (the façade re-exporting those, as the notebooks use them);
- measuring and showing: :mod:`~chexnet_utils.benchmark` (façade over
  :mod:`~chexnet_utils.bench_timing`, :mod:`~chexnet_utils.bench_pipeline`,
  :mod:`~chexnet_utils.bench_training`, :mod:`~chexnet_utils.bench_timeline`),
  :mod:`~chexnet_utils.plots` (``data``, ``charts``, ``training``, ``comm``),
  :mod:`~chexnet_utils.tables`, :mod:`~chexnet_utils.results`;
- exercises: :mod:`~chexnet_utils.exercises` (``check_...`` helpers that tell the learner
  whether an exercise's answer is right);
- plumbing: :mod:`~chexnet_utils.config` (every setting: ``CHEXNET_SCALE``, ``CHEXNET_DATA_DIR``,
  the overrides), :mod:`~chexnet_utils.checks`,
  :mod:`~chexnet_utils.envcheck`, :mod:`~chexnet_utils.atomic`, :mod:`~chexnet_utils.nbtools`,
  :mod:`~chexnet_utils.tutorial`, :mod:`~chexnet_utils.lab` (JupyterLab for ``make lab`` and
  the browser check), :mod:`~chexnet_utils.processes` (SIGTERM cleans up, nothing outlives a
  command), :mod:`~chexnet_utils.cli` (``python -m chexnet_utils``).
"""

from chexnet_utils.data.labels import NO_FINDING, NUM_CLASSES, PATHOLOGIES

__all__ = ["PATHOLOGIES", "NUM_CLASSES", "NO_FINDING", "__version__"]
__version__ = "0.1.0"
