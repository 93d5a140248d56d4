"""Every bad input of issue #30 (item 6 of its "Why"), with the one-line message it gets, and
the crash-safe writes: a crafted TFRecord length, a CSV that is not UTF-8 or not CSV,
non-finite ``CHEXNET_*`` numbers, an output folder that cannot be written (found before
the long work), huge images, a checkpoint set cut short, notebooks and results written
concurrently or interrupted, symbolic links in the synthetic layout, paths that need shell
quoting, an unwritable or world-readable work folder, a bad test budget."""

from __future__ import annotations

import errno
import importlib.util
import io
import json
import multiprocessing
import os
import shlex
import shutil
import struct
import subprocess
import tracemalloc
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from chexnet_utils import config
from chexnet_utils.cli import main
from chexnet_utils.data import tfrecords as T
from chexnet_utils.data.nih import CSV_NAME, TRAIN_VAL_LIST, DataFormatError, read_data_entry
from chexnet_utils.data.tfrecords import images
from chexnet_utils.data.tfrecords.wire import read_records
from chexnet_utils.notebook import clean, results
from chexnet_utils.platform import atomic
from chexnet_utils.training import checkpoints
from tests.support import suite_times
from tests.support.datasets import image_path, make_dataset, write_records

REPO = Path(__file__).resolve().parents[2]


# --- TFRecords -------------------------------------------------------------------------------

def _crafted_length_record(length: int) -> bytes:
    """A record header claiming ``length`` bytes, with a valid CRC of that length."""
    header = struct.pack("<Q", length)
    return header + struct.pack("<I", T.masked_crc32c(header)) + b"tiny"


def test_a_crafted_record_length_is_a_value_error_naming_file_and_offset(tmp_path):
    shard = tmp_path / "train-00000-of-00001.tfrecord"
    write_records(shard, [b"first"])
    with shard.open("ab") as f:
        f.write(_crafted_length_record(2**62))  # read() would try to allocate 4 EiB
    with pytest.raises(ValueError) as info:
        list(read_records(shard))
    assert str(info.value) == (f"{shard}: truncated record at byte 21 (its length field says "
                               f"{2**62} bytes, the file has 0 left)")


def test_verify_reports_a_crafted_length_instead_of_crashing(tmp_path):
    root, _ = make_dataset(tmp_path / "data", n_train_val=8, n_test=2, size=32)
    out = tmp_path / "tfr"
    T.convert_dataset(root, out, shard_size=4, workers=1, progress=False)
    shard = T.list_shards(out, "train")[0]
    shard.write_bytes(_crafted_length_record(2**62))
    report = T.verify(out)
    assert not report.ok
    assert any(shard.name in p and "length field says" in p for p in report.problems)


# --- CSV and split lists ---------------------------------------------------------------------

def test_a_latin1_csv_names_the_file_row_and_byte(tmp_path):
    root, _ = make_dataset(tmp_path / "data", n_train_val=4, n_test=2, size=16)
    csv_path = root / CSV_NAME
    lines = csv_path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[3] = lines[3].replace(",M,", ",Mé,").replace(",F,", ",Fé,")
    csv_path.write_bytes("".join(lines).encode("latin-1"))
    with pytest.raises(DataFormatError) as info:
        read_data_entry(csv_path)
    message = str(info.value)
    assert message.startswith(f"{csv_path}, row 4: not UTF-8 text: byte 0xe9 at offset ")
    assert "iconv -f latin1 -t utf-8" in message and "\n" not in message


def test_a_field_over_the_csv_limit_is_a_data_format_error_with_the_row(tmp_path):
    root, _ = make_dataset(tmp_path / "data", n_train_val=4, n_test=2, size=16)
    csv_path = root / CSV_NAME
    lines = csv_path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[2] = lines[2].replace(",PA,", ',"' + "P" * 200_000 + '",')  # a stray quote, say
    csv_path.write_text("".join(lines), encoding="utf-8")
    with pytest.raises(DataFormatError) as info:
        read_data_entry(csv_path)
    assert str(info.value) == (f"{csv_path}, row 3: not a CSV file: field larger than field "
                               "limit (131072)")


def test_a_latin1_split_list_names_the_file_and_row(tmp_path):
    root, _ = make_dataset(tmp_path / "data", n_train_val=4, n_test=2, size=16)
    with (root / TRAIN_VAL_LIST).open("ab") as f:
        f.write("caf\xe9.png\n".encode("latin-1"))
    with pytest.raises(DataFormatError, match=rf"{TRAIN_VAL_LIST}, row 5: not UTF-8 text"):
        T.convert_dataset(root, tmp_path / "tfr", workers=1, progress=False)
    assert not (tmp_path / "tfr").exists()  # read before anything is written


# --- settings --------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "1e400"])
@pytest.mark.parametrize("var", ["CHEXNET_COMM_MAX_MB", "CHEXNET_ACCEL_MS"])
def test_non_finite_numbers_are_refused_naming_the_variable(var, raw):
    with pytest.raises(ValueError) as info:
        config.with_overrides(config.SCALES["ci"], {var: raw})
    assert str(info.value) == f"{var}={raw!r} is not a finite number"


@pytest.mark.parametrize("var, raw, says", [
    ("CHEXNET_BENCH_BATCHES", "\u0665", "is not a number (int, ASCII digits)"),   # Arabic-Indic 5
    ("CHEXNET_WORKERS", "１２", "is not a number (int, ASCII digits)"),            # full-width 12
    ("CHEXNET_WORKERS", "1000000", "is more than this setting allows (4,096)"),
    ("CHEXNET_ACCEL_MS", "1e300", "is more than this setting allows (100,000)"),
    ("CHEXNET_COMM_MAX_MB", "1e9", "is more than this setting allows"),
    ("CHEXNET_EPOCHS", "99999999", "is more than this setting allows (10,000)"),
])
def test_settings_are_ascii_and_bounded_naming_the_variable(var, raw, says):
    """Review N6: a value Python would read from other digits, or far over any real run, is
    refused where it is read, naming the variable, not in engines far away."""
    with pytest.raises(ValueError) as info:
        config.with_overrides(config.SCALES["ci"], {var: raw})
    assert str(info.value).startswith(f"{var}={raw!r} {says}")
    assert config.with_overrides(config.SCALES["ci"], {"CHEXNET_WORKERS": "4096"}).max_workers \
        == 4096


@pytest.mark.parametrize("raw", ["twenty", "nan", "inf", "0", "-5"])
def test_a_bad_test_budget_is_refused_before_the_run(raw):
    with pytest.raises(ValueError) as info:
        suite_times.budget_minutes({"CHEXNET_TEST_BUDGET_MIN": raw})
    assert str(info.value) == \
        f"CHEXNET_TEST_BUDGET_MIN={raw!r} is not a positive number of minutes"
    assert suite_times.budget_minutes({}) == 15
    assert suite_times.budget_minutes({suite_times.BUDGET_ENV: "3.5"}) == 3.5


def test_a_bad_test_budget_stops_pytest_at_start_up(monkeypatch):
    spec = importlib.util.spec_from_file_location("repo_conftest", REPO / "conftest.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    monkeypatch.setenv("CHEXNET_TEST_BUDGET_MIN", "soon")
    with pytest.raises(pytest.UsageError, match="CHEXNET_TEST_BUDGET_MIN='soon' is not a "
                                                "positive number of minutes"):
        hooks.pytest_configure(None)


def test_an_unwritable_work_dir_is_one_clear_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("CHEXNET_WORK_DIR", str(blocker / "work"))
    with pytest.raises(PermissionError) as info:
        config.work_dir()
    assert str(info.value) == (f"work folder {blocker / 'work'} cannot be created or made "
                               "private (Not a directory): set CHEXNET_WORK_DIR to a folder "
                               "you may write")


def test_the_work_dir_of_the_real_data_set_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv("CHEXNET_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.delenv("CHEXNET_DATA_DIR", raising=False)
    old = os.umask(0o022)
    try:
        assert config.work_dir().stat().st_mode & 0o777 == 0o755  # synthetic: the umask's
        monkeypatch.setenv("CHEXNET_DATA_DIR", str(tmp_path / "nih"))
        assert config.work_dir().stat().st_mode & 0o777 == 0o700  # made private
        monkeypatch.setenv("CHEXNET_WORK_DIR", str(tmp_path / "new"))
        assert config.work_dir().stat().st_mode & 0o777 == 0o700  # created private
    finally:
        os.umask(old)


# --- an output folder that cannot be written ---------------------------------------------------

def _read_only(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``folder`` read-only; as root (permissions do not apply) the file creation in it
    fails as a read-only file system would (the non-root CI leg runs the real thing)."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o555)
    if os.geteuid() == 0:
        real = atomic.create_temp

        def refuse(where, *args, **kwargs):
            if Path(where) == folder:
                raise OSError(errno.EROFS, "Read-only file system")
            return real(where, *args, **kwargs)

        monkeypatch.setattr(atomic, "create_temp", refuse)


def test_a_read_only_out_is_found_before_the_scan(tmp_path, monkeypatch, capsys):
    root, _ = make_dataset(tmp_path / "data", n_train_val=4, n_test=2, size=16)
    out = tmp_path / "ro"
    _read_only(out, monkeypatch)
    from chexnet_utils.data.tfrecords import convert

    def no_scan(*args, **kwargs):
        raise AssertionError("scanned before checking that --out can be written")

    monkeypatch.setattr(convert, "_scan", no_scan)
    try:
        code = main(["tfrecords", "--data-dir", str(root), "--out", str(out), "--workers", "1",
                     "--no-progress"])
    finally:
        out.chmod(0o755)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"error: cannot write in {out}: ") and err.count("\n") == 1
    assert "Traceback" not in err


def test_a_benchmark_json_that_cannot_be_written_fails_before_the_benchmark(
        tmp_path, monkeypatch, capsys):
    _read_only(tmp_path / "ro", monkeypatch)
    from chexnet_utils.bench import conversion

    monkeypatch.setattr(conversion, "bench_conversion",
                        lambda *a, **k: pytest.fail("benchmark ran before the --json check"))
    try:
        code = main(["bench", "conversion", "--json", str(tmp_path / "ro" / "x.json"),
                     "--data-dir", str(tmp_path)])
    finally:
        (tmp_path / "ro").chmod(0o755)
    assert code == 2
    assert capsys.readouterr().err.startswith(f"error: cannot write in {tmp_path / 'ro'}: ")


def test_an_os_error_is_one_line_naming_the_file():
    from chexnet_utils.cli import error_line

    e = PermissionError(errno.EACCES, "Permission denied", "/data/out/manifest.json")
    assert error_line(e) == "/data/out/manifest.json: Permission denied"
    assert error_line(OSError(errno.ENOSPC, "No space left on device")) == \
        "No space left on device"


# --- huge images -----------------------------------------------------------------------------

def _png_claiming(width: int, height: int) -> bytes:
    """A 16-bit grey PNG whose header claims ``width`` x ``height`` (a tiny file: nothing
    but the header is read before the size is refused)."""
    buf = io.BytesIO()
    Image.fromarray(np.zeros((1, 1), np.uint16)).save(buf, format="PNG")
    data = bytearray(buf.getvalue())
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))  # IHDR's CRC
    return bytes(data)


def test_a_huge_image_is_refused_before_it_is_decoded():
    with pytest.raises(Image.DecompressionBombError) as info:
        images.prepare_image(_png_claiming(8000, 8000), 64, "png")
    assert str(info.value) == ("8000 x 8000 pixels, more than the converter's limit of "
                               f"{images.MAX_PIXELS} "
                               "(chexnet_utils.data.tfrecords.images.MAX_PIXELS)")
    assert images.describe_error(info.value).startswith("too large: 8000 x 8000 pixels")


def test_a_huge_image_is_skipped_and_listed_by_the_converter(tmp_path):
    root, records = make_dataset(tmp_path / "data", n_train_val=4, n_test=2, size=16)
    image_path(root, records[1].image_index).write_bytes(_png_claiming(5000, 5000))
    result = T.convert_dataset(root, tmp_path / "tfr", workers=1, progress=False,
                               on_error="skip")
    assert [(s["name"], s["reason"][:29]) for s in result.skipped] == \
        [(records[1].image_index, "too large: 5000 x 5000 pixels")]


def test_worker_processes_treat_the_decompression_bomb_warning_as_an_error(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)
    with warnings.catch_warnings():
        images.limit_decoding()
        assert Image.MAX_IMAGE_PIXELS == images.MAX_PIXELS
        with pytest.raises(Image.DecompressionBombWarning):
            Image.open(io.BytesIO(_png_claiming(4097, 4097)))


def test_sixteen_bit_images_are_scaled_in_uint32_not_int64():
    a = np.full((1000, 1000), 40000, np.uint16)
    a[0, :3] = (0, 32768, 65535)
    im = Image.fromarray(a)
    tracemalloc.start()
    try:
        grey = np.asarray(images.to_grey8(im))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert grey[0, :3].tolist() == [0, 128, 255] and grey[1, 1] == 156
    assert peak < 9e6  # int64 arithmetic needed over 24 MB for these 10^6 pixels


# --- crash-safe writes -----------------------------------------------------------------------

def _fake_model_writer(text: str):
    return lambda path: Path(path).write_text(text)


def _set(ckpt: Path) -> tuple[str | None, str | None, int | None]:
    state = checkpoints.read_state(ckpt)
    best = ckpt / checkpoints.BEST_NAME
    return ((ckpt / checkpoints.LAST_NAME).read_text(),
            best.read_text() if best.exists() else None, state and state["epoch"])


@pytest.mark.parametrize("crash_at", ["saving last", "writing the commit", "renaming",
                                      "rewriting state"])
def test_a_checkpoint_set_cut_short_is_the_old_set_or_the_new_one(tmp_path, monkeypatch,
                                                                    crash_at):
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    state = {"format": checkpoints.STATE_FORMAT, "epoch": 1}
    checkpoints.write_checkpoint(ckpt, state, {checkpoints.BEST_NAME: _fake_model_writer("b1"),
                                               checkpoints.LAST_NAME: _fake_model_writer("l1")})
    assert _set(ckpt) == ("l1", "b1", 1)

    class Crash(BaseException):
        pass

    def crash(*args, **kwargs):
        raise Crash

    writers = {checkpoints.BEST_NAME: _fake_model_writer("b2"),
               checkpoints.LAST_NAME: _fake_model_writer("l2")}
    if crash_at == "saving last":
        writers[checkpoints.LAST_NAME] = crash
    elif crash_at == "writing the commit":
        monkeypatch.setattr(checkpoints, "write_json_atomic", crash)
    elif crash_at == "renaming":
        real_replace, calls = os.replace, []

        def second_replace_crashes(a, b):  # best renamed, then the crash before last
            calls.append(b)
            if str(b).endswith(checkpoints.LAST_NAME):
                raise Crash
            real_replace(a, b)

        monkeypatch.setattr(checkpoints.os, "replace", second_replace_crashes)
    else:
        real_write, writes = checkpoints.write_json_atomic, []

        def second_write_crashes(path, obj, *args, **kwargs):
            writes.append(path)
            if len(writes) == 2:
                raise Crash
            real_write(path, obj, *args, **kwargs)

        monkeypatch.setattr(checkpoints, "write_json_atomic", second_write_crashes)
    with pytest.raises(Crash):
        checkpoints.write_checkpoint(ckpt, {**state, "epoch": 2}, writers)
    monkeypatch.undo()
    committed = crash_at in ("renaming", "rewriting state")
    assert _set(ckpt) == (("l2", "b2", 2) if committed else ("l1", "b1", 1))
    checkpoints.discard_uncommitted(ckpt)
    assert sorted(p.name for p in ckpt.iterdir()) == \
        [checkpoints.BEST_NAME, checkpoints.LAST_NAME, checkpoints.STATE_NAME]
    assert "staged" not in checkpoints.read_state(ckpt)


def test_an_interrupted_nbclean_keeps_the_committed_notebook(tmp_path, monkeypatch):
    import nbformat

    nb = tmp_path / "x.ipynb"
    shutil.copy(REPO / "notebooks" / "00_environment_check.ipynb", nb)
    before = nb.read_bytes()

    def half_write(node, fp, **kwargs):
        Path(fp).write_text('{"cells": [')
        raise KeyboardInterrupt

    monkeypatch.setattr(nbformat, "write", half_write)
    with pytest.raises(KeyboardInterrupt):
        clean.clean_notebook(nb)
    assert nb.read_bytes() == before and os.listdir(tmp_path) == ["x.ipynb"]


def _record_many(args: tuple[str, str, int]) -> None:
    path, notebook, n = args
    for i in range(n):
        results.record(notebook, {f"v{i}": i}, path=Path(path))


def test_concurrent_results_records_lose_nothing(tmp_path):
    path = tmp_path / "results.json"
    # spawn, not fork: a fork of this multi-threaded pytest process can deadlock a worker on
    # a lock some thread held (seen: a serial unit run hung here in futex_wait)
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        pool.map(_record_many, [(str(path), nb, 15) for nb in ("01", "02", "03")])
    data = json.loads(path.read_text())
    assert {nb: len(v) for nb, v in data.items()} == {"01": 15, "02": 15, "03": 15}
    assert os.listdir(tmp_path) == ["results.json"]


def test_save_figure_writes_the_png_atomically(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setenv("CHEXNET_WORK_DIR", str(tmp_path))
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    path = results.save_figure(fig, "line")
    plt.close(fig)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(path.parent) == ["line.png"]


# --- symbolic links and shell strings --------------------------------------------------------

def test_the_synthetic_writer_never_deletes_through_a_linked_image_folder(tmp_path):
    from chexnet_utils.data.synthetic import generate_dataset

    real = tmp_path / "real" / "images"
    real.mkdir(parents=True)
    (real / "00000001_000.png").write_bytes(b"a real image")
    out = generate_dataset(tmp_path / "synth", n=4, size=16, workers=1, progress=False)
    shutil.rmtree(out / "images_001")
    (out / "images_001").symlink_to(real.parent)
    with pytest.raises(FileExistsError, match=r"images_001 is a symbolic link: the synthetic "
                                              "writer does not write or delete through one"):
        generate_dataset(out, n=4, size=16, workers=1, progress=False)
    assert (real / "00000001_000.png").read_bytes() == b"a real image"


def test_makefile_recipes_survive_a_checkout_path_with_a_space(tmp_path):
    """The recipes run for real, in a copy of the Makefile in ``my checkout`` with a
    ``python`` that records its calls: unquoted, the shell would look for ``.../my``."""
    checkout = tmp_path / "my checkout"
    (checkout / "scripts").mkdir(parents=True)
    (checkout / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(REPO / "Makefile", checkout)
    shutil.copy(REPO / "environment.yml", checkout)
    (checkout / "scripts" / "setup.sh").write_text("true\n")
    python = checkout / ".venv" / "bin" / "python"
    python.write_text('#!/bin/sh\nprintf "%s\\n" "$0 $*" >> "$(dirname "$0")/calls"\n')
    python.chmod(0o755)
    (checkout / "my").mkdir()
    (checkout / "my build").mkdir()
    # the copy's own .venv: not a VENV (or make's flags) inherited from a make that runs this
    # test, e.g. `make unit VENV=.venv-py310` (make python-matrix)
    env = {k: v for k, v in os.environ.items()
           if k not in ("VENV", "MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    out = subprocess.run(["make", "unit", "bench", "clean", "BUILD=my build"], cwd=checkout,
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    calls = (checkout / ".venv" / "bin" / "calls").read_text().splitlines()
    assert len(calls) == 8 and all(c.startswith(f"{python} ") for c in calls)
    assert (f"{python} -m chexnet_utils.platform.exposure private -- {python} -m chexnet_utils "
            "bench service --json my build/bench-service.json") in calls   # #46: in a namespace
    assert not (checkout / "my build").exists() and (checkout / "my").is_dir()


def test_the_netns_agent_quotes_its_paths_and_passes_the_command_as_ssh_does(tmp_path):
    from chexnet_utils.cluster.netns import TwoNodes, agent_script

    nodes = TwoNodes("cxtest", ("10.77.0.1", "10.77.0.2"), tmp_path / "a b'c")
    nodes.workdir.mkdir()
    fake = tmp_path / "bin"
    fake.mkdir()
    # `ip netns exec NS unshare --uts /bin/sh -c SCRIPT sh NAME CMD`: run SCRIPT without
    # the namespaces, with a `hostname` that only records its argument
    (fake / "ip").write_text('#!/bin/sh\nshift 5\nexec "$@"\n')
    (fake / "hostname").write_text(f'#!/bin/sh\necho "$1" > {shlex.quote(str(tmp_path))}/host\n')
    for tool in ("ip", "hostname"):
        (fake / tool).chmod(0o755)
    nodes.agent.write_text(agent_script(nodes))
    nodes.agent.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    out = subprocess.run([str(nodes.agent), "-o", "BatchMode=yes", "nodeB", "echo", '"$TMPDIR"',
                          "&&", "echo", "two  words"], env=env, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [str(nodes.tmpdir("nodeB")), "two words"]
    assert (tmp_path / "host").read_text() == "nodeB\n"


def test_the_sbatch_template_quotes_mpi_arguments_and_refuses_line_breaks():
    from chexnet_utils.cluster.slurm_engines import SlurmCluster

    mpirun = SlurmCluster(n=2, launcher="mpirun", mpi_args=["-x", "NOTE=a b"]).batch_template()
    assert mpirun.splitlines()[-1] == \
        "exec mpiexec -n {n} --bind-to none -x 'NOTE=a b' {program_and_args} --mpi"
    with pytest.raises(ValueError, match=r"sbatch option '--comment=x\\n/bin/rm -rf ~' "
                                         "contains a line break"):
        SlurmCluster(n=2, sbatch_options=["--comment=x\n/bin/rm -rf ~"]).batch_template()


def test_slurm_state_paths_slurm_conf_cannot_hold_are_refused_before_anything_is_written(
        tmp_path, monkeypatch):
    from chexnet_utils.cluster import slurm_local
    from chexnet_utils.cluster.slurm import SlurmError

    state = tmp_path / "slurm state"
    with pytest.raises(SlurmError) as info:
        slurm_local.slurm_conf(state, 1, 2, "CPUs=1")
    assert str(info.value) == (f"Slurm state folder {str(state)!r} contains whitespace, '#' "
                               "or a quote, which slurm.conf cannot hold: choose a plain path")
    monkeypatch.setattr(slurm_local.S, "slurm_missing_reason", lambda **kwargs: None)
    monkeypatch.setattr(slurm_local.LocalSlurm, "_spawn",
                        lambda *a, **k: pytest.fail("a daemon would have started"))
    with pytest.raises(SlurmError, match="cannot hold"):
        slurm_local.LocalSlurm(state).start()
    assert not state.exists()
