"""Tests for chexnet_utils.data.synthetic: NIH layout, labels, determinism, rendering, safety."""

from __future__ import annotations

import filecmp
import json
import os
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from chexnet_utils.data import nih, synthetic
from chexnet_utils.data.labels import NO_FINDING, PATHOLOGIES, labels_to_multihot
from chexnet_utils.data.synthetic import writer

N, SIZE, SEED, PER_FOLDER = 40, 64, 7, 15


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("syn") / "chestxray"
    return synthetic.generate_dataset(out, n=N, size=SIZE, seed=SEED, workers=1,
                                      per_folder=PER_FOLDER, progress=False)


@pytest.fixture(scope="module")
def big_sample() -> list[nih.ImageRecord]:
    return synthetic.sample_records(50_000, seed=0)


def _files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


# --- layout and round trip --------------------------------------------------------------------

def test_round_trip_through_nih_loader(dataset: Path) -> None:
    ds = nih.NIHDataset.load(dataset)
    expected = synthetic.sample_records(N, seed=SEED, size=SIZE)
    assert ds.records == expected  # every field, in CSV order
    assert [r.image_index for r in ds.records] == sorted(r.image_index for r in expected)
    for got, want in zip(ds.records, expected, strict=True):
        np.testing.assert_array_equal(got.labels, labels_to_multihot(want.finding_labels))
    np.testing.assert_array_equal(ds.labels(), np.stack([r.labels for r in expected]))
    assert ds.missing_images() == []
    assert set(ds.image_paths) == {r.image_index for r in expected}


def test_images_spread_over_nih_folders(dataset: Path) -> None:
    ds = nih.NIHDataset.load(dataset)
    folders = Counter(p.parent.relative_to(dataset).as_posix() for p in ds.image_paths.values())
    assert folders == {"images_001/images": 15, "images_002/images": 15,
                       "images_003/images": 10}
    # NIH packs names in order: every name in folder k sorts before every name in folder k+1.
    names = [r.image_index for r in ds.records]
    for i, name in enumerate(names):
        assert ds.image_paths[name].parent.parent.name == f"images_{i // PER_FOLDER + 1:03d}"


def test_pngs_are_8bit_greyscale_at_requested_size(dataset: Path) -> None:
    pngs = sorted(dataset.glob("images_*/images/*.png"))
    assert len(pngs) == N
    for p in pngs:
        head = p.read_bytes()[:26]
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        assert head[24] == 8 and head[25] == 0  # bit depth 8, colour type 0 (greyscale)
        with Image.open(p) as im:
            assert im.mode == "L" and im.size == (SIZE, SIZE)
    assert not list(dataset.rglob("*.tmp"))


def test_csv_is_nih_formatted(dataset: Path) -> None:
    lines = (dataset / nih.CSV_NAME).read_text(encoding="utf-8").splitlines()
    assert lines[0] == ("Image Index,Finding Labels,Follow-up #,Patient ID,Patient Age,"
                        "Patient Gender,View Position,OriginalImage[Width,Height],"
                        "OriginalImagePixelSpacing[x,y]")
    assert len(lines) == N + 1
    assert re.fullmatch(r"\d{8}_\d{3}\.png,[A-Za-z_| ]+,\d+,\d+,\d+,[MF],(PA|AP),64,64,"
                        r"[\d.]+,[\d.]+", lines[1])


def test_marker(dataset: Path) -> None:
    marker = synthetic.read_marker(dataset)
    assert marker is not None
    assert marker["complete"] is True
    assert (marker["n"], marker["size"], marker["seed"]) == (N, SIZE, SEED)
    assert marker["version"] == synthetic.GENERATOR_VERSION
    assert marker["train_val"] + marker["test"] == N
    assert json.loads((dataset / synthetic.MARKER_NAME).read_text())["generator"] == (
        "chexnet_utils.synthetic")  # the format's name: it must not follow module moves


@pytest.mark.parametrize("generator", ["chexnet_utils.synthetic", "chexnet_utils.data.synthetic"])
def test_a_data_set_marked_by_any_version_of_the_writer_is_recognised(tmp_path, generator):
    # a data set written before (or, for a day, after) the module moved into the data wing
    (tmp_path / synthetic.MARKER_NAME).write_text(json.dumps({"generator": generator, "n": 1}))
    assert synthetic.read_marker(tmp_path) == {"generator": generator, "n": 1}
    (tmp_path / synthetic.MARKER_NAME).write_text(json.dumps({"generator": "someone-else"}))
    assert synthetic.read_marker(tmp_path) is None


# --- split lists ------------------------------------------------------------------------------

def test_split_lists_are_patient_disjoint_and_complete(dataset: Path) -> None:
    ds = nih.NIHDataset.load(dataset)
    train_val, test = ds.train_val_names, ds.test_names
    assert train_val == sorted(train_val) and test == sorted(test)
    assert set(train_val).isdisjoint(test)
    assert set(train_val) | set(test) == {r.image_index for r in ds.records}
    assert test and train_val
    by_name = {r.image_index: r for r in ds.records}
    nih.check_no_leakage({"train_val": [by_name[n] for n in train_val],
                          "test": [by_name[n] for n in test]})
    ds.split(val_fraction=0.1, seed=0).check_no_leakage()  # the loader's own split works too


def test_split_fraction_like_nih(big_sample: list[nih.ImageRecord]) -> None:
    train_val, test = synthetic.split_by_patient(big_sample, seed=0)
    assert 0.20 <= len(test) / len(big_sample) <= 0.23
    assert len(train_val) + len(test) == len(big_sample)
    owner = {r.image_index: r.patient_id for r in big_sample}
    assert {owner[n] for n in test}.isdisjoint({owner[n] for n in train_val})


# --- labels and metadata ----------------------------------------------------------------------

PREVALENCE_WINDOWS = {NO_FINDING: (0.50, 0.58), "Infiltration": (0.15, 0.20),
                      "Hernia": (0.001, 0.004)}


def test_prevalences_close_to_nih(big_sample: list[nih.ImageRecord]) -> None:
    prev = nih.class_prevalence(big_sample)
    for name, (lo, hi) in PREVALENCE_WINDOWS.items():
        assert lo <= prev[name] <= hi, (name, prev[name])
    for name in PATHOLOGIES:
        target = synthetic.TARGET_PREVALENCE[name]
        assert abs(prev[name] - target) <= max(0.15 * target, 0.0015), (name, prev[name])
    # Ordering of the common classes matches NIH's.
    assert prev["Infiltration"] > prev["Effusion"] > prev["Atelectasis"] > prev["Nodule"]


def test_multilabel_and_cooccurrence(big_sample: list[nih.ImageRecord]) -> None:
    y = np.stack([r.labels for r in big_sample]).astype(bool)
    per_row = y.sum(1)
    assert 0.10 <= (per_row >= 2).mean() <= 0.35
    assert per_row.max() >= 3
    idx = {p: i for i, p in enumerate(PATHOLOGIES)}

    def conditional(a: str, given: str) -> float:
        return float(y[y[:, idx[given]], idx[a]].mean())

    assert conditional("Atelectasis", "Effusion") > 1.5 * y[:, idx["Atelectasis"]].mean()
    assert conditional("Cardiomegaly", "Edema") > 2.0 * y[:, idx["Cardiomegaly"]].mean()
    assert conditional("Pneumothorax", "Emphysema") > 2.0 * y[:, idx["Pneumothorax"]].mean()


def test_metadata_is_nih_like(big_sample: list[nih.ImageRecord]) -> None:
    names = [r.image_index for r in big_sample]
    assert names == sorted(names) and len(set(names)) == len(names)
    by_patient: dict[int, list[int]] = {}
    for r in big_sample:
        assert r.image_index == f"{r.patient_id:08d}_{r.follow_up:03d}.png"
        by_patient.setdefault(r.patient_id, []).append(r.follow_up)
    assert sorted(by_patient) == list(range(1, len(by_patient) + 1))
    assert all(f == list(range(len(f))) for f in by_patient.values())
    counts = np.array([len(f) for f in by_patient.values()])
    assert 3.0 <= counts.mean() <= 4.2          # NIH: 112,120 / 30,805 = 3.64
    assert np.median(counts) <= 2 and counts.max() >= 30  # skewed
    ages = np.array([r.patient_age for r in big_sample])
    assert ages.min() >= 1 and ages.max() <= 95 and 40 <= ages.mean() <= 55
    assert {r.patient_gender for r in big_sample} == {"M", "F"}
    pa = np.mean([r.view_position == "PA" for r in big_sample])
    assert 0.57 <= pa <= 0.63
    assert {(r.width, r.height) for r in big_sample} == {(1024, 1024)}
    assert Counter(r.spacing_x for r in big_sample).most_common(1)[0][0] == 0.143
    small = synthetic.sample_records(200, seed=0, size=128)
    assert all(r.width == r.height == 128 and r.spacing_x == r.spacing_y for r in small)
    assert Counter(r.spacing_x for r in small).most_common(1)[0][0] == 1.144  # 0.143 * 1024/128


def test_sample_records_is_fast_deterministic_and_prefix_stable() -> None:
    a = synthetic.sample_records(2000, seed=3)
    assert a == synthetic.sample_records(2000, seed=3)
    assert a != synthetic.sample_records(2000, seed=4)
    assert synthetic.sample_records(500, seed=3) == a[:500]
    assert synthetic.sample_records(0) == []


# --- determinism and workers ------------------------------------------------------------------

def test_byte_identical_whatever_the_workers(tmp_path: Path, dataset: Path) -> None:
    out = synthetic.generate_dataset(tmp_path / "b", n=N, size=SIZE, seed=SEED, workers=2,
                                     per_folder=PER_FOLDER, progress=False, mp_context="spawn")
    assert _files(out) == _files(dataset)
    for rel in _files(dataset):
        assert filecmp.cmp(dataset / rel, out / rel, shallow=False), rel


def test_different_seed_gives_different_data(tmp_path: Path, dataset: Path) -> None:
    out = synthetic.generate_dataset(tmp_path / "c", n=N, size=SIZE, seed=SEED + 1, workers=2,
                                     per_folder=PER_FOLDER, progress=False)
    assert (out / nih.CSV_NAME).read_bytes() != (dataset / nih.CSV_NAME).read_bytes()
    first = "images_001/images/00000001_000.png"
    assert (out / first).read_bytes() != (dataset / first).read_bytes()


# --- rendering ------------------------------------------------------------------------------

def test_render_basics() -> None:
    img = synthetic.render_image([], 128, np.random.default_rng(0))
    assert img.dtype == np.uint8 and img.shape == (128, 128)
    np.testing.assert_array_equal(img, synthetic.render_image([], 128, 0))
    np.testing.assert_array_equal(img, synthetic.render_image([NO_FINDING], 128, 0))
    np.testing.assert_array_equal(img, synthetic.render_image(NO_FINDING, 128, 0))
    assert np.abs(img.astype(int) - synthetic.render_image([], 128, 1)).mean() > 2
    big = synthetic.render_image(["Mass"], 600, 0)  # rendered at 512, upscaled
    assert big.shape == (600, 600) and big.dtype == np.uint8
    vec = np.zeros(len(PATHOLOGIES), np.float32)
    vec[[1, 2]] = 1
    np.testing.assert_array_equal(synthetic.render_image(vec, 96, 5),
                                  synthetic.render_image("Cardiomegaly|Effusion", 96, 5))
    with pytest.raises(ValueError):
        synthetic.render_image(["Flu"], 64, 0)
    with pytest.raises(ValueError):
        synthetic.render_image(np.zeros(3), 64, 0)


def _mean(img: np.ndarray, x0: float, x1: float, y0: float, y1: float) -> float:
    """Mean grey level in the normalised box [x0, x1] x [y0, y1] (image coords in [-1, 1])."""
    s = img.shape[0]

    def px(v: float) -> int:
        return int(round((v + 1) / 2 * s))

    return float(img[px(y0):px(y1), px(x0):px(x1)].mean())


def test_render_looks_like_a_chest_film() -> None:
    for seed in range(5):
        img = synthetic.render_image([], 256, seed).astype(float)
        air = _mean(img, -1.0, -0.92, 0.6, 1.0)          # outside the body, lower corner
        lung_r = _mean(img, -0.5, -0.3, -0.3, 0.0)       # patient's right lung (image left)
        lung_l = _mean(img, 0.3, 0.5, -0.3, 0.0)
        mediastinum = _mean(img, -0.05, 0.05, -0.2, 0.1)
        abdomen = _mean(img, -0.4, 0.4, 0.8, 0.95)
        assert air < 50
        assert lung_r < mediastinum - 40 and lung_l < mediastinum - 40
        assert abdomen > lung_r + 40
        # The heart shadow is on the image's right (patient's left), above the diaphragm.
        assert _mean(img, 0.2, 0.35, 0.2, 0.35) > _mean(img, -0.35, -0.2, 0.2, 0.35) + 15


@pytest.mark.parametrize("pathology", PATHOLOGIES)
def test_each_sign_changes_the_image(pathology: str) -> None:
    for seed in range(3):
        rng_seed = [11, seed]
        base = synthetic.render_image([], 128, np.random.default_rng(rng_seed)).astype(int)
        sick = synthetic.render_image([pathology], 128, np.random.default_rng(rng_seed))
        diff = np.abs(sick.astype(int) - base)
        assert diff.mean() > 0.05, (pathology, seed, diff.mean())
        assert (diff > 15).sum() >= 10, (pathology, seed)  # a visible, not a noise-level change
        # The random streams do not depend on the labels: away from the sign nothing changes.
        assert (diff == 0).mean() > 0.3, (pathology, seed)


def test_same_patient_looks_alike() -> None:
    def img(image_seed: int, patient_seed: int) -> np.ndarray:
        return synthetic.render_image([], 128, image_seed, patient_rng=patient_seed).astype(int)

    same = np.abs(img(1, 100) - img(2, 100)).mean()
    other = np.abs(img(1, 100) - img(2, 200)).mean()
    assert same < other


def _features(img: np.ndarray) -> np.ndarray:
    return np.asarray(Image.fromarray(img).resize((32, 32), Image.Resampling.BILINEAR),
                      np.float32).ravel() / 255.0


@pytest.mark.parametrize("pathology", ["Cardiomegaly", "Effusion", "Emphysema"])
def test_sign_is_learnable_by_logistic_regression(pathology: str) -> None:
    """A linear model on 32x32 pixels separates images with the sign from images without."""
    n_train, n_test = 160, 80
    x, y = [], []
    for i in range(n_train + n_test):
        label = i % 2
        rng = np.random.default_rng([23, i])
        x.append(_features(synthetic.render_image([pathology] if label else [], 64, rng)))
        y.append(label)
    X, Y = np.array(x), np.array(y, float)
    mu, sd = X[:n_train].mean(0), X[:n_train].std(0) + 1e-3
    X = (X - mu) / sd
    w, b = np.zeros(X.shape[1]), 0.0
    for _ in range(300):
        p = 1 / (1 + np.exp(-(X[:n_train] @ w + b)))
        w -= 0.5 * (X[:n_train].T @ (p - Y[:n_train]) / n_train + 1e-2 * w)
        b -= 0.5 * float((p - Y[:n_train]).mean())
    accuracy = float((((X[n_train:] @ w + b) > 0) == (Y[n_train:] > 0.5)).mean())
    assert accuracy > 0.8, (pathology, accuracy)


def test_encode_png_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    img = synthetic.render_image([], 64, 0)
    target = tmp_path / "00000001_000.png"
    n = synthetic.encode_png(img, target)
    assert n == target.stat().st_size
    before = target.read_bytes()

    def broken_save(self: Image.Image, fp, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        fp.write(b"\x89PNG partial")
        raise OSError("disk full")

    monkeypatch.setattr(Image.Image, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        synthetic.encode_png(synthetic.render_image([], 64, 1), target)
    assert target.read_bytes() == before  # the old file is untouched
    with pytest.raises(OSError):
        synthetic.encode_png(img, tmp_path / "00000002_000.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000001_000.png"]


def test_full_size_image_is_nih_like() -> None:
    img = synthetic.render_image(["Effusion"], 1024, 0)
    assert img.shape == (1024, 1024)
    import io

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG", compress_level=3)
    assert 100_000 < buf.tell() < 1_000_000  # NIH's PNGs average ~400 KB


# --- safety, regeneration, resume -----------------------------------------------------------

def test_refuses_foreign_non_empty_directory(tmp_path: Path) -> None:
    foreign = tmp_path / "nih"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("my real data")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        synthetic.generate_dataset(foreign, n=5, size=32, workers=1, progress=False)
    with pytest.raises(FileExistsError):
        synthetic.ensure_dataset(foreign, n=5, size=32, workers=1, progress=False)
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    synthetic.generate_dataset(foreign, n=5, size=32, workers=1, progress=False, overwrite=True)
    assert (foreign / "notes.txt").read_text() == "my real data"
    assert len(nih.NIHDataset.load(foreign).records) == 5
    # Hidden files alone do not make a directory "non-empty".
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / ".gitkeep").write_text("")
    synthetic.generate_dataset(hidden, n=3, size=32, workers=1, progress=False)


def test_ensure_skips_matching_and_replaces_different(tmp_path: Path) -> None:
    out = tmp_path / "d"
    synthetic.ensure_dataset(out, n=12, size=32, seed=1, workers=1, per_folder=5,
                             progress=False)
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    synthetic.ensure_dataset(out, n=12, size=32, seed=1, workers=1, per_folder=5,
                             progress=False)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == stamps
    # Different parameters: regenerated, with no stale images or folders left behind.
    synthetic.ensure_dataset(out, n=4, size=32, seed=2, workers=1, per_folder=5,
                             progress=False)
    ds = nih.NIHDataset.load(out)
    assert len(ds.records) == 4 and len(ds.image_paths) == 4
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["images_001"]
    assert synthetic.read_marker(out)["seed"] == 2  # type: ignore[index]


def test_interrupted_run_leaves_no_csv_and_resumes(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "e"
    real_task = writer._render_task
    calls: list[int] = []

    def failing_task(task):  # type: ignore[no-untyped-def]
        if len(calls) == 6:
            raise KeyboardInterrupt
        calls.append(task[1])
        return real_task(task)

    monkeypatch.setattr(writer, "_render_task", failing_task)
    with pytest.raises(KeyboardInterrupt):
        synthetic.generate_dataset(out, n=10, size=32, seed=4, workers=1, progress=False)
    # Images come first; the CSV, lists and the complete marker are only written at the end.
    assert len(list(out.glob("images_*/images/*.png"))) == 6
    assert not (out / nih.CSV_NAME).exists() and not (out / nih.TEST_LIST).exists()
    assert synthetic.read_marker(out)["complete"] is False  # type: ignore[index]
    stray = out / "images_001" / "images" / ".00000009_000.png.123.tmp"
    stray.write_bytes(b"partial")
    kept = {p: p.stat().st_mtime_ns for p in out.glob("images_*/images/*.png")}

    calls.clear()
    monkeypatch.setattr(writer, "_render_task", real_task)
    synthetic.ensure_dataset(out, n=10, size=32, seed=4, workers=1, progress=False)
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # finished images were kept
    assert not stray.exists()
    fresh = synthetic.generate_dataset(tmp_path / "f", n=10, size=32, seed=4, workers=1,
                                       progress=False)
    for rel in _files(fresh):
        assert filecmp.cmp(fresh / rel, out / rel, shallow=False), rel


def test_argument_checks(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        synthetic.generate_dataset(tmp_path / "x", n=0, progress=False)
    with pytest.raises(ValueError, match="size must be >= 16, got 8"):
        synthetic.generate_dataset(tmp_path / "x", n=2, size=8, progress=False)
    with pytest.raises(ValueError, match="per_folder must be >= 1, got 0"):
        synthetic.generate_dataset(tmp_path / "x", n=2, per_folder=0, progress=False)
    with pytest.raises(ValueError, match="999"):
        synthetic.generate_dataset(tmp_path / "x", n=2000, per_folder=2, progress=False)
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        synthetic.generate_dataset(tmp_path / "file", n=2, size=32, progress=False)
    assert not (tmp_path / "x").exists()
    assert os.listdir(tmp_path) == ["file"]
