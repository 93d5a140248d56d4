import numpy as np
import pytest
from PIL import Image

from chexnet_utils.data.leakage import (
    image_level_split,
    patients_on_both_sides,
    same_patient_similarity,
)
from chexnet_utils.data.nih import ImageRecord, patient_split


def recs(n_patients=60, per=4):
    return [ImageRecord(f"{p:08d}_{k:03d}.png", "No Finding", k, p, 50, "M", "PA")
            for p in range(1, n_patients + 1) for k in range(per)]


def test_image_level_split_leaks_and_patient_split_does_not():
    r = recs()
    bad = patients_on_both_sides(image_level_split(r, 0.2, seed=0))
    good = patients_on_both_sides(patient_split(r, 0.1, 0.2, seed=0))
    assert bad["patients_in_both"] > 10 and bad["test_images_of_train_patients"] > 0.5
    assert good == {"patients_in_both": 0.0, "test_images_of_train_patients": 0.0}


def test_same_patient_images_are_more_alike(tmp_path):
    rng = np.random.default_rng(0)
    records, paths = recs(6, 3), {}
    for p in range(1, 7):
        base = rng.normal(128, 40, (32, 32))  # each patient: its own "anatomy"
        for k in range(3):
            img = np.clip(base + rng.normal(0, 10, base.shape), 0, 255).astype(np.uint8)
            name = f"{p:08d}_{k:03d}.png"
            Image.fromarray(img).save(tmp_path / name)
            paths[name] = tmp_path / name
    same, diff = same_patient_similarity(records, paths, n_pairs=20, size=16)
    assert same.shape == diff.shape == (20,)
    assert same.mean() > 0.7 > 0.3 > abs(diff.mean())
    with pytest.raises(ValueError):
        same_patient_similarity(recs(3, 1), {}, n_pairs=2)
