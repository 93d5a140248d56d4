"""NIH folder -> sharded TFRecords without TensorFlow: CRC-32C, the shard plan, determinism,
resume, bad input, verification and the CLI, read back with the package's pure reader.
Fixtures are tiny NIH-layout folders (tests/datasets.py); reading through tf.data is in
tests/tf/test_tfrecords.py."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from chexnet_utils.cli import main
from chexnet_utils.data import tfrecords as T
from chexnet_utils.data.nih import (
    CSV_NAME,
    TRAIN_VAL_LIST,
    DataFormatError,
    ImageRecord,
    write_data_entry,
    write_split_list,
)
from chexnet_utils.data.tfrecords import plan
from tests.support.datasets import image_path, make_dataset, read_all, shard_bytes, split_lines


@pytest.fixture
def dataset(tmp_path):
    return make_dataset(tmp_path / "data")


# --------------------------------------------------------------------------------------------
# low level: CRC-32C, record framing, Example encoding
# --------------------------------------------------------------------------------------------

def test_crc32c_known_vectors():
    # CRC-32C check value and the iSCSI test vectors of RFC 3720, appendix B.4
    assert T.CRC32C_IMPLEMENTATION == "google_crc32c"
    assert T.crc32c(b"123456789") == 0xE3069283
    assert T.crc32c(b"") == 0
    assert T.crc32c(bytes(32)) == 0x8A9136AA
    assert T.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert T.crc32c(bytes(range(32))) == 0x46DD794E
    assert T.crc32c(bytes(range(31, -1, -1))) == 0x113FDB5C


def test_module_import_does_not_import_tensorflow():
    code = ("import sys, chexnet_utils.data.tfrecords as t; "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'; "
            "print(t.CRC32C_IMPLEMENTATION)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "google_crc32c"


# --------------------------------------------------------------------------------------------
# sharding, determinism
# --------------------------------------------------------------------------------------------

def test_last_partial_shard_is_written_and_named(tmp_path):
    root, records = make_dataset(tmp_path / "data", n_train_val=10, n_test=25)
    out = tmp_path / "tfr"
    result = T.convert_dataset(root, out, shard_size=10, workers=1, progress=False)
    test_shards = T.list_shards(out, "test")
    assert [p.name for p in test_shards] == [
        "test-00000-of-00003.tfrecord", "test-00001-of-00003.tfrecord",
        "test-00002-of-00003.tfrecord"]
    assert [len(list(T.read_records(p))) for p in test_shards] == [10, 10, 5]
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s["count"] for s in manifest["shards"] if s["split"] == "test"] == [10, 10, 5]
    names = [ex["name"] for p in test_shards for ex in T.read_examples(p)]
    assert names == [r.image_index for r in records[10:]]  # contiguous blocks in CSV order
    for p in out.glob("*.tfrecord"):
        assert re.fullmatch(r"(train|val|test)-\d{5}-of-\d{5}\.tfrecord", p.name)
    assert result.counts["test"] == 25


def test_shard_mb_counts_shards_up_front(tmp_path):
    root, records = make_dataset(tmp_path / "data", n_train_val=24, n_test=40, size=32)
    out = tmp_path / "tfr"
    total = sum(image_path(root, r.image_index).stat().st_size + plan.RECORD_OVERHEAD
                for r in records[24:])
    # test part: ~17.5 targets -> 18 shards by size, rounded up to a multiple of 8 -> 24
    target_mb = total / 17.5 / 1e6
    T.convert_dataset(root, out, shard_mb=target_mb, workers=1, progress=False)
    counts = [len(list(T.read_records(p))) for p in T.list_shards(out, "test")]
    assert len(counts) == 24 and sum(counts) == 40 and max(counts) - min(counts) <= 1
    assert counts == sorted(counts, reverse=True)  # the extra images go to the first shards
    sizes = [p.stat().st_size for p in T.list_shards(out, "test")]
    assert max(sizes) <= target_mb * 1e6 * 1.3  # the target is an upper bound (+ estimate slack)
    assert T.verify(out, root).ok


# --------------------------------------------------------------------------------------------
# the default (size-based) shard plan: enough shards for file-level sharding, a multiple of 8
# --------------------------------------------------------------------------------------------

MB = 1_000_000


def fake_items(n: int, size: int, px: int, split: str = "train") -> list:
    """Planning input without files: ``n`` images of about ``size`` bytes, ``px`` square."""
    return [plan.ShardItem(f"{i + 1:08d}_000.png", split, None, (0.0,) * 14, i // 3,
                    size=size + (i * 7919) % (size // 4) - size // 8, width=px, height=px)
            for i in range(n)]




@pytest.mark.parametrize("n, expected", [(0, 0), (1, 1), (5, 5), (7, 7), (8, 8), (15, 8),
                                         (16, 8), (1500, 8)])
def test_planned_shard_count_small_splits(n, expected):
    # 30 kB images: every split here is far below one 100 MB target
    assert T.planned_shard_count(n, n * 30_000) == expected


def test_planned_shard_count_rounds_the_size_target_up_to_a_multiple_of_8():
    assert T.planned_shard_count(10_000, 800 * MB) == 8
    assert T.planned_shard_count(10_000, 801 * MB) == 16          # 9 by size -> 16
    assert T.planned_shard_count(10_000, 1601 * MB) == 24         # 17 -> 24
    assert T.planned_shard_count(10_000, 1601 * MB, shard_mb=50) == 40  # 33 -> 40
    # images bigger than the target: the most shards a multiple of 8 allows, none empty
    assert T.planned_shard_count(20, 20 * 500 * MB) == 16
    assert T.planned_shard_count(9, 9 * 500 * MB) == 8
    with pytest.raises(ValueError, match="shard_mb"):
        T.planned_shard_count(100, 1e9, shard_mb=0)


def test_default_plan_1500_images_of_256px_gets_8_shards():
    # the user story of issue 12: `synth --n 1500 --size 256` (~32 kB PNGs, ~49 MB), then
    # `tfrecords` with defaults. The old plan made one shard per split, which cannot be
    # sharded by file over 2 workers.
    items = fake_items(1500, 32_500, 256)
    counts = plan.images_per_shard(items, None, T.DEFAULT_SHARD_MB, None)
    assert len(counts) == 8 and sum(counts) == 1500 and max(counts) - min(counts) <= 1


def test_default_plan_for_the_full_nih_data_set():
    # NIH ChestX-ray14: 112,120 PNGs of 1024 px, ~42 GB (~375 kB each); the train part of
    # the patient split has ~77,900 of them, ~29 GB. Planned without writing anything.
    items = fake_items(77_872, 374_600, 1024)
    estimate = plan.estimate_bytes(items, None)
    assert 28_000 * MB < estimate < 31_000 * MB
    counts = plan.images_per_shard(items, None, T.DEFAULT_SHARD_MB, None)
    k = len(counts)
    assert k % 8 == 0 and 280 <= k <= 320  # hundreds of shards, evenly split by 1..8 workers
    assert sum(counts) == len(items) and max(counts) - min(counts) <= 1
    assert 90 * MB <= estimate / k <= 100 * MB  # ~100 MB each, never above the target
    # resized to 224 px at conversion time: ~21x less data, still a multiple of 8
    small = plan.images_per_shard(items, None, T.DEFAULT_SHARD_MB, 224)
    assert len(small) == 16 and sum(small) == len(items)
    # the whole data set: every split a multiple of 8
    for n in (8_652, 25_596):  # val, test
        assert len(plan.images_per_shard(fake_items(n, 374_600, 1024), None, 100.0, None)) % 8 == 0
    # an explicit shard_size is taken as given: no rounding
    assert len(plan.images_per_shard(items, 1000, 100.0, None)) == 78


def test_default_plan_on_a_small_data_set(tmp_path):
    root, records = make_dataset(tmp_path / "data", n_train_val=24, n_test=5, size=32)
    out = tmp_path / "tfr"
    result = T.convert_dataset(root, out, workers=1, progress=False)
    per_shard = {p: [len(list(T.read_records(f))) for f in T.list_shards(out, p)]
                 for p in T.SPLITS}
    assert per_shard["test"] == [1] * 5              # fewer than 8 images: one shard each
    assert 0 < result.counts["val"] < 8 and per_shard["val"] == [1] * result.counts["val"]
    assert result.counts["train"] >= 8 and len(per_shard["train"]) == 8
    assert sum(map(sum, per_shard.values())) == len(records)
    assert T.verify(out, root).ok
    lines = split_lines(result.summary())
    assert lines["train"] == (f"  train {result.counts['train']} images in 8 shard(s) "
                              "(divisible among 1, 2, 4, 8 workers)")
    assert lines["test"].endswith("5 shard(s) (divisible among 1 worker only; file-level "
                                  "sharding over at most 5 workers)")
    assert result.manifest["params"]["shard_multiple"] == 8
    # the plan does not depend on the worker count, and a rerun keeps every shard
    T.convert_dataset(root, tmp_path / "tfr2", workers=2, progress=False)
    assert shard_bytes(out) == shard_bytes(tmp_path / "tfr2")
    again = T.convert_dataset(root, out, workers=1, progress=False)
    assert again.written_shards == 0 and again.reused_shards == 5 + 8 + result.counts["val"]


def test_old_default_plan_folder_is_refused_with_a_clear_message(dataset, tmp_path, capsys):
    root, _ = dataset
    out = tmp_path / "tfr"
    T.convert_dataset(root, out, workers=1, progress=False)
    path = out / T.MANIFEST_NAME
    manifest = json.loads(path.read_text())
    del manifest["params"]["shard_multiple"]  # as written by the versions before the rule
    path.write_text(json.dumps(manifest))
    with pytest.raises(T.ConversionError,
                       match=r"shard_multiple: None -> 8\) \(it was made by an older version.*"
                             r"multiple of 8.*overwrite"):
        T.convert_dataset(root, out, workers=1, progress=False)
    args = ["tfrecords", "--data-dir", str(root), "--out", str(out), "--workers", "1",
            "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "older version" in err and "--overwrite" in err
    assert main([*args, "--overwrite"]) == 0
    assert T.verify(out, root).ok
    assert T.load_manifest(out)["params"]["shard_multiple"] == 8


def test_old_shard_size_folder_is_still_reused(dataset, tmp_path):
    # the notebooks' ci/workstation conversions name shard_size; their plan did not change,
    # so a folder written before the rule (no shard_multiple) is kept as it is
    root, _ = dataset
    out = tmp_path / "tfr"
    first = T.convert_dataset(root, out, shard_size=6, workers=1, progress=False)
    path = out / T.MANIFEST_NAME
    manifest = json.loads(path.read_text())
    del manifest["params"]["shard_multiple"]
    path.write_text(json.dumps(manifest))
    again = T.convert_dataset(root, out, shard_size=6, workers=1, progress=False)
    assert again.written_shards == 0 and again.reused_shards == len(first.manifest["shards"])
    # a default conversion into that folder is refused, naming the parameters (no old-plan hint)
    with pytest.raises(T.ConversionError, match="shard_size: 6 -> None") as err:
        T.convert_dataset(root, out, workers=1, progress=False)
    assert "older version" not in str(err.value)


def test_byte_identical_across_runs_and_worker_counts(dataset, tmp_path):
    root, _ = dataset
    kw = dict(shard_size=6, image_size=48, progress=False)  # re-encode path
    T.convert_dataset(root, tmp_path / "a", workers=1, **kw)
    T.convert_dataset(root, tmp_path / "b", workers=1, **kw)
    T.convert_dataset(root, tmp_path / "c", workers=2, **kw)
    a = shard_bytes(tmp_path / "a")
    assert len(a) >= 5
    assert a == shard_bytes(tmp_path / "b") == shard_bytes(tmp_path / "c")
    # pass-through path, too, and the manifest records the same checksums
    T.convert_dataset(root, tmp_path / "d", workers=1, shard_size=6, progress=False)
    T.convert_dataset(root, tmp_path / "e", workers=2, shard_size=6, progress=False)
    assert shard_bytes(tmp_path / "d") == shard_bytes(tmp_path / "e")
    md = json.loads((tmp_path / "d" / "manifest.json").read_text())
    me = json.loads((tmp_path / "e" / "manifest.json").read_text())
    assert md["shards"] == me["shards"]


# --------------------------------------------------------------------------------------------
# resume and parameter changes
# --------------------------------------------------------------------------------------------

def test_resume_after_crash_gives_identical_output(dataset, tmp_path, monkeypatch):
    root, records = dataset
    kw = dict(shard_size=5, workers=1, progress=False)
    reference = tmp_path / "ref"
    T.convert_dataset(root, reference, **kw)

    out = tmp_path / "tfr"
    real = T.convert._write_shard
    calls = []

    def dying(task, progress=None):
        if len(calls) == 2:
            # leave a half-written temporary file behind, as a SIGKILL would
            (Path(task["out_dir"]) / f"{task['file']}.tmp-99999").write_bytes(b"partial")
            raise KeyboardInterrupt("killed")
        calls.append(task["file"])
        return real(task, progress)

    monkeypatch.setattr(T.convert, "_write_shard", dying)
    with pytest.raises(KeyboardInterrupt):
        T.convert_dataset(root, out, **kw)
    manifest = json.loads((out / "manifest.json").read_text())
    assert not manifest["complete"]
    assert [s["file"] for s in manifest["shards"] if s["done"]] == calls
    assert not T.verify(out).ok
    with pytest.raises(ValueError, match="complete set"):
        T.list_shards(out, "train")

    monkeypatch.setattr(T.convert, "_write_shard", real)
    (out / "train-00000-of-00004.tfrecord.tmp-12345").write_bytes(b"stray")
    result = T.convert_dataset(root, out, **kw)
    assert result.reused_shards == 2
    assert result.written_shards == len(result.manifest["shards"]) - 2
    assert not list(out.glob("*.tmp-*"))
    assert shard_bytes(out) == shard_bytes(reference)
    report = T.verify(out, root)
    assert report.ok, report.problems
    assert report.records == len(records)

    # a damaged kept shard is rewritten on the next run, not trusted
    victim = out / calls[0]
    victim.write_bytes(victim.read_bytes()[:-1] + b"\x00")
    result = T.convert_dataset(root, out, **kw)
    assert result.written_shards == 1 and shard_bytes(out) == shard_bytes(reference)


KILLABLE = """
import json, os, sys, time
from chexnet_utils.data import tfrecords as T
real = T.convert._write_shard
manifest = os.path.join(sys.argv[2], "manifest.json")

def a_shard_is_done():
    try:
        with open(manifest) as f:
            return any(s["done"] for s in json.load(f)["shards"])
    except (OSError, ValueError, KeyError):
        return False

def slow(task, progress=None):
    def tick(n):  # after each image: once a shard is finished, stop mid-shard and say so
        if a_shard_is_done():
            print("ready", flush=True)
            time.sleep(600)  # killed here, halfway through this shard's temporary file
    return real(task, tick)

T.convert._write_shard = slow
T.convert_dataset(sys.argv[1], sys.argv[2], shard_size=4, workers=1, progress=False)
"""


def test_resume_after_sigkill(dataset, tmp_path):
    import select
    import signal

    root, records = dataset
    reference = tmp_path / "ref"
    T.convert_dataset(root, reference, shard_size=4, workers=1, progress=False)
    out = tmp_path / "tfr"
    proc = subprocess.Popen([sys.executable, "-c", KILLABLE, str(root), str(out)],
                            stdout=subprocess.PIPE, text=True)
    try:
        # the handshake: the child says "ready" once a shard is done and the next one begun
        assert select.select([proc.stdout], [], [], 60)[0], "no handshake within 60 s"
        assert proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert list(out.glob("*.tmp-*")), "killed halfway through a shard"
    manifest = json.loads((out / "manifest.json").read_text())
    finished = [s["file"] for s in manifest["shards"] if s["done"]]
    assert not manifest["complete"] and 1 <= len(finished) < len(manifest["shards"])

    result = T.convert_dataset(root, out, shard_size=4, workers=2, progress=False)
    assert result.reused_shards == len(finished)
    assert not list(out.glob("*.tmp-*"))
    assert shard_bytes(out) == shard_bytes(reference)
    report = T.verify(out, root)
    assert report.ok and report.records == len(records), report.problems


def test_different_parameters_refused_unless_overwrite(dataset, tmp_path):
    root, _ = dataset
    out = tmp_path / "tfr"
    T.convert_dataset(root, out, shard_size=10, workers=1, progress=False)
    with pytest.raises(T.ConversionError, match="image_size"):
        T.convert_dataset(root, out, shard_size=10, image_size=32, workers=1, progress=False)
    with pytest.raises(T.ConversionError, match="shard_size"):
        T.convert_dataset(root, out, shard_size=4, workers=1, progress=False)
    result = T.convert_dataset(root, out, shard_size=4, image_size=32, workers=1,
                               progress=False, overwrite=True)
    assert result.written_shards == len(result.manifest["shards"])
    assert all(len(list(T.read_records(p))) <= 4 for p in out.glob("*.tfrecord"))
    assert T.verify(out, root).ok
    # same parameters again: nothing to do
    again = T.convert_dataset(root, out, shard_size=4, image_size=32, workers=1,
                              progress=False)
    assert again.written_shards == 0 and again.images_written == 0


def test_shards_without_manifest_are_not_clobbered(dataset, tmp_path):
    root, _ = dataset
    out = tmp_path / "tfr"
    out.mkdir()
    (out / "train-00000-of-00001.tfrecord").write_bytes(b"someone else's")
    with pytest.raises(T.ConversionError, match="no manifest"):
        T.convert_dataset(root, out, workers=1, progress=False)


# --------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------

def _damage(root: Path, records: list[ImageRecord], case: str) -> str:
    """Break one image (in the train_val part) the way ``case`` says; returns its name."""
    name = records[3].image_index
    path = image_path(root, name)
    data = path.read_bytes()
    if case == "missing_file":
        path.unlink()
    elif case == "csv_row_without_image":
        name = "00099999_000.png"  # a CSV row whose image was never unpacked
        extra = ImageRecord(name, "Mass", 0, 99999, 40, "F", "PA", 64, 64, 0.1, 0.1)
        write_data_entry(root / CSV_NAME, [*records, extra])
        names = [r.image_index for r in records[:24]] + [name]
        write_split_list(root / TRAIN_VAL_LIST, names)
    elif case == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif case == "no_iend":
        path.write_bytes(data[:-12])  # pixels complete, end of file lost
    elif case == "garbage":
        path.write_bytes(os.urandom(len(data)))
    else:
        raise AssertionError(case)
    return name


BAD_CASES = ["missing_file", "csv_row_without_image", "truncated", "no_iend", "garbage"]


REASONS = {"missing_file": "missing", "csv_row_without_image": "missing",
           "truncated": "truncated", "no_iend": "truncated|corrupt", "garbage": "unreadable"}


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_image_fails_naming_the_file(tmp_path, case):
    root, records = make_dataset(tmp_path / "data")
    name = _damage(root, records, case)
    with pytest.raises(T.ConversionError) as err:
        T.convert_dataset(root, tmp_path / "tfr", shard_size=5, workers=1, progress=False)
    assert name in str(err.value)
    assert re.search(REASONS[case], str(err.value))


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_image_skipped_and_listed(tmp_path, case):
    root, records = make_dataset(tmp_path / "data")
    name = _damage(root, records, case)
    out = tmp_path / "tfr"
    result = T.convert_dataset(root, out, shard_size=5, workers=1, on_error="skip",
                               progress=False)
    skipped = json.loads((out / "skipped.json").read_text())["skipped"]
    assert [s["name"] for s in skipped] == [name]
    assert re.search(REASONS[case], skipped[0]["reason"])
    assert name in (out / "skipped.txt").read_text()
    found = read_all(out)
    expected = {r.image_index for r in records} - {name}
    assert set(found) == expected  # nothing else lost
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num_skipped"] == 1 and manifest["num_images"] == len(expected)
    assert sum(s["count"] for s in manifest["shards"]) == len(expected)
    assert result.skipped[0]["name"] == name
    report = T.verify(out, root)
    assert report.ok, report.problems


def test_skip_validation_in_parallel_matches_serial(tmp_path):
    root, records = make_dataset(tmp_path / "data")
    _damage(root, records, "truncated")
    kw = dict(shard_size=5, on_error="skip", progress=False)
    T.convert_dataset(root, tmp_path / "a", workers=1, **kw)
    T.convert_dataset(root, tmp_path / "b", workers=2, **kw)
    assert shard_bytes(tmp_path / "a") == shard_bytes(tmp_path / "b")
    assert (tmp_path / "a" / "skipped.json").read_text() == \
        (tmp_path / "b" / "skipped.json").read_text()


def test_bad_image_fails_in_a_worker_process(tmp_path):
    root, records = make_dataset(tmp_path / "data")
    name = _damage(root, records, "truncated")
    with pytest.raises(T.ConversionError, match=re.escape(name)):
        T.convert_dataset(root, tmp_path / "tfr", shard_size=5, workers=2, progress=False)
    assert not list((tmp_path / "tfr").glob("*.tmp-*"))


def _convertible(path: Path, case: str) -> np.ndarray:
    """Rewrite ``path`` as RGBA / 16-bit / RGB; returns the 8-bit grey pixels expected."""
    grey = np.asarray(Image.open(path))
    if case == "rgba":
        rgb = np.stack([grey, np.roll(grey, 1, axis=1), 255 - grey], axis=-1)
        alpha = np.full(grey.shape + (1,), 200, np.uint8)
        Image.fromarray(np.concatenate([rgb, alpha], -1), mode="RGBA").save(path)
        return np.asarray(Image.fromarray(rgb, mode="RGB").convert("L"))
    if case == "rgb":
        rgb = np.stack([grey, np.roll(grey, 1, axis=0), grey // 2], axis=-1)
        Image.fromarray(rgb, mode="RGB").save(path)
        return np.asarray(Image.fromarray(rgb, mode="RGB").convert("L"))
    if case == "i16":
        wide = grey.astype(np.uint16) * 257 + np.arange(grey.size, dtype=np.uint16).reshape(
            grey.shape) % 200
        Image.fromarray(wide).save(path)  # a 16-bit greyscale PNG
        with Image.open(path) as im:
            assert im.mode == "I;16"
        return ((wide.astype(np.int64) * 255 + 32767) // 65535).astype(np.uint8)
    raise AssertionError(case)


@pytest.mark.parametrize("on_error", ["fail", "skip"])
@pytest.mark.parametrize("case", ["rgba", "i16", "rgb"])
def test_colour_and_16_bit_images_are_converted(tmp_path, case, on_error):
    root, records = make_dataset(tmp_path / "data")
    name = records[5].image_index
    expected = _convertible(image_path(root, name), case)
    out = tmp_path / "tfr"
    result = T.convert_dataset(root, out, shard_size=8, workers=1, on_error=on_error,
                               progress=False)
    assert result.skipped == []
    found = read_all(out)
    assert len(found) == len(records)
    with Image.open(io.BytesIO(found[name]["image_bytes"])) as im:
        assert im.format == "PNG" and im.mode == "L"
        np.testing.assert_array_equal(np.asarray(im), expected)
    if case == "i16":  # scaled to the full 8-bit range, not clipped to white
        assert 0 < expected.mean() < 250
    # the untouched neighbours keep their original bytes
    other = records[6].image_index
    assert found[other]["image_bytes"] == image_path(root, other).read_bytes()


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_unknown_label_in_csv_is_always_fatal(tmp_path, on_error):
    root, records = make_dataset(tmp_path / "data")
    bad = list(records)
    bad[4] = ImageRecord(bad[4].image_index, "Cardiomegaly|Pneumonitis", 0, bad[4].patient_id,
                         40, "M", "PA")
    write_data_entry(root / CSV_NAME, bad)
    with pytest.raises(DataFormatError) as err:
        T.convert_dataset(root, tmp_path / "tfr", workers=1, on_error=on_error, progress=False)
    msg = str(err.value)
    assert CSV_NAME in msg and "row 6" in msg and "Pneumonitis" in msg


# --------------------------------------------------------------------------------------------
# verify
# --------------------------------------------------------------------------------------------

def test_verify_detects_tampering_and_missing_shards(dataset, tmp_path):
    root, records = dataset
    out = tmp_path / "tfr"
    T.convert_dataset(root, out, shard_size=5, workers=1, progress=False)
    report = T.verify(out, root, decode_images=True)
    assert report.ok and report.records == len(records) and "OK" in str(report)

    shard = T.list_shards(out, "train")[1]
    original = shard.read_bytes()
    raw = bytearray(original)
    raw[len(raw) // 2] ^= 0x01  # one bit inside an image
    shard.write_bytes(bytes(raw))
    report = T.verify(out)
    assert not report.ok
    assert any(shard.name in p and "sha256" in p for p in report.problems)
    assert any("CRC" in p for p in report.problems)

    shard.write_bytes(original)
    assert T.verify(out).ok
    shard.unlink()
    report = T.verify(out, root)
    assert not report.ok
    assert any(shard.name in p and "missing" in p for p in report.problems)
    assert any("not in any shard" in p for p in report.problems)

    shard.write_bytes(original)
    (out / "train-00000-of-00099.tfrecord").write_bytes(b"")
    report = T.verify(out)
    assert any("not in the manifest" in p for p in report.problems)


def test_verify_detects_label_mismatch_with_source(dataset, tmp_path):
    root, records = dataset
    out = tmp_path / "tfr"
    T.convert_dataset(root, out, shard_size=50, workers=1, progress=False)
    changed = list(records)
    r = changed[2]
    changed[2] = ImageRecord(r.image_index, "Emphysema", r.follow_up, r.patient_id,
                             r.patient_age, r.patient_gender, r.view_position)
    write_data_entry(root / CSV_NAME, changed)
    report = T.verify(out, root)
    assert not report.ok
    assert any(r.image_index in p and "label" in p for p in report.problems)


def test_verify_without_manifest(tmp_path):
    report = T.verify(tmp_path)
    assert not report.ok and "manifest" in report.problems[0]


@pytest.mark.parametrize("fmt", ["chexnet_utils.tfrecords", "chexnet_utils.data.tfrecords"])
def test_a_manifest_of_any_version_of_the_converter_loads(tmp_path, fmt):
    # the format's name, not a module path: conversions written before (or, for a day, after)
    # the module moved into the data wing are this converter's
    assert T.FORMAT == "chexnet_utils.tfrecords"
    (tmp_path / T.MANIFEST_NAME).write_text(json.dumps({"format": fmt, "shards": []}))
    assert T.load_manifest(tmp_path)["format"] == fmt
    (tmp_path / T.MANIFEST_NAME).write_text(json.dumps({"format": "other.tool"}))
    with pytest.raises(T.ConversionError, match="not a manifest"):
        T.load_manifest(tmp_path)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------

def test_cli_tfrecords_and_verify(dataset, tmp_path, capsys):
    root, records = dataset
    out = tmp_path / "tfr"
    assert main(["tfrecords", "--data-dir", str(root), "--out", str(out), "--shard-size", "6",
                 "--workers", "1", "--no-progress"]) == 0
    assert f"{len(records)} images" in capsys.readouterr().out
    assert main(["verify", "--tfrecords", str(out), "--data-dir", str(root)]) == 0
    assert "OK" in capsys.readouterr().out

    shard = T.list_shards(out, "test")[0]
    raw = bytearray(shard.read_bytes())
    raw[-10] ^= 0xFF
    shard.write_bytes(bytes(raw))
    assert main(["verify", "--tfrecords", str(out)]) == 1
    assert shard.name in capsys.readouterr().out

    # different parameters into the same folder: exit 2 with a message
    assert main(["tfrecords", "--data-dir", str(root), "--out", str(out), "--shard-mb", "1",
                 "--workers", "1", "--no-progress"]) == 2
    assert "overwrite" in capsys.readouterr().err
    assert main(["tfrecords", "--data-dir", str(root), "--out", str(out), "--image-size", "32",
                 "--encoding", "jpeg", "--workers", "1", "--no-progress", "--overwrite"]) == 0
    assert main(["verify", "--tfrecords", str(out), "--data-dir", str(root), "--decode"]) == 0


def test_cli_bad_image_exit_codes(tmp_path, capsys):
    root, records = make_dataset(tmp_path / "data")
    name = _damage(root, records, "garbage")
    out = tmp_path / "tfr"
    args = ["tfrecords", "--data-dir", str(root), "--out", str(out), "--workers", "1",
            "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and name in err
    assert main([*args, "--on-error", "skip"]) == 0
    assert "skipped" in capsys.readouterr().out
    assert main(["verify", "--tfrecords", str(out), "--data-dir", str(root)]) == 0
    with pytest.raises(SystemExit):
        main(["tfrecords", "--data-dir", str(root), "--out", str(out), "--shard-size", "3",
              "--shard-mb", "2"])


def test_cli_as_module_with_worker_processes(dataset, tmp_path):
    # spawn-started workers must not re-run ``python -m chexnet_utils``'s __main__
    root, records = dataset
    out = tmp_path / "tfr"
    run = [sys.executable, "-m", "chexnet_utils"]
    done = subprocess.run([*run, "tfrecords", "--data-dir", str(root), "--out", str(out),
                           "--workers", "2", "--shard-size", "8", "--no-progress"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("images (") == 1
    done = subprocess.run([*run, "verify", "--tfrecords", str(out), "--data-dir", str(root)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_list_shards(tmp_path):
    assert T.list_shards(tmp_path, "val") == []
    for i in (1, 0, 2):
        (tmp_path / T.shard_name("val", i, 3)).write_bytes(b"")
    (tmp_path / "validation-00000-of-00001.tfrecord").write_bytes(b"")
    assert [p.name for p in T.list_shards(tmp_path, "val")] == [
        f"val-0000{i}-of-00003.tfrecord" for i in range(3)]
    (tmp_path / T.shard_name("val", 0, 5)).write_bytes(b"")
    with pytest.raises(ValueError, match="complete set"):
        T.list_shards(tmp_path, "val")
    with pytest.raises(FileNotFoundError):
        T.list_shards(tmp_path / "nope", "val")


def test_bench_conversion_cli_reports_every_setting(tmp_path, monkeypatch):
    from chexnet_utils.cli import main

    data = tmp_path / "data"
    make_dataset(data, n_train_val=8, n_test=4, size=32)
    monkeypatch.setenv("CHEXNET_WORK_DIR", str(tmp_path / "work"))
    out = tmp_path / "bench.json"
    assert main(["bench", "conversion", "--data-dir", str(data), "--json", str(out),
                 "--image-sizes", "original,32", "--workers", "1,2", "--repeats", "1",
                 "--shard-size", "4", "--no-progress"]) == 0
    r = json.loads(out.read_text())
    assert set(r["runs"]) == {"original", "32"}
    for run in r["runs"].values():
        assert set(run["mean_img_per_s"]) == {"1", "2"}
        assert all(v > 0 for v in run["mean_img_per_s"].values())
        assert run["speedup"] > 0
    # every temporary conversion was removed
    assert list((tmp_path / "work").iterdir()) == []


def test_conversion_throughput_figures_table_and_json_layout():
    """The means and the speed-up are computed from the runs (last worker count over the
    first); the table is what ``bench conversion`` prints; ``as_dict()`` keeps the JSON
    layout of the results written before the dataclass (worker counts as strings)."""
    from chexnet_utils.bench.conversion import ConversionRuns, ConversionThroughput
    from chexnet_utils.platform.atomic import json_safe

    runs = ConversionRuns({1: [40.0, 60.0], 2: [90.0, 110.0]})
    assert runs.mean_img_per_s == {1: 50.0, 2: 100.0} and runs.speedup == 2.0
    r = ConversionThroughput(cores=2, workers=[1, 2], repeats=2, shard_size=32, data_dir="d",
                             n_images=12, runs={"original": runs})
    assert str(r).splitlines() == [
        "conversion of 12 images, 2 cores, 2 repeats (images/s, whole call):",
        "  image size original:  1 worker(s):    50.0  2 worker(s):   100.0   speed-up 2.00x"]
    assert json.loads(json.dumps(json_safe(r))) == {
        "cores": 2, "workers": [1, 2], "repeats": 2, "shard_size": 32, "data_dir": "d",
        "n_images": 12, "runs": {"original": {
            "img_per_s": {"1": [40.0, 60.0], "2": [90.0, 110.0]},
            "mean_img_per_s": {"1": 50.0, "2": 100.0}, "speedup": 2.0}}}


def test_two_processes_preparing_the_same_tfrecords_take_turns(tmp_path):
    """Two notebooks opened at once both call prepare_tfrecords (no TensorFlow: the data set
    and the shards are written by this package): the second waits for the first (it says
    so) and then finds the data set and the conversion made; one complete conversion
    results. Made deterministic by holding the data folder's lock first."""
    import time

    from chexnet_utils.platform.atomic import folder_lock

    data = tmp_path / "synthetic-locktest"
    data.mkdir()
    script = (
        "from pathlib import Path\n"
        "import chexnet_utils.data.prepare as D\n"
        "from chexnet_utils.config import Scale\n"
        f"D.data_dir = lambda s=None: Path({str(data)!r})\n"
        "s = Scale('locktest', n_images=40, source_size=64, image_size=32, arch='small',\n"
        "          batch_size=8, epochs=1, max_workers=1, shard_size=8)\n"
        "out = D.prepare_tfrecords(image_size=32, s=s, workers=1, progress=False)\n"
        "print('done', out, flush=True)\n")
    env = {**os.environ, "CHEXNET_WORK_DIR": str(tmp_path / "work")}
    env.pop("CHEXNET_DATA_DIR", None)
    logs = [tmp_path / f"p{i}.txt" for i in range(2)]
    with folder_lock(data):  # a third preparer holds the data folder: both must wait
        procs = []
        for log in logs:
            with log.open("w") as out:  # the child keeps its own copy of the descriptor
                procs.append(subprocess.Popen([sys.executable, "-c", script], env=env,
                                              stdout=out, stderr=subprocess.STDOUT,
                                              cwd=Path(__file__).resolve().parents[2]))
        deadline = time.monotonic() + 120
        while not all("waiting for another process that prepares" in log.read_text()
                      for log in logs):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                [log.read_text()[-2000:] for log in logs]
            time.sleep(0.1)
    for p, log in zip(procs, logs, strict=True):
        assert p.wait(timeout=300) == 0, log.read_text()[-3000:]
    outs = [log.read_text() for log in logs]
    assert all(f"done {tmp_path / 'work' / 'tfrecords-32'}" in o for o in outs), outs
    manifest = T.load_manifest(tmp_path / "work" / "tfrecords-32")
    assert manifest["complete"] is True and manifest["num_images"] == 40
    assert not [p for p in (tmp_path / "work" / "tfrecords-32").rglob("*.tmp")]
