"""Gradient communication (notebook 05) with TensorFlow: gradient sizes of a built model."""

import json

from chexnet_utils import comm


def test_gradient_sizes_small_model(tmp_path):
    sizes = comm.chexnet_gradient_sizes(("small",), cache=tmp_path / "g.json")
    g = sizes["small"]
    assert g["grad_bytes"] == 4 * g["trainable_params"] == 4 * sum(g["tensor_elems"])
    assert g["trainable_params"] <= g["params"] and g["n_tensors"] == len(g["tensor_elems"])
    assert json.loads((tmp_path / "g.json").read_text())["small"]["params"] == g["params"]
