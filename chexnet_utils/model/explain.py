"""Grad-CAM: where in the image did the model look for a pathology?

Grad-CAM (Selvaraju et al. 2017) weights the feature maps of a convolutional layer by how
much the class score depends on them, and keeps the positive part::

    alpha_k = mean over (i, j) of  d score / d A_k[i, j]      (one weight per channel k)
    cam     = ReLU( sum_k alpha_k * A_k )                     (an h x w map)

``A`` is the output of the last convolutional block (the deepest feature map that still has
a spatial layout: 4 x 4 for the ``small`` model at 64 px, 7 x 7 for DenseNet-121 at 224 px).
The map is scaled to [0, 1] and resized to the input image, ready to overlay
(:func:`chexnet_utils.plots.grad_cam_overlay`). The CheXNet paper (Rajpurkar et al. 2017,
arXiv:1711.05225v3 §6) showed class activation maps (CAM: the last feature maps weighted by
the classifier's weights), which Grad-CAM at the last feature map of such a model equals up
to a positive factor. Notebook 03 writes Grad-CAM out in a cell and checks it against
:func:`grad_cam`.

The models of :func:`chexnet_utils.model.models.build_chexnet` nest their backbone as one layer
named ``"backbone"``; :func:`grad_cam` looks inside nested models, so it finds DenseNet-121's
``relu``, ResNet-50's ``conv5_block3_out`` and the ``small`` model's ``block4_relu`` by itself.

Importing this module imports TensorFlow and Keras (nothing TensorFlow-free needs it).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

__all__ = ["find_layer", "grad_cam", "last_conv_layer", "layer_chain"]

_SEP = "/"


def _is_nested_model(layer: Any) -> bool:
    return isinstance(layer, keras.Model)


def _output_rank(layer: Any) -> int | None:
    """Rank of a layer's (single) output, ``None`` if it has none or several."""
    try:
        out = layer.output
    except (AttributeError, ValueError):  # not called yet, or called several times
        return None
    if isinstance(out, (list, tuple, dict)):
        return None
    return len(out.shape)


def _feature_layers(model: keras.Model, prefix: str = "") -> list[tuple[str, Any]]:
    """``(path, layer)`` of every layer with a 4-D output, in graph order, nested models
    expanded (path ``"backbone/relu"``). Input layers are left out (the image is 4-D too)."""
    found: list[tuple[str, Any]] = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        path = prefix + layer.name
        if _is_nested_model(layer):
            found += _feature_layers(layer, path + _SEP)
        elif _output_rank(layer) == 4:
            found.append((path, layer))
    return found


def last_conv_layer(model: keras.Model) -> str:
    """Path of the last layer whose output is a 4-D feature map ``(batch, h, w, channels)``.

    Nested models (the ``backbone`` layer of :func:`~chexnet_utils.model.models.build_chexnet`)
    are searched too; the path joins the names with ``/``: ``"backbone/relu"`` for
    DenseNet-121 (the ReLU after its last batch norm, i.e. the final 1024-channel feature
    map), ``"backbone/conv5_block3_out"`` for ResNet-50, ``"backbone/block4_relu"`` for
    ``small``. A top-level layer's path is its name. Raises ``ValueError`` when the model
    has no such layer.
    """
    found = _feature_layers(model)
    if not found:
        raise ValueError(f"model {model.name!r} has no layer with a 4-D (image-like) output")
    return found[-1][0]


def _resolve(model: keras.Model, layer_name: str | None) -> str:
    """A path (as :func:`last_conv_layer` returns) for ``layer_name``: ``None`` -> the last
    feature map; a path is checked; a bare name is looked up at any nesting depth."""
    found = dict(_feature_layers(model))
    if layer_name is None:
        return last_conv_layer(model)
    if layer_name in found:
        return layer_name
    matches = [p for p in found if p.rsplit(_SEP, 1)[-1] == layer_name]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise ValueError(f"layer name {layer_name!r} is ambiguous: {matches}; pass a path")
    raise ValueError(f"no layer {layer_name!r} with a 4-D output in model {model.name!r} "
                     f"(the last one is {last_conv_layer(model)!r})")


def layer_chain(model: keras.Model, path: str) -> list[Any]:
    """The models along ``path`` (``"backbone/relu"``), then the layer it names:
    ``[model, model.get_layer("backbone"), <relu layer>]``. Raises ``ValueError`` (Keras')
    for a name that is not there."""
    chain: list[Any] = [model]
    for name in path.split(_SEP):
        chain.append(chain[-1].get_layer(name))
    return chain


def find_layer(model: keras.Model, layer_name: str | None = None) -> Any:
    """The feature-map layer ``layer_name`` names (a path, or a bare name at any nesting
    depth, ``None`` for the last feature map; :func:`last_conv_layer` explains paths)."""
    return layer_chain(model, _resolve(model, layer_name))[-1]


def _grad_model(model: keras.Model, path: str) -> keras.Model:
    """A model ``image -> [feature map at path, model output]``.

    A top-level layer: ``keras.Model(model.inputs, [layer.output, model.output])``. A layer
    inside a nested model: the nested model gets a second output, and the top level is
    re-run layer by layer (it must be a chain, as :func:`build_chexnet` makes it; checked
    numerically by :func:`grad_cam`).
    """
    parts = path.split(_SEP)
    *chain, target = layer_chain(model, path)
    if len(parts) == 1:
        return keras.Model(model.inputs, [target.output, *model.outputs])

    # Nested: make the innermost model return the feature map too, then rebuild outwards.
    inner: keras.Model = keras.Model(chain[-1].inputs, [target.output, chain[-1].output])
    for depth in range(len(chain) - 2, -1, -1):
        outer, nested_name = chain[depth], parts[depth]
        inputs = [keras.Input(batch_shape=t.shape, dtype=t.dtype) for t in outer.inputs]
        if len(inputs) != 1:
            raise ValueError(f"{outer.name!r} has {len(inputs)} inputs; Grad-CAM on a nested "
                             "layer needs a single-input chain of layers")
        x: Any = inputs[0]
        feature: Any = None
        for layer in outer.layers:
            if isinstance(layer, keras.layers.InputLayer):
                continue
            if layer.name == nested_name:
                feature, x = inner(x)
            else:
                x = layer(x)
        inner = keras.Model(inputs, [feature, x])
    return inner


def grad_cam(model: keras.Model, image: np.ndarray | Any, class_index: int,
             layer_name: str | None = None, upsample: bool = True) -> np.ndarray:
    """Grad-CAM heat map of one class for one image, scaled to [0, 1].

    ``model``
        A Keras model with one image input and per-class outputs (sigmoid probabilities, as
        :func:`~chexnet_utils.model.models.build_chexnet`; softmax or logits work too).
    ``image``
        One preprocessed image ``(H, W, C)`` as the model takes it (e.g. from
        :func:`chexnet_utils.input.pipelines.new_approach` with ``training=False``), or a batch of
        one ``(1, H, W, C)``.
    ``class_index``
        Which output to explain (``PATHOLOGIES.index("Mass")``).
    ``layer_name``
        ``None``: the last 4-D feature map, found by :func:`last_conv_layer` (also inside the
        nested ``backbone``). Or a path such as ``"backbone/block2_relu"`` or a bare layer
        name that is unique in the model.
    ``upsample``
        ``True``: resize the map bilinearly to ``(H, W)``; ``False``: keep the feature map's
        ``(h, w)``.

    The score is the class's output for this image; the gradients of a sigmoid probability
    and of its logit differ only by the positive factor ``p (1 - p)``, which the scaling to
    [0, 1] removes. Returns a float32 array; all zeros when no location raises the score
    (the ReLU leaves nothing), or when the output is saturated at exactly 0 or 1 so that the
    gradient vanishes. Raises ``ValueError`` for an unknown layer or a class index out of
    range.
    """
    x = np.asarray(image, dtype=np.float32)
    if x.ndim == 3:
        x = x[None]
    if x.ndim != 4 or x.shape[0] != 1:
        raise ValueError(f"image must be (H, W, C) or (1, H, W, C), got shape {x.shape}")
    path = _resolve(model, layer_name)
    grad_model = _grad_model(model, path)
    n_out = int(model.outputs[0].shape[-1])
    if not 0 <= class_index < n_out:
        raise ValueError(f"class_index {class_index} out of range for {n_out} outputs")

    inputs = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        features, outputs = grad_model(inputs, training=False)
        score = outputs[:, class_index]
    grads = tape.gradient(score, features)
    # The rebuilt graph must compute exactly what the model computes.
    expected = np.asarray(model(inputs, training=False))
    if not np.allclose(np.asarray(outputs), expected, rtol=1e-4, atol=1e-5):
        raise ValueError(f"could not rebuild {model.name!r} around {path!r} (not a chain of "
                         "layers?); pass a top-level layer as layer_name")

    a = np.asarray(features, dtype=np.float64)[0]          # (h, w, channels)
    g = np.asarray(grads, dtype=np.float64)[0]
    weights = g.mean(axis=(0, 1))                          # alpha_k
    cam = np.maximum((a * weights).sum(axis=-1), 0.0)      # ReLU(sum_k alpha_k A_k)
    top = cam.max()
    cam = cam / top if top > 0 and np.isfinite(top) else np.zeros_like(cam)
    if upsample:
        cam = tf.image.resize(cam[..., None].astype(np.float32), x.shape[1:3],
                              method="bilinear").numpy()[..., 0]
    return np.clip(cam, 0.0, 1.0).astype(np.float32)
