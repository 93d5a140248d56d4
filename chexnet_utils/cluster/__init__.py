"""The cluster wing: starting, driving and stopping many processes, on this machine and beyond it.

- :mod:`~chexnet_utils.cluster.distributed`: ``mpirun`` commands and
  :class:`~chexnet_utils.cluster.distributed.MPICluster`: ipyparallel MPI engines driven from a
  notebook (notebooks 04-07);
- :mod:`~chexnet_utils.cluster.engine_interrupts`: what the notebook's Interrupt does to tasks
  running on engines, made bounded;
- :mod:`~chexnet_utils.cluster.slurm`: talking to a Slurm cluster: submit a batch job, read its
  state, wait for it;
- :mod:`~chexnet_utils.cluster.slurm_local`: a real Slurm on this one machine (``munged``,
  ``slurmctld``, ``slurmd``) for its user only (notebook 08);
- :mod:`~chexnet_utils.cluster.slurm_access`: who can reach the one-machine Slurm, and where
  its daemons may write;
- :mod:`~chexnet_utils.cluster.slurm_engines`: ipyparallel engines started as a Slurm job,
  driven like an ``MPICluster``;
- :mod:`~chexnet_utils.cluster.netns`: two "nodes" on one machine: network namespaces joined by
  a veth pair, shaped by ``tc`` (notebook 09);
- :mod:`~chexnet_utils.cluster.elastic`: ``horovodrun`` jobs, elastic or static, on names that
  are each a host to Horovod and all this machine; a worker killed, a host added (notebook 10).

Importing the wing imports none of them (and no TensorFlow):
``from chexnet_utils.cluster import distributed``
loads what it names.
"""
