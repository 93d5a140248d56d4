"""#46 item 3: a shard whose first record announces 2**62 bytes (with a valid length CRC).
TensorFlow's own reader dies on it with a signal; ``train``, ``bench pipelines``, ``verify``
and the pipelines the notebooks build each stop with one line naming the shard and an exit
code, and nothing of the training run is lost."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from chexnet_utils.data.tfrecords import list_shards
from chexnet_utils.data.tfrecords.wire import ShardFramingError, masked_crc32c


@pytest.fixture
def crafted(tiny_tfrecords: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the tiny TFRecords with its first train shard replaced: (folder, shard)."""
    folder = tmp_path / "tfrecords"
    shutil.copytree(tiny_tfrecords, folder)
    shard = list_shards(folder, "train")[0]
    head = struct.pack("<Q", 2 ** 62)
    shard.write_bytes(head + struct.pack("<I", masked_crc32c(head)) + b"\0" * 4096)
    return folder, shard


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          check=False)


def test_tensorflow_itself_dies_with_a_signal(crafted: tuple[Path, Path]) -> None:
    """Why the check exists (TensorFlow 2.21): its reader trusts the length field."""
    proc = run("-c", "import sys, tensorflow as tf\n"
               "for r in tf.data.TFRecordDataset(sys.argv[1]): pass", str(crafted[1]))
    assert proc.returncode < 0, f"TensorFlow read it without a signal: {proc.returncode}"


@pytest.mark.parametrize("command", [
    ["train", "--arch", "small", "--image-size", "32", "--batch-size", "8", "--epochs", "1"],
    ["bench", "pipelines", "--image-size", "32", "--batches", "2", "--repeats", "1"],
    ["verify"],
], ids=lambda c: c[0] if c[0] != "bench" else "bench pipelines")
def test_each_command_stops_with_one_line_naming_the_shard(crafted: tuple[Path, Path],
                                                           tmp_path: Path,
                                                           command: list[str]) -> None:
    folder, shard = crafted
    out = {"train": ["--out", str(tmp_path / "run")], "verify": [],
           "bench": ["--json", str(tmp_path / "bench.json")]}[command[0]]
    proc = run("-m", "chexnet_utils", *command, "--tfrecords", str(folder), *out)
    assert proc.returncode in (1, 2), (proc.returncode, proc.stderr[-2000:])
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if shard.name in line]
    assert any("truncated record at byte 0" in line for line in said), proc.stdout + proc.stderr
    if command[0] != "verify":  # verify lists every problem it finds; the others stop at one
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and shard.name in errors[0], proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
        written = [p for p in tmp_path.glob("run/**/*") if p.is_file()]
        assert written == [] and not (tmp_path / "bench.json").exists(), written


def test_the_notebooks_pipelines_raise_before_tensorflow_reads(crafted: tuple[Path, Path]
                                                               ) -> None:
    from chexnet_utils.input.pipelines import new_approach, old_approach

    folder, shard = crafted
    for build in (new_approach, old_approach):
        with pytest.raises(ShardFramingError, match=f"{shard.name}: truncated record at byte 0"):
            build(list_shards(folder, "train"), 8, 32, training=True)
