"""The bench wing: the measurements, each timed side by side in one run (the stopwatch under
them all is :mod:`chexnet_utils.platform.timing`).

- :mod:`~chexnet_utils.bench.throughput`: how fast an input pipeline delivers, and its
  ceiling (images/s);
- :mod:`~chexnet_utils.bench.idle`: how much of a training step waits for data (the
  idle fraction);
- :mod:`~chexnet_utils.bench.timeline`: when the accelerator waits: per-step timelines of
  waiting vs computing;
- :mod:`~chexnet_utils.bench.benchmark`: the notebooks' one name for the input measurements
  above (notebook 02);
- :mod:`~chexnet_utils.bench.pipelines`: every registered input pipeline in one run
  (``bench pipelines``);
- :mod:`~chexnet_utils.bench.conversion`: TFRecord conversion images/s with 1 and N workers, and
  one record's decode time (notebook 01, ``bench conversion``);
- :mod:`~chexnet_utils.bench.service`: the tf.data service measured: a one-core trainer
  decoding locally vs fed by a service worker (notebook 07, ``bench service``);
- :mod:`~chexnet_utils.bench.engine_steps`: timed data-parallel training steps on MPI workers:
  Horovod or MultiWorkerMirroredStrategy;
- :mod:`~chexnet_utils.bench.scaling`: images/s on 1..N Horovod workers and the scaling
  efficiency (notebook 04, ``bench scaling``);
- :mod:`~chexnet_utils.bench.gpu_node`: the GPU-node report: CheXNet images/s on 1..N GPUs
  (``bench gpu-node``; needs GPUs);
- :mod:`~chexnet_utils.bench.link`: Horovod across two simulated nodes (network namespaces):
  link bytes, allreduce vs size, a shaped link vs the alpha-beta model (notebook 09,
  ``bench link``);
- :mod:`~chexnet_utils.bench.link_results`: ``bench link``'s presets and result dataclasses;
- :mod:`~chexnet_utils.bench.link_probes`: the programs ``bench link`` runs inside the two
  namespaces (each rank's probe, the two ends of a TCP transfer);
- :mod:`~chexnet_utils.bench.registry`: ``bench <name>`` is ``bench/<name>.py``: each command
  declared at the end of its module (``COMMAND``), found here, built by :mod:`chexnet_utils.cli`.

Importing the wing imports none of them (and no TensorFlow):
``from chexnet_utils.bench import benchmark``
loads what it names.
"""
