"""Grad-CAM (:mod:`chexnet_utils.model.explain`) on the small model, DenseNet-121 (nested backbone)
and a flat Sequential model, all at 64 px with random weights (nothing is downloaded)."""

from __future__ import annotations

import numpy as np
import pytest

from chexnet_utils.model.explain import grad_cam, last_conv_layer
from chexnet_utils.model.models import build_chexnet

keras = pytest.importorskip("keras")

PX = 64


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(PX, PX, 3)).astype(np.float32)


def _check_maps(model, image: np.ndarray, classes=range(6)) -> list[np.ndarray]:
    maps = [grad_cam(model, image, c) for c in classes]
    for m in maps:
        assert m.shape == (PX, PX) and m.dtype == np.float32
        assert m.min() >= 0.0 and m.max() <= 1.0
    non_constant = [m for m in maps if m.max() - m.min() > 1e-3]
    assert len(non_constant) >= 2, "Grad-CAM should not be flat for most classes"
    # the map depends on the class explained
    assert any(not np.allclose(non_constant[0], m, atol=1e-4) for m in non_constant[1:])
    return maps


@pytest.mark.parametrize("arch, layer", [("small", "backbone/block4_relu"),
                                         ("densenet121", "backbone/relu")])
def test_grad_cam_on_chexnet_models(arch: str, layer: str, image: np.ndarray) -> None:
    keras.utils.set_random_seed(0)
    model = build_chexnet(arch, PX)
    assert last_conv_layer(model) == layer
    maps = _check_maps(model, image)
    # the batch form gives the same map, and the raw feature-map resolution is available
    assert np.allclose(grad_cam(model, image[None], 2), maps[2], atol=1e-5)
    raw = grad_cam(model, image, 2, upsample=False)
    assert raw.shape == ((4, 4) if arch == "small" else (2, 2))
    if np.any(raw > 0):
        assert raw.max() == pytest.approx(1.0)


def test_grad_cam_layer_choice_and_errors(image: np.ndarray) -> None:
    keras.utils.set_random_seed(1)
    model = build_chexnet("small", PX)
    # a bare name is found inside the nested backbone; an earlier layer is finer
    assert grad_cam(model, image, 0, layer_name="block2_relu", upsample=False).shape == (16, 16)
    assert grad_cam(model, image, 0, layer_name="backbone/block2_relu",
                    upsample=False).shape == (16, 16)
    with pytest.raises(ValueError, match="no layer 'nope'"):
        grad_cam(model, image, 0, layer_name="nope")
    with pytest.raises(ValueError, match="no layer 'avg_pool'"):  # 2-D output: not a map
        grad_cam(model, image, 0, layer_name="avg_pool")
    with pytest.raises(ValueError, match="out of range"):
        grad_cam(model, image, 14)
    with pytest.raises(ValueError, match="image must be"):
        grad_cam(model, image[..., 0], 0)


def test_grad_cam_on_a_flat_sequential_model(image: np.ndarray) -> None:
    from chexnet_utils.bench.benchmark import probe_model

    model = probe_model(PX, seed=0)
    name = last_conv_layer(model)
    assert "/" not in name and isinstance(model.get_layer(name), keras.layers.Conv2D)
    heat = grad_cam(model, image, 3)
    assert heat.shape == (PX, PX) and 0.0 <= heat.min() and heat.max() <= 1.0


def test_find_layer_by_path_bare_name_or_last() -> None:
    from chexnet_utils.model.explain import find_layer, layer_chain

    model = build_chexnet("small", PX)
    by_path = find_layer(model, "backbone/block2_relu")
    assert by_path is model.get_layer("backbone").get_layer("block2_relu")
    assert find_layer(model, "block2_relu") is by_path          # bare name, any depth
    assert find_layer(model).name == "block4_relu"              # None: the last feature map
    chain = layer_chain(model, "backbone/block2_relu")
    assert chain[0] is model and chain[1] is model.get_layer("backbone") and chain[2] is by_path
    with pytest.raises(ValueError, match="no layer 'nope'"):
        find_layer(model, "nope")
