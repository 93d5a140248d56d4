"""The typed results of ``bench pipelines`` and ``bench service`` (issue #28 item 4):
:class:`~chexnet_utils.bench.benchmark.PipelinesResult`,
:class:`~chexnet_utils.bench.throughput.DecodeCeiling` and
:class:`~chexnet_utils.bench.service.ServiceResult` built from known numbers: their derived
figures, their tables, their JSON (the keys of the former dicts), and the two commands that
print and write them. No TensorFlow: the measurements themselves are in tests/tf."""

from __future__ import annotations

import json
import math
import subprocess
from typing import Any

import pytest

from chexnet_utils.bench.benchmark import PipelinesResult
from chexnet_utils.bench.service import ServiceResult
from chexnet_utils.bench.throughput import DecodeCeiling
from chexnet_utils.cli import main
from chexnet_utils.platform.atomic import json_safe

# The keys of the dicts bench_service and bench_pipelines returned before they were typed
# (a saved bench-*.json reads the same).
SERVICE_KEYS = {
    "compute_img_per_s", "decode_img_per_s", "compute_img_per_s_runs", "decode_img_per_s_runs",
    "local_img_per_s_runs", "service_img_per_s_runs", "n_files", "model", "arch",
    "local_img_per_s", "service_img_per_s", "service_over_local", "d_ms", "c_ms",
    "predicted_local_img_per_s", "predicted_service_img_per_s", "predicted_speedup",
    "bytes_per_image", "service_MB_per_s", "trainer_cpus", "worker_cpus", "processing_mode",
    "image_size", "batch_size", "n_steps", "warmup", "repeats", "split", "tfrecords_dir",
    "service_stopped_cleanly", "load_average_start", "load_average", "service_over_predicted"}
PIPELINES_KEYS = {
    "old_img_per_s", "old_img_per_s_std", "old_img_per_s_runs", "new_img_per_s",
    "new_img_per_s_std", "new_img_per_s_runs", "decode_ceiling_img_per_s",
    "decode_img_per_s_single_core", "new_over_old", "new_over_ceiling", "idle_fraction_old",
    "idle_fraction_new", "train_old_img_per_s", "train_new_img_per_s",
    "train_synthetic_img_per_s", "probe_model", "cores", "tfrecords_dir", "split", "n_files",
    "image_size", "batch_size", "n_batches", "repeats", "warmup_batches", "shuffle_buffer",
    "ceiling_images", "train_steps", "seed", "new_cycle_length", "tensorflow"}
ACCEL_KEYS = {"accel_wait_fraction_old", "accel_wait_fraction_new", "emulate_accelerator_ms"}


def round_trip(result: Any) -> dict[str, Any]:
    """What ``--json`` writes, read back."""
    return json.loads(json.dumps(json_safe(result)))


# --------------------------------------------------------------------------------------------
# bench service
# --------------------------------------------------------------------------------------------

def service_result(**overrides: Any) -> ServiceResult:
    """c = 1 / 50 s (20 ms), d = 1 / 100 s (10 ms): local 33, service 45 images/s."""
    fields: dict[str, Any] = dict(
        compute_img_per_s_runs=[40.0, 60.0], decode_img_per_s_runs=[100.0],
        local_img_per_s_runs=[30.0, 36.0], service_img_per_s_runs=[45.0],
        n_files=8, model="chexnet_small", arch="small", trainer_cpus=[0], worker_cpus=[1],
        processing_mode="parallel_epochs", image_size=128, batch_size=16, n_steps=30,
        warmup=5, repeats=2, split="train", tfrecords_dir="/data/tfr",
        service_stopped_cleanly=True, load_average_start=[0.5, 0.4, 0.3],
        load_average=[1.25, 0.5, 0.25])
    return ServiceResult(**{**fields, **overrides})


def test_service_result_derives_d_c_and_the_predictions():
    r = service_result()
    assert (r.compute_img_per_s, r.decode_img_per_s) == (50.0, 100.0)
    assert (r.local_img_per_s, r.service_img_per_s) == (33.0, 45.0)
    assert r.d_ms == pytest.approx(10.0) and r.c_ms == pytest.approx(20.0)
    assert r.service_over_local == pytest.approx(45 / 33)
    assert r.predicted_local_img_per_s == pytest.approx(1 / 0.03)   # 1 / (d + c)
    assert r.predicted_service_img_per_s == pytest.approx(50.0)     # 1 / max(d, c)
    assert r.predicted_speedup == pytest.approx(1.5)                # (d + c) / max(d, c)
    assert r.service_over_predicted == pytest.approx(45 / 33 / 1.5)
    assert r.bytes_per_image == 128 * 128 * 3 * 4
    assert r.service_MB_per_s == pytest.approx(45 * 196_608 / 1e6)
    # d = c: the largest predicted speed-up, 2
    assert service_result(decode_img_per_s_runs=[50.0]).predicted_speedup == pytest.approx(2)


def test_service_result_table():
    assert str(service_result()).splitlines() == [
        "one-core trainer (core(s) [0]), small model at 128 px, batch 16; service worker on "
        "core(s) [1] (parallel_epochs)",
        "  decode d = 10.0 ms/image, compute c = 20.0 ms/image",
        "                          measured  predicted",
        "  local (d + c)               33.0       33.3  images/s",
        "  service (max(d, c))         45.0       50.0  images/s",
        "  service / local            1.36x      1.50x",
        "  load average (1 min) at the start 0.50, at the end 1.25 (other jobs on the cores "
        "distort the figures)",
    ]


def test_service_result_json_has_the_former_keys_and_numbers():
    r = service_result()
    d = round_trip(r)
    assert set(d) == SERVICE_KEYS == set(r.as_dict())
    assert d["service_over_local"] == pytest.approx(r.service_over_local)
    assert d["d_ms"] == pytest.approx(10.0) and d["predicted_speedup"] == pytest.approx(1.5)
    assert d["local_img_per_s_runs"] == [30.0, 36.0] and d["trainer_cpus"] == [0]
    assert d["service_stopped_cleanly"] is True and d["bytes_per_image"] == 196_608
    # no runs: the ratios are NaN (null in the JSON), not a ZeroDivisionError
    empty = service_result(local_img_per_s_runs=[], compute_img_per_s_runs=[])
    assert math.isnan(empty.service_over_local) and math.isnan(empty.c_ms)
    assert round_trip(empty)["service_over_local"] is None


TRAINER_LINE = {"compute_img_per_s_runs": [40.0, 60.0], "decode_img_per_s_runs": [100.0],
                "local_img_per_s_runs": [30.0, 36.0], "service_img_per_s_runs": [45.0],
                "n_files": 8, "model": "chexnet_small", "arch": "small"}


class FakeService:
    """Stands in for TFDataService: a target, and a clean stop."""

    target = "grpc://localhost:5000"

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def __enter__(self) -> FakeService:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def stop(self) -> dict[str, list[Any]]:
        return {"left": [], "open_ports": []}


@pytest.fixture
def fake_trainer(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """bench_service with its service and trainer process faked: the trainer prints
    :data:`TRAINER_LINE` (after other output) as the real one prints its dict. Returns the
    commands run."""
    from chexnet_utils.bench import service

    calls: list[Any] = []

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        out = "some log line\n" + json.dumps(TRAINER_LINE) + "\n"
        return subprocess.CompletedProcess(cmd, 0, stdout=out, stderr="")

    monkeypatch.setattr(service, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(service, "TFDataService", FakeService)
    monkeypatch.setattr(service.subprocess, "run", run)
    return calls


def test_bench_service_reads_the_trainers_json_line(fake_trainer):
    from chexnet_utils.bench.service import bench_service

    r = bench_service("/data/tfr", image_size=64, batch_size=8, n_steps=3, warmup=1, repeats=2)
    assert isinstance(r, ServiceResult)
    assert r.local_img_per_s_runs == [30.0, 36.0] and r.service_img_per_s == 45.0
    assert r.d_ms == pytest.approx(10.0) and r.predicted_speedup == pytest.approx(1.5)
    assert (r.image_size, r.batch_size, r.n_steps, r.warmup, r.repeats) == (64, 8, 3, 1, 2)
    assert (r.trainer_cpus, r.worker_cpus, r.tfrecords_dir) == ([0], [1], "/data/tfr")
    assert r.service_stopped_cleanly and len(r.load_average) == 3
    assert "--target" in fake_trainer[0] and FakeService.target in fake_trainer[0]


def test_bench_service_trainer_failure(monkeypatch, fake_trainer):
    from chexnet_utils.bench import service

    monkeypatch.setattr(service.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, stdout="", stderr="Traceback ...\nValueError: no train shards"))
    with pytest.raises(RuntimeError, match=r"(?s)the trainer failed \(exit 1\).*no train shards"):
        service.bench_service("/data/tfr")
    with pytest.raises(ValueError, match="different cores"):
        service.bench_service("/data/tfr", trainer_cpus=[1], worker_cpus=[1])


def test_cli_bench_service_prints_the_table_and_writes_the_json(
        fake_trainer, tmp_path, capsys):
    out = tmp_path / "sub" / "bench-service.json"
    assert main(["bench", "service", "--tfrecords", "/data/tfr", "--image-size", "128",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert str(service_result(tfrecords_dir="/data/tfr")).splitlines()[1] in text
    assert "service / local            1.36x      1.50x" in text
    saved = json.loads(out.read_text())
    assert set(saved) == SERVICE_KEYS and saved["predicted_speedup"] == pytest.approx(1.5)


# --------------------------------------------------------------------------------------------
# bench pipelines and the decode ceiling
# --------------------------------------------------------------------------------------------

def pipelines_result(**overrides: Any) -> PipelinesResult:
    """Old 105 +- 5, new 310 +- 10 images/s; 90 images/s per core x 2 cores; training 200
    images/s on a constant batch, 80 fed by the old, 190 by the new approach."""
    fields: dict[str, Any] = dict(
        img_per_s_runs={"old": [100.0, 110.0, 105.0], "new": [300.0, 320.0, 310.0]},
        decode_img_per_s_single_core=90.0, cores=2,
        train_img_per_s={"old": 80.0, "new": 190.0}, train_synthetic_img_per_s=200.0,
        probe_model="probe_cnn",
        tfrecords_dir="/data/tfr", split="train", n_files=4, image_size=224, batch_size=16,
        n_batches=20, repeats=3, warmup_batches=2, shuffle_buffer=256, ceiling_images=64,
        train_steps=10, seed=0, new_cycle_length=4, tensorflow="2.21.0")
    return PipelinesResult(**{**fields, **overrides})


ACCEL = dict(accel_wait_fraction={"old": 0.6, "new": 0.05}, emulate_accelerator_ms=100.0)


def test_pipelines_result_derived_figures():
    r = pipelines_result()
    assert r.pipelines == ("old", "new")
    assert (r.img_per_s("old"), r.img_per_s("new")) == (105.0, 310.0)
    assert (r.img_per_s_std("old"), r.img_per_s_std("new")) == (5.0, 10.0)
    assert r.decode_ceiling_img_per_s == 180.0
    assert r.new_over_old == pytest.approx(310 / 105)
    assert r.new_over_ceiling == pytest.approx(310 / 180)
    assert r.idle_fraction("old") == pytest.approx(0.6)
    assert r.idle_fraction("new") == pytest.approx(0.05)
    clipped = pipelines_result(train_img_per_s={"old": 80.0, "new": 250.0})
    assert clipped.idle_fraction("new") == 0.0
    assert r.accel_wait_fraction is None and r.emulate_accelerator_ms is None
    assert math.isnan(pipelines_result(
        img_per_s_runs={"old": [0.0], "new": [300.0]}).new_over_old)


def test_pipelines_result_table():
    assert str(pipelines_result()).splitlines() == [
        "train shards: 4 file(s) in /data/tfr; 224 px, batch 16, 2 core(s)",
        "",
        "                            images/s",
        "old approach                   105.0 ± 5.0   runs: 100.0, 110.0, 105.0",
        "new approach                   310.0 ± 10.0   runs: 300.0, 320.0, 310.0",
        "decode ceiling                 180.0   (90.0/core x 2)",
        "new / old                       2.95x",
        "new / ceiling                   1.72",
        "",
        "training (probe_cnn, 200.0 images/s on a constant batch):",
        "  fed by old approach           80.0   idle 60%",
        "  fed by new approach          190.0   idle 5%",
    ]
    accel = pipelines_result(**ACCEL)
    assert str(accel).splitlines()[-1] == ("emulated accelerator (100 ms per batch) waiting "
                                           "for data: old 60.0%, new 5.0%")


def test_pipelines_result_json_has_the_former_keys_and_numbers():
    r = pipelines_result()
    d = round_trip(r)
    assert set(d) == PIPELINES_KEYS  # no accel_wait_fraction_* without an accelerator
    assert d["old_img_per_s"] == 105.0 and d["new_img_per_s_std"] == 10.0
    assert d["decode_ceiling_img_per_s"] == 180.0 and d["idle_fraction_old"] == pytest.approx(0.6)
    assert d["new_img_per_s_runs"] == [300.0, 320.0, 310.0] and d["seed"] == 0
    d = round_trip(pipelines_result(**ACCEL))
    assert set(d) == PIPELINES_KEYS | ACCEL_KEYS
    assert (d["accel_wait_fraction_old"], d["accel_wait_fraction_new"],
            d["emulate_accelerator_ms"]) == (0.6, 0.05, 100.0)
    zero = pipelines_result(img_per_s_runs={"old": [0.0], "new": [300.0]})
    assert round_trip(zero)["new_over_old"] is None


@pytest.mark.parametrize("accel_ms", [None, 100.0])
def test_cli_bench_pipelines_prints_the_table_and_the_accelerators_wait(
        monkeypatch, tmp_path, capsys, accel_ms):
    import functools

    from chexnet_utils.bench import pipelines as benchmark

    seen: dict[str, Any] = {}

    @functools.wraps(benchmark.bench_pipelines)  # the command's options come from its signature
    def fake(tfrecords_dir: Any, **kwargs: Any) -> PipelinesResult:
        seen.update(kwargs)
        if kwargs.get("emulate_accelerator_ms") is None:  # left out: the default, None
            return pipelines_result()
        return pipelines_result(accel_wait_fraction={"old": 0.6, "new": 0.05},
                                emulate_accelerator_ms=kwargs["emulate_accelerator_ms"])

    monkeypatch.setattr(benchmark, "bench_pipelines", fake)
    out = tmp_path / "b.json"
    args = ["bench", "pipelines", "--tfrecords", "/data/tfr", "--json", str(out)]
    assert main(args + (["--emulate-accelerator", "100"] if accel_ms else [])) == 0
    assert seen.get("emulate_accelerator_ms") == accel_ms
    text = capsys.readouterr().out
    assert str(pipelines_result()) in text
    wait = ("emulated accelerator (100 ms per batch) waiting for data: old 60.0%, new 5.0%")
    assert (wait in text) == (accel_ms is not None)
    keys = PIPELINES_KEYS | (ACCEL_KEYS if accel_ms else set())
    assert set(json.loads(out.read_text())) == keys


def test_decode_ceiling_result():
    c = DecodeCeiling(per_pass_img_per_s=[50.0, 80.0], cores=2, n_images=64, image_size=224)
    assert c.img_per_s_single_core == 80.0  # the best pass
    assert c.ceiling_img_per_s == 160.0
    assert set(round_trip(c)) == {"img_per_s_single_core", "cores", "ceiling_img_per_s",
                                  "per_pass_img_per_s", "n_images", "image_size"}
    assert round_trip(c)["ceiling_img_per_s"] == 160.0
    assert str(c) == ("80.0 images/s on one core x 2 core(s) = 160.0 images/s (64 images at "
                      "224 px, best of 2 pass(es))")


def test_results_are_frozen():
    import dataclasses

    for r in (service_result(), pipelines_result(),
              DecodeCeiling(per_pass_img_per_s=[1.0], cores=1, n_images=1, image_size=8)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            r.image_size = 3  # type: ignore[misc]

