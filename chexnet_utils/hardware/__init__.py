"""The hardware wing: which devices and cores a process may use, and what the stack was built with.

- :mod:`~chexnet_utils.hardware.devices`: one process per accelerator: pin each Horovod process
  to its GPU (or its share of the cores); NVML listing, the one ``nvidia-smi`` runner;
- :mod:`~chexnet_utils.hardware.gpu_monitor`: GPU utilisation over time, sampled with NVML
  while something runs;
- :mod:`~chexnet_utils.hardware.gpu_topology`: bind each GPU's process to the cores of that
  GPU's socket, from ``nvidia-smi topo -m``;
- :mod:`~chexnet_utils.hardware.envcheck`: what is installed and what Horovod was built with:
  the tutorial's environment check (notebook 00).

Importing the wing imports none of them (and no TensorFlow):
``from chexnet_utils.hardware import devices``
loads what it names.
"""
