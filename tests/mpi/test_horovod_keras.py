"""Horovod on Keras 3, proven on 2 ranks: the patterns that average (per-tensor and grouped
on the project's own step; the tape in the minimal script), the documented one that silently
does not, the check that stops a drifting job, the overlap of communication with the backward
pass, no learning-rate drift when validation drives the schedule, the Keras 2 recipe, and
notebook 04's own six-change cells under the GPU switches."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import cloudpickle
import numpy as np
import pytest

from chexnet_utils.cluster.distributed import (
    MPICluster,
    mpi_environment,
    mpirun_command,
)
from chexnet_utils.notebook.cells import code_cell
from chexnet_utils.training import experiments as EX
from chexnet_utils.training import horovod_keras as HK

pytestmark = pytest.mark.mpi
cloudpickle.register_pickle_by_value(sys.modules[__name__])
ROOT = Path(__file__).resolve().parents[2]
NB04 = ROOT / "notebooks" / "04_distributed_training_horovod.ipynb"
SWITCHES = ("CHEXNET_MIXED_PRECISION", "CHEXNET_XLA", "CHEXNET_DEVICE_FEED")


@pytest.fixture(scope="module")
def cluster():
    with MPICluster(n=2, env={"HOROVOD_TIMELINE": "DYNAMIC"}) as c:
        yield c


# ---- the copyable scripts (first: the module's cluster does not exist yet, so its idle
# engines, whose Horovod threads poll every millisecond, do not slow these jobs down). The
# minimal script runs under horovodrun with the GPU switches on in tests/mpi/test_gpu_smoke.py.

def test_canonical_keras2_recipe_averages_under_tf_keras(tmp_path):
    argv = ["python", str(ROOT / "scripts" / "horovod_keras2_canonical.py"),
            "--out", str(tmp_path / "k2")]
    proc = subprocess.run(mpirun_command(2, argv), env=mpi_environment(2), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "keras 2." in proc.stdout and "ranks identical: True" in proc.stdout, proc.stdout


# ---- pure pieces ---------------------------------------------------------------------------

def test_ranks_that_differ_are_named_by_their_fingerprint():
    from chexnet_utils.training import weights_sha256

    a = weights_sha256([np.ones((2, 3)), np.arange(4.0)])
    b = weights_sha256([np.ones((2, 3)), np.arange(4.0) + 1e-7])  # the last bit is enough
    assert a != b and a == weights_sha256([np.ones((2, 3)), np.arange(4.0)])
    assert HK.ranks_that_differ([a, a, a]) == []
    assert HK.ranks_that_differ([a, b, a, b]) == [1, 3]


def test_enqueue_spread_per_step():
    from chexnet_utils.comm import TimelineEvent

    def neg(name, t_ms):
        return TimelineEvent(name, "NEGOTIATE_ALLREDUCE", t_ms * 1000.0, 10.0)

    # 2 steps of 3 gradients, and a barrier seen once (left out)
    events = [neg("barrier", 50), neg("c", 10), neg("a", 0), neg("b", 4),
              neg("a", 100), neg("b", 100.5), neg("c", 101)]
    assert EX.enqueue_spread(events, 3) == pytest.approx([10.0, 1.0])
    with pytest.raises(ValueError, match="expected 4"):
        EX.enqueue_spread(events, 4)
    with pytest.raises(ValueError):
        EX.enqueue_spread(events, 0)


def test_nan_weights_everywhere_are_not_a_drift():
    from chexnet_utils.training import weights_sha256

    a = weights_sha256([np.array([np.nan, 1.0])])
    assert HK.ranks_that_differ([a, a]) == []


def test_learning_rate_scaling_rules():
    from chexnet_utils.training import scaled_learning_rate

    assert scaled_learning_rate(1e-3, 4, "linear") == pytest.approx(4e-3)
    assert scaled_learning_rate(1e-3, 4, "sqrt") == pytest.approx(2e-3)
    assert scaled_learning_rate(1e-3, 4, None) == 1e-3
    with pytest.raises(ValueError, match="sqrt"):
        scaled_learning_rate(1e-3, 4, "cubic")


# ---- on 2 ranks ----------------------------------------------------------------------------

def six_changes(cluster, files, out, switches, drop_scale_loss=False, xla_cell=False):
    """Notebook 04's %%px cells of section 2.0 (taken from the notebook) on the engines, with
    the GPU switches ``on`` or ``off``: (weights moved per rank, digests, XLA cell's output)."""
    cluster.view.push({"FILES": files, "IMAGE_SIZE": 32, "BATCH_SIZE": 8, "STEPS": 3,
                       "OUT": str(out), "SWITCH_ENV": dict.fromkeys(SWITCHES, switches)},
                      block=True)
    step = code_cell(NB04, "def train_step(images, labels):")
    if drop_scale_loss:
        step = step.replace("        scaled = optimizer.scale_loss(loss)", "        scaled = loss")
    cells = ["import os\nos.environ.update(SWITCH_ENV)",
             code_cell(NB04, "hvd.init()\nprint(f\"rank {hvd.rank()} of {hvd.size()}"),
             code_cell(NB04, "# 1. initialise"),
             "START_W = [w.numpy() for w in model.trainable_weights]", step,
             code_cell(NB04, "losses = [float(train_step(images, labels))"),
             "MOVED = float(sum(abs(w.numpy() - s).sum() "
             "for w, s in zip(model.trainable_weights, START_W)))"]
    for code in cells:
        cluster.view.execute(code, block=True).get()
    printed = []
    if xla_cell:
        xla = cluster.view.execute(code_cell(NB04, "xla_step = tf.function("), block=True)
        xla.get()
        printed = list(xla.stdout)
    moved = cluster.view.pull("MOVED", block=True)
    ends = cluster.view.pull("end", block=True)
    sw = cluster.view.pull("SW", block=True)
    return moved, ends, sw, printed


def test_notebook_six_changes_under_the_gpu_switches(cluster, hvd_tfrecords, tmp_path):
    """Issue 45 (a, d): notebook 04's lesson cells with mixed precision, XLA and the device
    feed forced on: the ranks stay identical, the Adam updates match float32's within 2x,
    XLA is off on purpose (it cannot compile Horovod's allreduce on a CPU) and the cell that
    forces it shows the compile error on every rank. Without ``scale_loss`` (the cell before
    issue 45) Adam's updates shrink to 0.016x, which the 2x check catches: shown with
    ``CHEXNET_TEST_MUTANTS=1`` (a third run, left out of ``make test`` for its time)."""
    from chexnet_utils.data.tfrecords import list_shards

    files = [str(f) for f in list_shards(hvd_tfrecords, "train")]
    f32, ends32, sw32, _ = six_changes(cluster, files, tmp_path / "f32", "off")
    on, ends, sw, xla_out = six_changes(cluster, files, tmp_path / "on", "on", xla_cell=True)
    assert len(set(ends32)) == 1 and len(set(ends)) == 1, "the ranks drifted apart"
    assert all(s.mixed_precision and s.device_feed and not s.xla for s in sw)
    assert all("cannot compile Horovod's allreduce on a CPU" in s.why["xla"] for s in sw)
    assert not any(s.mixed_precision for s in sw32)
    ratio = on[0] / f32[0]
    print(f"04 six changes, Adam: mixed / float32 weight change {ratio:.4g}")
    assert 0.5 < ratio < 2, f"mixed precision moved the weights {ratio:.3g}x as far"
    assert len(xla_out) == 2 and all("Detected unsupported operations" in out
                                     and "Allreduce" in out for out in xla_out), xla_out
    if os.environ.get("CHEXNET_TEST_MUTANTS") == "1":  # the check on the step before issue 45
        bug, _, _, _ = six_changes(cluster, files, tmp_path / "bug", "on", drop_scale_loss=True)
        print(f"04 six changes without scale_loss, Adam: {bug[0] / f32[0]:.4g}")
        assert bug[0] / f32[0] < 0.5, f"without scale_loss: {bug[0] / f32[0]:.3g}x"


@pytest.mark.parametrize("pattern", ["per_tensor", "grouped"])
def test_averaging_patterns_keep_ranks_identical(cluster, pattern):
    (s0, e0), (s1, e1) = cluster.run(EX.pattern_digests, pattern)
    assert s0 == s1, "the broadcast did not give both ranks rank 0's weights"
    assert e0 != s0, "training did not change the weights"
    assert e0 == e1, f"{pattern}: the ranks drifted apart"


def test_keras3_distributed_optimizer_runs_but_does_not_average(cluster):
    r0, r1 = cluster.run(EX.keras_optimizer_digests)
    assert r0["start"] == r1["start"]  # the same model on both ranks ...
    assert r0["end"] != r1["end"]      # ... no error, and yet different weights after fit


def test_rank_agreement_stops_a_job_whose_ranks_diverge(cluster):
    with pytest.raises(Exception) as err:
        cluster.run(EX.keras_optimizer_digests, check=True)
    line = EX.error_line(err.value, "RanksDiverged")
    assert "RanksDiverged" in line and "different weights after step 2" in line, line
    assert "DistributedOptimizer" in line  # the likely cause is named


def test_per_tensor_allreduce_overlaps_the_backward_pass(cluster, tmp_path):
    per = cluster.run(EX.allreduce_enqueue_spread, "per_tensor", str(tmp_path / "per.json"))[0]
    grouped = cluster.run(EX.allreduce_enqueue_spread, "grouped", str(tmp_path / "g.json"))[0]
    assert per["n_tensors"] == grouped["n_tensors"] > 10
    assert len(per["spread_ms"]) >= 3 and len(grouped["spread_ms"]) >= 3
    # grouped: every gradient reaches Horovod at the same instant, after the backward pass;
    # per tensor: the first ones are on their way while later layers are differentiated
    assert max(grouped["spread_ms"]) < 1.0
    # (ratio, not an absolute 2 ms: on two busy cores the backward pass itself is short)
    assert np.median(per["spread_ms"]) > max(0.5, 20 * max(grouped["spread_ms"]))


def _validation_logs(tfr: str, distributed: bool) -> dict:
    """The Validation callback's logs on this rank, with BatchNorm statistics that differ by
    rank (as they do after training on different shards)."""
    import horovod.tensorflow as hvd
    import keras

    from chexnet_utils import training as T
    from chexnet_utils.data.tfrecords import list_shards
    from chexnet_utils.model.models import WeightedBCE, build_chexnet
    from chexnet_utils.training.callbacks import Validation
    from chexnet_utils.training.splits import eval_dataset

    hvd.init()
    keras.utils.set_random_seed(0)
    model = build_chexnet("small", 32)
    for layer in model.layers:
        for sub in getattr(layer, "layers", [layer]):
            if isinstance(sub, keras.layers.BatchNormalization):
                sub.moving_mean.assign(sub.moving_mean + 0.3 * hvd.rank())
    sums, n = T.training_label_sums(tfr)
    ds = eval_dataset(list_shards(tfr, "val") + list_shards(tfr, "test"), 8, 32, False)
    cb = Validation(ds, WeightedBCE.from_label_sums(sums, n), distributed)
    cb.set_model(model)
    logs: dict = {}
    cb.on_epoch_end(0, logs)
    return logs


def test_validation_metrics_are_averaged_across_ranks(cluster, hvd_tfrecords):
    local = cluster.run(_validation_logs, str(hvd_tfrecords), False)
    assert local[0]["val_loss"] != local[1]["val_loss"]  # each rank sees its own numbers
    averaged = cluster.run(_validation_logs, str(hvd_tfrecords), True)
    assert averaged[0] == averaged[1]  # every decision sees the same numbers
    assert averaged[0]["val_loss"] == pytest.approx(
        (local[0]["val_loss"] + local[1]["val_loss"]) / 2)


def test_validation_driven_learning_rate_stays_identical_on_every_rank(cluster, hvd_tfrecords,
                                                                       tmp_path):
    """Patience 0 cuts the learning rate whenever the (averaged) val loss does not improve;
    every rank must take the same decision and end with the same weights.

    The decisions are replayed from the val losses rank 0 logged (the averaged ones every
    rank's plateau saw): Keras' ``ReduceLROnPlateau`` cuts tenfold at an epoch end unless the
    loss beat the best by more than ``min_delta`` (1e-4). Whether 6 short epochs cut at all
    depends on the run (about 1 run in 10 improves every epoch), so the test checks the
    decisions taken, not that one was a cut."""
    import csv

    from chexnet_utils.training import train_on_engine

    cfg = dict(tfrecords=str(hvd_tfrecords), out_dir=str(tmp_path / "run"), arch="small",
               image_size=32, batch_size=8, epochs=6, steps_per_epoch=2, verbose=0,
               tensorboard=False, plateau_patience=0, learning_rate=0.02,
               evaluate_test=False)
    results = cluster.run(train_on_engine, cfg)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    ranks = metrics["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    lrs = {r["lr"] for r in ranks}
    assert len(lrs) == 1, f"learning rates differ across ranks: {ranks}"
    assert len({r["trainable_sha256"] for r in ranks}) == 1 and metrics["ranks_identical"]
    with open(tmp_path / "run" / "log.csv", newline="") as f:
        val_losses = [float(row["val_loss"]) for row in csv.DictReader(f)]
    assert len(val_losses) == 6
    lr, best = 0.02 * 2, math.inf  # linear scaling (the default) on 2 workers
    for loss in val_losses:  # the first epoch (warm-up) always improves on inf
        if loss < best - 1e-4:
            best = loss
        else:
            lr = max(lr * 0.1, 1e-6)  # plateau_factor, min_lr
    assert lrs.pop() == pytest.approx(lr, rel=1e-5), (val_losses, ranks)
    assert results[0]["weights_checksum"] == results[1]["weights_checksum"]


# ---- notebook 04's exercise 6: the conversion under fit, judged by what it does ---------------

def _notebook_solution_6() -> str:
    """Exercise 6's solution as notebook 04 shows it, with the imports of its starter cell."""
    nb = json.loads((ROOT / "notebooks" / "04_distributed_training_horovod.ipynb").read_text())
    cells = {c["id"]: "".join(c["source"]) for c in nb["cells"]}
    starter = cells["exercise-6-code"].removeprefix("%%px\n")
    imports = starter[:starter.index("\n\n\ndef ")]
    body = cells["exercise-6-solution"].split("```python\n", 1)[1].split("```", 1)[0]
    return imports + "\n\n\n" + body.split("then:\n", 1)[1]


WRONG_6 = {   # the solution with one piece taken out or done wrong -> a phrase of the verdict
    "no-init": ([("hvd.init()", "pass  #")], "hvd.init()"),
    "no-shard": ([("ds = ds.shard(hvd.size(), hvd.rank())", "ds = ds")], "sharding"),
    "steps-not-over-n": ([("steps = n_images // batch_size // hvd.size()",
                           "steps = n_images // batch_size")], "steps per epoch"),
    "lr-not-scaled": ([("Adam(lr * hvd.size())", "Adam(lr)"),
                       ("WarmUp(lr, lr * hvd.size(), steps)", "WarmUp(lr, lr, steps)")],
                      "learning rate"),
    "no-warm-up": ([("WarmUp(lr, lr * hvd.size(), steps), ", "")], "warm-up"),
    "no-tape": ([("tape = hvd.DistributedGradientTape(tape)", "pass  #")], "its own gradient"),
    "sum": ([("tape = hvd.DistributedGradientTape(tape)",
              "tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)")], "SUM"),
    "no-optimizer-broadcast": ([("state = self.model.variables + opt.variables",
                                 "state = self.model.variables")], "optimizer state"),
    "no-metric-average": ([(", AverageMetrics()]", "]")], "metrics"),
    "every-rank-writes": ([("if hvd.rank() == 0:", "if True:")], "rank 0 only"),
    "keras-variables": ([("tape.gradient(scaled, [v.value for v in self.trainable_variables])",
                          "tape.gradient(scaled, self.trainable_variables)")], "v.value"),
}


def test_fit_conversion_check_passes_the_solution_and_names_each_wrong_version(cluster, capsys):
    """One cluster, the %%px route of the notebook: the solution's source executed on the
    engines, then the check; then each wrong version the same way."""
    from chexnet_utils.notebook import exercises

    solution = _notebook_solution_6()
    cluster.view.execute(solution, block=True)
    assert exercises.check_fit_conversion(cluster), capsys.readouterr().out
    faults = {}
    for name, (edits, phrase) in WRONG_6.items():
        source = solution
        for old, new in edits:
            assert old in source, (name, old)
            source = source.replace(old, new, 1)
        cluster.view.execute(source, block=True)
        ok = exercises.check_fit_conversion(cluster, timeout=120)
        out = capsys.readouterr().out
        faults[name] = (ok, phrase in out, out.strip()[-300:])
    assert {n: f for n, f in faults.items() if f[0] or not f[1]} == {}, faults
    assert len(faults) >= 8


# ---- notebook 04's uneven-shards exercise: hvd.join, then a broadcast ------------------------

def _train_all_right(step, batches, model):
    import horovod.tensorflow as hvd

    for images, labels in batches:
        step(images, labels)
    last = int(hvd.join())
    hvd.broadcast_variables([v.value for v in model.variables + model.optimizer.variables],
                            root_rank=last)


def _train_all_model_only(step, batches, model):
    """19cb1e5's solution: the weights from the last rank, Adam's state left apart."""
    import horovod.tensorflow as hvd

    for images, labels in batches:
        step(images, labels)
    last = int(hvd.join())
    hvd.broadcast_variables([v.value for v in model.variables], root_rank=last)


def _train_all_no_broadcast(step, batches, model):
    import horovod.tensorflow as hvd

    for images, labels in batches:
        step(images, labels)
    hvd.join()


def _train_all_no_join(step, batches, model):
    for images, labels in batches:
        step(images, labels)


@pytest.mark.parametrize("answer, hint", [(_train_all_right, None),
                                          (_train_all_model_only, "optimizer.variables"),
                                          (_train_all_no_broadcast, "broadcast")],
                         ids=["join-and-broadcast", "weights-only", "join-only"])
def test_uneven_shards_check(cluster, capsys, answer, hint):
    from chexnet_utils.notebook import exercises

    ok = exercises.check_uneven_shards(answer, run=cluster.run)
    out = capsys.readouterr().out
    assert ok == (hint is None) and ("Correct: " if ok else hint) in out, out


@pytest.mark.slow
def test_uneven_shards_without_join_hang_and_are_reported(capsys):
    """The wrong version hangs for real: the check's own cluster times out and is torn down
    (its engines, stuck in an allreduce, are killed), and the verdict names hvd.join."""
    import time

    from chexnet_utils.notebook import exercises

    t0 = time.perf_counter()
    assert exercises.check_uneven_shards(_train_all_no_join, timeout=15) is False
    out = capsys.readouterr().out
    assert "hung" in out and "hvd.join()" in out, out
    assert time.perf_counter() - t0 < 90
