"""The architectures :func:`.models.build_chexnet` builds, by name.

What the training configuration, the cost model and the GPU-node benchmark need to know about
the models before any is built: the names (``Architecture``, a ``Literal``: the type of
``TrainConfig.arch``, whose values the CLI offers), the two full-size ImageNet backbones, and
where keras-applications publishes their ImageNet weights. Importing it imports no TensorFlow.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["ARCHITECTURES", "FULL_SIZE_ARCHITECTURES", "IMAGENET_WEIGHT_FILES", "Architecture"]

FULL_SIZE_ARCHITECTURES: tuple[str, ...] = ("densenet121", "resnet50")
"""The two ImageNet backbones the Dell EMC article of October 2019 trained and scaled:
CheXNet's DenseNet-121 and ResNet-50 (seed digest §5)."""

Architecture = Literal["densenet121", "resnet50", "small"]
"""Values of ``arch`` that :func:`.models.build_chexnet` accepts (the type of
``TrainConfig.arch``)."""

ARCHITECTURES: tuple[str, ...] = get_args(Architecture)
"""The same values as a tuple: ``FULL_SIZE_ARCHITECTURES`` and ``small``."""

_KERAS_APPLICATIONS_URL = "https://storage.googleapis.com/tensorflow/keras-applications/"
IMAGENET_WEIGHT_FILES: dict[str, str] = {
    "densenet121": _KERAS_APPLICATIONS_URL
    + "densenet/densenet121_weights_tf_dim_ordering_tf_kernels_notop.h5",
    "resnet50": _KERAS_APPLICATIONS_URL
    + "resnet/resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5",
}
"""Where keras-applications publishes the ImageNet backbone weights ("notop": without the
1000-class classifier) that :func:`.models.build_chexnet` accepts as ``weights``. Download on a
machine with internet access and copy the file over; nothing here downloads."""
