"""The model wing: CheXNet and what is computed from it.

- :mod:`~chexnet_utils.model.architectures`: the architectures by name (the ``Literal`` of
  ``TrainConfig.arch``, the full-size backbones, their ImageNet weight files); no Keras;
- :mod:`~chexnet_utils.model.auroc`: the exact AUROC (rank-based numpy, no scikit-learn: see
  its docstring), ROC curves, the CheXNet paper's figures; no Keras;
- :mod:`~chexnet_utils.model.models`: CheXNet and its smaller siblings, the class-weighted
  loss, Keras' AUROC estimate for logs (imports Keras, its classes defined at module level);
- :mod:`~chexnet_utils.model.accelerator`: GPU speed switches: mixed precision and XLA, on by
  default where the process has a GPU;
- :mod:`~chexnet_utils.model.explain`: Grad-CAM: where in the image did the model look for a
  pathology? (notebook 03; imports TensorFlow and Keras).

Importing the wing imports none of them (and no TensorFlow):
``from chexnet_utils.model import models``
loads what it names.
"""
