"""The data wing: from the NIH folder, or its synthetic stand-in, to verified TFRecord shards.

- :mod:`~chexnet_utils.data.labels`: the 14 pathologies, ``Finding Labels`` <-> multi-hot,
  NIH's prevalences (one copy);
- :mod:`~chexnet_utils.data.nih`: the ChestX-ray14 layout (CSV, split lists, image folders),
  the patient-level split and its leakage check;
- :mod:`~chexnet_utils.data.leakage`: what an image-level split leaks (notebook 01);
- :mod:`~chexnet_utils.data.synthetic`: a stand-in in the exact NIH layout (patients, anatomy,
  findings, rendering, the resumable writer);
- :mod:`~chexnet_utils.data.tfrecords`: the sharded, resumable, verified conversion, its wire
  format without TensorFlow and its throughput benchmark;
- :mod:`~chexnet_utils.data.prepare`: the data set and the TFRecords of the current scale,
  made on first use (every notebook).

Importing the wing imports none of them (and no TensorFlow): ``from chexnet_utils.data import
nih`` loads what it names.
"""
