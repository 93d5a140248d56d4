"""Horovod data-parallel training on ipyparallel MPI engines (what notebook 04 does).

A killed worker and the resume from rank 0's checkpoint are checked where they are taught:
notebook 04's drill (its checked cell after the resume), run by nbval."""

import json
import sys
from pathlib import Path

import cloudpickle
import pytest

from chexnet_utils.cluster.distributed import MPICluster

pytestmark = pytest.mark.mpi
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _config(tfr: Path, out: Path, **kw):
    base = dict(tfrecords=str(tfr), out_dir=str(out), arch="small", image_size=32,
                batch_size=8, epochs=2, steps_per_epoch=3, verbose=0, tensorboard=False)
    base.update(kw)
    return base


def _names_of_my_shard(tfr: str) -> list[str]:
    import horovod.tensorflow as hvd

    from chexnet_utils.data.tfrecords import list_shards
    from chexnet_utils.input.pipelines import new_approach

    hvd.init()
    ds = new_approach(list_shards(tfr, "train"), 4, 32, training=False,
                      num_workers=hvd.size(), worker_index=hvd.rank(), with_names=True)
    return [n.decode() for _, _, names in ds for n in names.numpy()]


@pytest.fixture(scope="module")
def cluster():
    """Two engines shared by the tests that neither kill one nor need a fresh one (each
    cluster start costs two engines' Python, ipyparallel and TensorFlow imports)."""
    with MPICluster(n=2) as c:
        yield c


def test_two_engines_train_in_lockstep_on_disjoint_shards(cluster, hvd_tfrecords, tmp_path):
    from chexnet_utils.data.tfrecords import load_manifest
    from chexnet_utils.training import train_on_engine

    shards = cluster.run(_names_of_my_shard, str(hvd_tfrecords))
    results = cluster.run(train_on_engine, _config(hvd_tfrecords, tmp_path / "run"))
    # each rank reads its own files: disjoint, and together every training image once
    a, b = (set(s) for s in shards)
    assert a and b and not a & b
    assert len(a) + len(b) == load_manifest(hvd_tfrecords)["splits"]["train"]["images"]
    # gradients averaged + initial state broadcast: every rank holds identical weights
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == 2 for r in results)
    assert results[0]["weights_checksum"] == results[1]["weights_checksum"]
    # epoch metrics are averaged across ranks, so both logged the same loss
    assert results[0]["history"]["loss"] == pytest.approx(results[1]["history"]["loss"])
    # only rank 0 writes files and evaluates the test split
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["global_batch_size"] == 16
    assert results[0]["mean_auroc"] == pytest.approx(metrics["mean_auroc"], nan_ok=True)
    assert results[1]["mean_auroc"] != results[1]["mean_auroc"]  # NaN on rank 1


def test_emulated_step_waits_for_the_device_and_averages_across_engines(cluster, hvd_tfrecords):
    from dataclasses import asdict

    from chexnet_utils.bench.engine_steps import StepConfig
    from chexnet_utils.bench.scaling import throughput_on_engine

    cfg = asdict(StepConfig(tfrecords=str(hvd_tfrecords), pipeline="new", image_size=32,
                            batch_size=4, warmup_steps=1, steps=4, accelerator_ms=50))
    res = cluster.run(throughput_on_engine, cfg, stream_rank0=False)
    assert [r["rank"] for r in res] == [0, 1]
    assert all(r["accelerator_ms"] == 50 for r in res)
    assert all(r["seconds"] >= 4 * 0.050 for r in res)  # 4 steps of at least 50 ms each
    assert all(r["batches"] == 1 + 4 for r in res)  # warm-up + timed, each read a batch
    # each worker's fake gradients hold its rank: the allreduce averaged 0 and 1 everywhere
    assert [r["emulated_average"] for r in res] == [0.5, 0.5]


def test_bench_scaling_rejects_bad_arguments(hvd_tfrecords):
    from chexnet_utils.bench.scaling import bench_scaling
    from chexnet_utils.cli import main

    with pytest.raises(ValueError, match="accelerator_ms"):
        bench_scaling(hvd_tfrecords, workers=[1], accelerator_ms=-1)
    with pytest.raises(ValueError, match="worker counts"):
        bench_scaling(hvd_tfrecords, workers=[0, 2])
    with pytest.raises(ValueError, match="warmup_steps >= 0"):
        bench_scaling(hvd_tfrecords, workers=[1], warmup_steps=-1)
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        main(["bench", "scaling", "--tfrecords", str(hvd_tfrecords), "--env", "NOVALUE"])


def test_train_cli_runs_unchanged_under_mpirun(hvd_tfrecords, tmp_path):
    """The CLI under a bare ``mpirun`` (``horovodrun``, which adds Horovod's own environment
    on top of ``mpirun``, runs the minimal script in tests/mpi/test_gpu_smoke.py: each
    launcher is proven once, not each job under both), with the GPU switches forced on: the
    ranks stay identical, XLA is off on purpose under Horovod on a CPU."""
    import os
    import subprocess

    from chexnet_utils.cluster.distributed import mpi_environment
    from tests.support.scripts import launcher_command

    out = tmp_path / "run"
    argv = ["python", "-m", "chexnet_utils", "train", "--horovod",
            "--tfrecords", str(hvd_tfrecords),
            "--arch", "small", "--image-size", "32", "--batch-size", "8", "--epochs", "1",
            "--steps-per-epoch", "2", "--out", str(out), "--quiet"]
    switches = dict.fromkeys(("CHEXNET_MIXED_PRECISION", "CHEXNET_XLA", "CHEXNET_DEVICE_FEED"),
                             "on")  # what a GPU node runs (issue 45)
    proc = subprocess.run(launcher_command("mpirun", 2, argv),
                          env=mpi_environment(2, {**os.environ, **switches}),
                          capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["epochs"] == 1
    assert metrics["ranks_identical"]
    accel = metrics["accelerator"]
    assert accel["mixed_precision"] and accel["device_feed"] and not accel["xla"]
    assert "cannot compile Horovod's allreduce on a CPU" in accel["why"]["xla"]
    assert proc.stdout.count("mean AUROC") == 1  # only rank 0 reports
