"""CheXNet and its smaller siblings and a class-weighted loss, as Keras objects.

What is here
------------
* :func:`build_chexnet` - DenseNet-121 (the paper's model), ResNet-50 (which the source
  articles found to scale out better) or ``small`` (a CPU-sized CNN for CI and laptops), each
  ending in ``Dense(14, sigmoid)`` named ``"predictions"``. Built without downloading anything;
  ImageNet weights come from a local file (see :func:`build_chexnet`; the names and weight files
  are :mod:`chexnet_utils.model.architectures`').
* :class:`ChexNet` - the ``keras.Model`` class every one of them is. Its ``train_step`` is
  Keras' own with one seam: the gradients pass through :attr:`ChexNet.gradient_reducer`
  (identity by default) before the optimizer applies them. Data-parallel training plugs the
  gradient average in there, e.g. with Horovod
  ``model.gradient_reducer = chexnet_utils.training.horovod_keras.per_tensor_average``.
  (``hvd.DistributedGradientTape`` works on Keras 3 only when asked for the gradients of the
  variables' ``.value``; ``hvd.keras.DistributedOptimizer`` runs but does not average on
  Keras 3: :mod:`chexnet_utils.training.horovod_keras`.)
* :func:`class_weights_from_prevalence` and :class:`WeightedBCE` - a weighted binary
  cross-entropy against class imbalance: the weighting the CheXNet paper defines for its
  binary pneumonia model (arXiv:1711.05225v3 §2.1) applied to each of the 14 classes. (The
  paper's 14-class model optimises "the sum of unweighted binary cross entropy losses", §5.)
* :class:`MeanAUROC` - Keras' thresholded AUROC estimate, for training logs only; the exact
  AUROC of a whole split, and the paper's figures, are :mod:`chexnet_utils.model.auroc`'s.

This module imports Keras (and so TensorFlow): what needs no Keras lives in
:mod:`~chexnet_utils.model.auroc` and :mod:`~chexnet_utils.model.architectures`, and modules
that must stay light import this one inside the functions that build or fit a model. The
Keras classes are registered for ``.keras`` serialisation under the package name
``chexnet_utils``; :func:`custom_objects` lists them for ``keras.saving.load_model``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops

from chexnet_utils.data.labels import NUM_CLASSES
from chexnet_utils.model.architectures import ARCHITECTURES, IMAGENET_WEIGHT_FILES

__all__ = [
    "ChexNet",
    "ImageNetCaffeInput",
    "MeanAUROC",
    "WeightedBCE",
    "build_chexnet",
    "class_weights_from_prevalence",
    "custom_objects",
]

_PACKAGE = "chexnet_utils"
register = keras.saving.register_keras_serializable(package=_PACKAGE)

# The pipelines normalise with ImageNet mean/std in RGB ("torch" mode), which is what
# DenseNet-121's ImageNet weights expect. ResNet-50's expect "caffe" mode (BGR, 0..255, mean
# subtracted, no scaling); a fixed layer converts, so both backbones get what they were
# trained on from the same pipeline.
_TORCH_MEAN = (0.485, 0.456, 0.406)
_TORCH_STD = (0.229, 0.224, 0.225)
_CAFFE_MEAN_BGR = (103.939, 116.779, 123.68)


# --------------------------------------------------------------------------------------------
# Class weights (the CheXNet paper's pneumonia weighting, per class)
# --------------------------------------------------------------------------------------------

def class_weights_from_prevalence(prevalence: Sequence[float] | np.ndarray,
                                  n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-class weights ``(w_pos, w_neg)`` of a weighted binary cross-entropy.

    The CheXNet paper (Rajpurkar et al. 2017, arXiv:1711.05225v3 §2.1) weights its binary
    pneumonia loss by the numbers of positive (``|P|``) and negative (``|N|``) training
    images; applied to each class ``c`` (the paper's 14-class model is unweighted, §5)::

        w+_c = |N_c| / (|P_c| + |N_c|)      (the fraction of negatives)
        w-_c = |P_c| / (|P_c| + |N_c|)      (the fraction of positives = prevalence)

    so a rare class's few positives weigh as much in total as its many negatives
    (``|P_c| w+_c = |N_c| w-_c``). The ratio ``w+ / w- = |N_c| / |P_c|`` is the
    ``pos_weight`` of ``tf.nn.weighted_cross_entropy_with_logits`` /
    ``torch.nn.BCEWithLogitsLoss``; the paper's form also keeps ``w+ + w- = 1``, so the loss
    stays on the scale of an ordinary cross-entropy (about half of it).

    Arguments: ``prevalence`` is either the per-class fraction of positives (``n=None``) or
    the per-class *count* of positives, with ``n`` the number of training images (e.g. the
    ``label_sums`` of a TFRecords manifest). A class with no positives (or no negatives) in
    the training set cannot be weighted this way (``w-`` would be 0, leaving its output
    untrained); it gets ``w+ = w- = 0.5``, an unweighted cross-entropy on the same scale.
    Returns two float32 arrays of the length of ``prevalence``.
    """
    p = np.asarray(prevalence, dtype=np.float64).reshape(-1)
    if p.size == 0 or not np.all(np.isfinite(p)):
        raise ValueError("prevalence must be a non-empty sequence of finite numbers")
    if n is None:
        if np.any((p < 0) | (p > 1)):
            raise ValueError("prevalence fractions must lie in [0, 1] (pass n= for counts)")
        pos, neg = p, 1.0 - p
    else:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if np.any((p < 0) | (p > n)):
            raise ValueError(f"label counts must lie in [0, n={n}]")
        pos, neg = p, float(n) - p
    total = pos + neg
    degenerate = (pos <= 0) | (neg <= 0)
    safe_total = np.where(degenerate, 1.0, total)
    w_pos = np.where(degenerate, 0.5, neg / safe_total)
    w_neg = np.where(degenerate, 0.5, pos / safe_total)
    return w_pos.astype(np.float32), w_neg.astype(np.float32)


# --------------------------------------------------------------------------------------------
# Keras classes (registered for .keras serialisation under the package name)
# --------------------------------------------------------------------------------------------

@register
class ChexNet(keras.Model):
    """A Keras functional model whose ``train_step`` has a gradient-reduction seam.

    Built by :func:`build_chexnet` (``ChexNet(inputs, outputs)``). Training is Keras' own
    ``train_step`` (forward pass, ``compute_loss``, gradients, optimizer) except that the
    gradients go through :attr:`gradient_reducer` before ``apply_gradients``. Identity
    when it is ``None`` (the default); under data parallelism it averages the gradients
    over the workers, e.g. ``lambda g: hvd.grouped_allreduce(g, op=hvd.Average)``.
    Setting it resets the compiled train function, so a new reducer takes effect on the
    next ``fit``. It is a runtime setting and not saved with the model.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gradient_reducer: Callable[[list[Any]], list[Any]] | None = None

    @property
    def gradient_reducer(self) -> Callable[[list[Any]], list[Any]] | None:
        """``grads -> grads`` applied in ``train_step`` (``None``: identity)."""
        return self._gradient_reducer

    @gradient_reducer.setter
    def gradient_reducer(self, fn: Callable[[list[Any]], list[Any]] | None) -> None:
        self._gradient_reducer = fn
        self.train_function = None  # retrace with the new reducer

    def train_step(self, data: Any) -> dict[str, Any]:
        if keras.backend.backend() != "tensorflow":  # pragma: no cover
            raise RuntimeError("ChexNet.train_step is written for the TensorFlow backend")
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred,
                                     sample_weight=sample_weight, training=True)
            scaled = self.optimizer.scale_loss(loss)
        weights = self.trainable_weights
        grads = tape.gradient(scaled, weights)
        if self._gradient_reducer is not None:
            grads = list(self._gradient_reducer(list(grads)))
            if len(grads) != len(weights):
                raise ValueError(f"gradient_reducer returned {len(grads)} gradients for "
                                 f"{len(weights)} weights")
        self.optimizer.apply_gradients(zip(grads, weights, strict=True))
        batch = tf.shape(tf.nest.flatten(x)[0])[0]
        for metric in self.metrics:
            if metric.name == "loss":  # Keras' loss tracker (the "loss" in the logs)
                metric.update_state(loss, sample_weight=batch)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


@register
class WeightedBCE(keras.losses.Loss):
    """A class-weighted binary cross-entropy on sigmoid probabilities (the CheXNet
    paper's pneumonia weighting, §2.1, for each of the 14 classes).

    Per image and class ``c``, with ``p`` the predicted probability and ``y`` in {0, 1}::

        L_c = -( w+_c * y * log(p) + w-_c * (1 - y) * log(1 - p) )

    averaged over the 14 classes (like ``keras.losses.binary_crossentropy``), then over
    the batch. ``p`` is clipped to ``[epsilon, 1 - epsilon]``. Weights from
    :func:`class_weights_from_prevalence` (or :meth:`from_label_sums`). Serialisable:
    ``get_config`` holds the weights, so a saved ``.keras`` model reloads with its loss.
    """

    def __init__(self, pos_weights: Sequence[float] | np.ndarray,
                 neg_weights: Sequence[float] | np.ndarray,
                 epsilon: float = 1e-7, name: str = "weighted_bce",
                 reduction: str = "sum_over_batch_size", dtype: Any = None) -> None:
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.pos_weights = [float(w) for w in np.asarray(pos_weights).reshape(-1)]
        self.neg_weights = [float(w) for w in np.asarray(neg_weights).reshape(-1)]
        if len(self.pos_weights) != len(self.neg_weights) or not self.pos_weights:
            raise ValueError("pos_weights and neg_weights must be non-empty and of "
                             "equal length")
        if not 0 < epsilon < 0.5:
            raise ValueError(f"epsilon must be in (0, 0.5), got {epsilon}")
        self.epsilon = float(epsilon)

    @classmethod
    def from_label_sums(cls, label_sums: Sequence[float] | np.ndarray, n: int,
                        **kwargs: Any) -> WeightedBCE:
        """Weights from per-class positive counts over ``n`` training images."""
        w_pos, w_neg = class_weights_from_prevalence(label_sums, n)
        return cls(w_pos, w_neg, **kwargs)

    def call(self, y_true: Any, y_pred: Any) -> Any:
        y_pred = ops.convert_to_tensor(y_pred)
        y_true = ops.cast(y_true, y_pred.dtype)
        p = ops.clip(y_pred, self.epsilon, 1.0 - self.epsilon)
        w_pos = ops.convert_to_tensor(self.pos_weights, dtype=y_pred.dtype)
        w_neg = ops.convert_to_tensor(self.neg_weights, dtype=y_pred.dtype)
        per_class = -(w_pos * y_true * ops.log(p)
                      + w_neg * (1.0 - y_true) * ops.log(1.0 - p))
        return ops.mean(per_class, axis=-1)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "pos_weights": list(self.pos_weights),
                "neg_weights": list(self.neg_weights), "epsilon": self.epsilon}


@register
class MeanAUROC(keras.metrics.AUC):
    """Mean over the classes of Keras' thresholded ROC AUC, for training logs.

    ``keras.metrics.AUC(multi_label=True, num_labels=14)``: accumulates a confusion matrix
    at ``num_thresholds`` thresholds per class over the epoch and averages the per-class
    areas. An approximation (thresholds, and classes without positives count with AUC
    0), so report :func:`per_class_auroc` on a whole split instead.
    """

    def __init__(self, num_labels: int = NUM_CLASSES, name: str = "mean_auroc",
                 num_thresholds: int = 200, **kwargs: Any) -> None:
        kwargs.pop("multi_label", None)
        super().__init__(num_thresholds=num_thresholds, multi_label=True,
                         num_labels=num_labels, name=name, **kwargs)


@register
class ImageNetCaffeInput(keras.layers.Layer):
    """Fixed conversion of ImageNet mean/std-normalised RGB ("torch" mode) into the
    BGR, 0..255, mean-subtracted input ("caffe" mode) of keras-applications' ResNet-50."""

    def call(self, x: Any) -> Any:
        mean = ops.convert_to_tensor(_TORCH_MEAN, dtype=x.dtype)
        std = ops.convert_to_tensor(_TORCH_STD, dtype=x.dtype)
        caffe = ops.convert_to_tensor(_CAFFE_MEAN_BGR, dtype=x.dtype)
        rgb = (x * std + mean) * 255.0
        return ops.flip(rgb, axis=-1) - caffe

    def compute_output_shape(self, input_shape: Any) -> Any:
        return input_shape


def custom_objects() -> dict[str, type]:
    """The custom classes, for ``keras.saving.load_model(path, custom_objects=...)``.

    Registration already makes ``load_model`` find them once this module is imported;
    passing them explicitly is harmless.
    """
    classes: dict[str, type] = {"ChexNet": ChexNet, "WeightedBCE": WeightedBCE,
                                "MeanAUROC": MeanAUROC, "ImageNetCaffeInput": ImageNetCaffeInput}
    return {f"{_PACKAGE}>{k}": v for k, v in classes.items()} | classes


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------

def _small_backbone(input_size: int, widths: Sequence[int] = (16, 32, 64, 128, 128),
                    bn_momentum: float = 0.9, pooling: str = "avg") -> keras.Model:
    """The ``small`` CNN: conv-BN-ReLU blocks with max pooling, then global pooling.

    Default: a stride-2 stem (16 filters), three blocks of 32, 64, 128 filters each followed
    by 2x2 max pooling, a last block of 128 and global average pooling (128 px in: 64, 32,
    16, 8 px feature maps; 0.25 M parameters with the head). BatchNorm momentum 0.9 instead
    of Keras' 0.99: with a few hundred images an epoch is ~25 steps, and the slow default
    leaves the moving statistics used at evaluation far behind the weights for the first
    epochs (validation loss rising while training loss falls). ``widths``/``pooling`` are for
    experiments.
    """

    def block(x: Any, filters: int, name: str, strides: int = 1) -> Any:
        x = layers.Conv2D(filters, 3, strides=strides, padding="same", use_bias=False,
                          name=f"{name}_conv")(x)
        x = layers.BatchNormalization(momentum=bn_momentum, name=f"{name}_bn")(x)
        return layers.Activation("relu", name=f"{name}_relu")(x)

    inputs = keras.Input((input_size, input_size, 3), name="image")
    x = block(inputs, widths[0], "stem", strides=2)
    for i, filters in enumerate(widths[1:-1], start=1):
        x = block(x, filters, f"block{i}")
        x = layers.MaxPooling2D(2, name=f"block{i}_pool")(x)
    x = block(x, widths[-1], f"block{len(widths) - 1}")
    if pooling == "avg":
        x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    elif pooling == "max":
        x = layers.GlobalMaxPooling2D(name="max_pool")(x)
    else:
        x = layers.Concatenate(name="pool")([layers.GlobalAveragePooling2D(name="avg_pool")(x),
                                             layers.GlobalMaxPooling2D(name="max_pool")(x)])
    return keras.Model(inputs, x, name="backbone")


def _check_weights_file(weights: str | PathLike[str]) -> Path:
    path = Path(weights).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"weights file {str(path)!r} not found. Pass a local file: a full-model "
            f"'.weights.h5' saved by this package, or ImageNet backbone weights "
            f"('*_notop.h5' of keras-applications, downloaded on a machine with internet "
            f"access, see chexnet_utils.model.architectures.IMAGENET_WEIGHT_FILES). "
            "Nothing is downloaded.")
    return path


def _is_full_model_weights(path: Path) -> bool:
    return path.name.endswith(".weights.h5") or path.suffix == ".keras"


def build_chexnet(arch: str = "densenet121", input_size: int = 224,
                  weights: str | PathLike[str] | None = None,
                  num_classes: int = NUM_CLASSES) -> keras.Model:
    """CheXNet: a convolutional backbone, global average pooling, ``Dense(14, sigmoid)``.

    ``arch``
        ``"densenet121"`` (CheXNet itself, 7.0 M parameters), ``"resnet50"`` (23.6 M; the
        source articles found it scaled out better) or ``"small"`` (0.25 M; five conv-BN-ReLU
        blocks, 16 -> 128 filters, global average pooling: trains at ~200-250 images/s
        at 128 px on two CPU cores, for CI and laptops). The backbones are
        ``keras.applications.DenseNet121/ResNet50(include_top=False, weights=None,
        pooling="avg")``; the head is ``Dense(num_classes, activation="sigmoid",
        name="predictions")``, which computes in float32 under any dtype policy. The model is
        a :class:`ChexNet` (a ``keras.Model`` with the gradient-reduction seam), named
        ``chexnet_<arch>``, with the backbone nested as one layer named ``backbone``. Built
        under Keras' global ``mixed_float16`` policy it is a mixed-precision model
        (:func:`chexnet_utils.model.accelerator.build_model`).
    ``input_size``
        Side of the square RGB input (inputs normalised with ImageNet mean/std, as
        :mod:`chexnet_utils.input.pipelines` delivers them). Any size >= 32 works for every arch.
    ``weights``
        ``None``: random initialisation. Or the path of a local file:

        * a full-model weights file (``*.weights.h5``, e.g. the ``best.weights.h5`` a
          training run writes, or ``model.save_weights``; also a ``.keras`` model file) of
          the same ``arch`` and ``num_classes``: loaded into the whole model;
        * ImageNet backbone weights as keras-applications distributes them
          (``densenet121_weights_tf_dim_ordering_tf_kernels_notop.h5``,
          ``resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5``): loaded into the
          backbone only (CheXNet's ImageNet initialisation); the head stays random.

        Nothing is ever downloaded (``weights="imagenet"`` would try). To use ImageNet
        weights offline, download the ``_notop.h5`` file for the arch on a machine with
        internet access (URLs in :data:`IMAGENET_WEIGHT_FILES`, e.g.
        ``wget https://storage.googleapis.com/tensorflow/keras-applications/densenet/densenet121_weights_tf_dim_ordering_tf_kernels_notop.h5``),
        copy it over, and pass its path. (Copying it to ``~/.keras/models/`` also makes
        ``keras.applications.DenseNet121(weights="imagenet")`` find it without a download.)

    Raises ``ValueError`` for an unknown ``arch``, a file that does not fit the
    architecture, or backbone weights passed to ``small``; ``FileNotFoundError`` for a
    missing file. ResNet-50 gets a fixed input layer that converts the pipeline's "torch"
    normalisation to the "caffe" input its ImageNet weights expect.
    """

    arch = str(arch).lower()
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown arch {arch!r}; expected one of {', '.join(ARCHITECTURES)}")
    if input_size < 32:
        raise ValueError(f"input_size must be >= 32, got {input_size}")
    path = _check_weights_file(weights) if weights is not None else None
    backbone_file = path is not None and not _is_full_model_weights(path)
    if backbone_file and arch == "small":
        raise ValueError(f"{path}: 'small' has no ImageNet backbone weights; pass a "
                         "'.weights.h5' file saved from a 'small' model, or no weights")

    shape = (input_size, input_size, 3)
    if arch == "densenet121":
        backbone = keras.applications.DenseNet121(include_top=False, weights=None,
                                                  input_shape=shape, pooling="avg",
                                                  name="backbone")
    elif arch == "resnet50":
        backbone = keras.applications.ResNet50(include_top=False, weights=None,
                                               input_shape=shape, pooling="avg",
                                               name="backbone")
    else:
        backbone = _small_backbone(input_size)
    if backbone_file:
        assert path is not None
        try:
            backbone.load_weights(str(path))
        except Exception as e:  # h5py / Keras raise various types for a mismatched file
            raise ValueError(
                f"{path}: cannot load as ImageNet backbone weights for {arch} ({e}). "
                f"Expected {IMAGENET_WEIGHT_FILES[arch].rsplit('/', 1)[-1]} "
                f"(from {IMAGENET_WEIGHT_FILES[arch]}), or a '.weights.h5' file saved from a "
                f"{arch} model") from None

    inputs = keras.Input(shape, name="image")
    x = inputs
    if arch == "resnet50":
        x = ImageNetCaffeInput(name="imagenet_caffe_input")(x)
    x = backbone(x)
    # float32 whatever the global dtype policy: under mixed_float16 a float16 sigmoid would
    # round probabilities above ~0.9998 to 1 (Keras' mixed precision guide: the output layer
    # in float32; chexnet_utils.model.accelerator)
    outputs = keras.layers.Dense(num_classes, activation="sigmoid", name="predictions",
                                 dtype="float32")(x)
    model = ChexNet(inputs, outputs, name=f"chexnet_{arch}")

    if path is not None and not backbone_file:
        try:
            model.load_weights(str(path))
        except Exception as e:
            raise ValueError(f"{path}: cannot load into a {arch} model at {input_size} px "
                             f"with {num_classes} outputs ({e}); was it saved from the same "
                             f"arch?") from None
    return model
