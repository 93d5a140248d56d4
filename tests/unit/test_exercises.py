"""The exercise checks: a right answer passes, wrong ones fail, the ``None`` placeholder of the
notebooks fails quietly. Right answers are computed here from real fixtures (a tiny synthetic
data set converted to TFRecords, records of the generator, a built model, the package's cost
model), not copied from the checks. Every check the notebooks call exists, and every check is
called by a notebook."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from chexnet_utils import comm
from chexnet_utils.bench import benchmark
from chexnet_utils.data import synthetic
from chexnet_utils.data import tfrecords as T
from chexnet_utils.hardware import devices
from chexnet_utils.notebook import exercises
from tests.support.datasets import synthetic_tfrecords

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SHARD_SIZE = 5


def verdict(capsys: pytest.CaptureFixture[str], result: bool) -> bool:
    """``result``, after checking that the printed verdict agrees with it."""
    out = capsys.readouterr().out
    assert out.startswith("Correct: " if result else "Not yet: "), out
    return result


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 synthetic 32 px images converted with shards of 5."""
    return synthetic_tfrecords(tmp_path_factory.mktemp("exercises"), 40, 32, SHARD_SIZE)


# --- 00 ------------------------------------------------------------------------------------

def test_thread_budget(capsys):
    assert verdict(capsys, exercises.check_thread_budget(2, n_processes=3, cores=8))
    assert not verdict(capsys, exercises.check_thread_budget(3, n_processes=3, cores=8))
    assert verdict(capsys, exercises.check_thread_budget(1, n_processes=3, cores=2))
    assert not verdict(capsys, exercises.check_thread_budget(0, n_processes=3, cores=2))
    here = max(1, devices.usable_cores() // 3)
    assert verdict(capsys, exercises.check_thread_budget(here))


def test_ranks_without_local_gpu(capsys):
    assert verdict(capsys, exercises.check_ranks_without_local_gpu([4, 5, 6, 7]))
    assert verdict(capsys, exercises.check_ranks_without_local_gpu(
        {2, 3, 4, 5}, nodes=3, gpus_per_node=2))
    assert not verdict(capsys, exercises.check_ranks_without_local_gpu({4}))
    assert not verdict(capsys, exercises.check_ranks_without_local_gpu(set(range(8))))
    assert not verdict(capsys, exercises.check_ranks_without_local_gpu("4567"))


def test_gpu_capabilities(capsys):
    assert verdict(capsys, exercises.check_gpu_capabilities({"nccl", "gpu"}))
    assert verdict(capsys, exercises.check_gpu_capabilities("nccl"))
    assert verdict(capsys, exercises.check_gpu_capabilities("mpi, NCCL"))
    assert not verdict(capsys, exercises.check_gpu_capabilities({"gpu"}))
    assert verdict(capsys, exercises.check_gpu_capabilities({"nccl", "cuda"}))
    assert not verdict(capsys, exercises.check_gpu_capabilities({"cuda"}))
    assert not verdict(capsys, exercises.check_gpu_capabilities({"nccl", "tpu"}))


# --- 01 ------------------------------------------------------------------------------------

def test_shard_layout_matches_the_converter(capsys, converted):
    counts = [s["count"] for s in T.load_manifest(converted)["shards"] if s["split"] == "train"]
    assert len(T.list_shards(converted, "train")) == len(counts)
    right = (len(counts), counts[-1])
    assert verdict(capsys, exercises.check_shard_layout(right, converted, SHARD_SIZE))
    assert not verdict(capsys, exercises.check_shard_layout(
        (len(counts) - 1, SHARD_SIZE), converted, SHARD_SIZE))
    # the same data set predicted for another shard size, from the same manifest
    n = sum(counts)
    assert verdict(capsys, exercises.check_shard_layout(
        (math.ceil(n / 4), n - 4 * (math.ceil(n / 4) - 1)), converted, 4))
    assert not verdict(capsys, exercises.check_shard_layout("3, 2", converted, 4))
    # the plan itself (notebook 01's shard_plan): the remainder written, not dropped
    k = next(k for k in (3, 4, 6, 7) if n % k)  # a shard size that leaves a remainder
    plan = [k] * (n // k) + [n % k]
    assert verdict(capsys, exercises.check_shard_layout(plan, converted, k))
    assert not verdict(capsys, exercises.check_shard_layout(plan[:-1], converted, k))  # dropped
    assert not verdict(capsys, exercises.check_shard_layout(plan[::-1], converted, k))


def test_images_per_patient(capsys):
    records = synthetic.sample_records(300, seed=1, size=64)
    ratio = len(records) / len({r.patient_id for r in records})
    assert ratio > 1.5  # the generator gives patients several films, as NIH does
    assert verdict(capsys, exercises.check_images_per_patient(round(ratio, 2), records))
    assert not verdict(capsys, exercises.check_images_per_patient(1.0, records))
    assert not verdict(capsys, exercises.check_images_per_patient("many", records))


# --- 02 ------------------------------------------------------------------------------------

def test_step_times(capsys):
    right = {"sequential_ms": 90, "pipelined_ms": 60, "wait_sequential_ms": 30,
             "wait_pipelined_ms": 0}
    assert verdict(capsys, exercises.check_step_times(right, cpu_ms=30, accel_ms=60))
    cpu_bound = {"sequential_ms": 100, "pipelined_ms": 60, "wait_sequential_ms": 60,
                 "wait_pipelined_ms": 20}
    assert verdict(capsys, exercises.check_step_times(cpu_bound, cpu_ms=60, accel_ms=40))
    assert not verdict(capsys, exercises.check_step_times(
        {**right, "wait_pipelined_ms": 30}, cpu_ms=30, accel_ms=60))
    assert not verdict(capsys, exercises.check_step_times(right, cpu_ms=60, accel_ms=40))
    assert not verdict(capsys, exercises.check_step_times((90, 60, 30, 0), cpu_ms=30,
                                                          accel_ms=60))


def test_serial_decode_given_a_rate_compares_it_with_one_core(capsys):
    # a measured rate (not the pipeline): only section 2's single-core rate to compare with
    assert verdict(capsys, exercises.check_serial_decode(140.0, 100.0, cores=2))
    assert not verdict(capsys, exercises.check_serial_decode(160.0, 100.0, cores=2))
    timed = benchmark.ThroughputResult([96.0, 104.0], [1.0, 1.0], [96, 104], 2, True)
    assert verdict(capsys, exercises.check_serial_decode(timed, 100.0))
    assert not verdict(capsys, exercises.check_serial_decode("fast", 100.0))
    # the pipeline itself is timed side by side with itself on one thread: tests/tf


def test_worker_shares(capsys, converted):
    files = T.list_shards(converted, "train")
    counts = [sum(1 for _ in T.read_records(f)) for f in files]
    kept = [sum(counts[i::3]) for i in range(3)]
    assert verdict(capsys, exercises.check_worker_shares(
        (max(kept), min(kept)), files, num_workers=3, counts=counts))
    assert not verdict(capsys, exercises.check_worker_shares(
        (max(kept) + 1, min(kept)), files, num_workers=3, counts=counts))
    assert not verdict(capsys, exercises.check_worker_shares(
        (min(kept), max(kept)), files, num_workers=3, counts=counts))


# --- 03 and 05 ------------------------------------------------------------------------------

def test_which_is_faster(capsys):
    rates = {"new": 200.0, "old": 190.0}
    assert verdict(capsys, exercises.check_which_is_faster("same", rates))
    assert not verdict(capsys, exercises.check_which_is_faster("new", rates))
    slow_old = {"new": 200.0, "old": 80.0}
    assert verdict(capsys, exercises.check_which_is_faster("new", slow_old))
    assert not verdict(capsys, exercises.check_which_is_faster("same", slow_old))
    times = {"default": 0.001, "cycle 10 ms": 0.006}
    assert verdict(capsys, exercises.check_which_is_faster("default", times,
                                                           higher_is_faster=False))
    assert not verdict(capsys, exercises.check_which_is_faster("cycle 10 ms", times,
                                                               higher_is_faster=False))
    # not measured yet: fails, whatever the prediction
    assert not verdict(capsys, exercises.check_which_is_faster("same", {"new": 1, "old": None}))


def test_full_size_prediction_measures_only_after_the_prediction(capsys):
    fed_full = benchmark.FedTrainingResult(pipeline_img_per_s=[90.0, 110.0],
                                           fed_img_per_s=[60.0, 60.0],
                                           in_memory_img_per_s=[200.0, 210.0],
                                           n_steps=5, batch_size=16)
    runs = []

    def measure(old=35.0, new=60.0):
        runs.append(1)
        return old, new

    def check(answer, m=measure):
        return exercises.check_full_size_prediction(answer, fed_full, m, cores=2)

    assert not verdict(capsys, check(None)) and not verdict(capsys, check("fast"))
    assert runs == []  # no answer, no measurement: the number is never shown first
    # right: one core's decode rate shared with the model (~40), or the measurement itself
    assert verdict(capsys, check(40)) and verdict(capsys, check(35))
    # wrong: the new approach's rate on all cores, or the model's own speed
    assert not verdict(capsys, check(fed_full.pipeline))
    assert not verdict(capsys, check(fed_full.in_memory))
    # the machine got twice as busy since section 5: a prediction made then still counts
    assert verdict(capsys, check(40, lambda: measure(17.5, 30.0)))
    assert not verdict(capsys, check(20, lambda: measure(17.5, 30.0)))
    assert len(runs) == 6


@pytest.mark.parametrize("n_workers, n_messages", [(256, 1), (64, 364)])
def test_efficiency(capsys, n_workers, n_messages):
    args = dict(n_workers=n_workers, grad_bytes=28e6, compute_s=0.03, alpha=20e-6, beta=2e-10,
                overhead_s=1e-3, n_messages=n_messages)
    right = comm.scaling_efficiency_prediction(
        n_workers, 28e6, 0.03, 20e-6, 2e-10, overhead_s=1e-3, n_messages=n_messages)
    assert 0 < right < 1
    assert verdict(capsys, exercises.check_efficiency(right, **args))
    assert verdict(capsys, exercises.check_efficiency(round(right, 3), **args))
    assert not verdict(capsys, exercises.check_efficiency(right + 0.05, **args))
    assert not verdict(capsys, exercises.check_efficiency(100 * right, **args))


@pytest.mark.parametrize("n", [2, 8, 64])
def test_ps_shards(capsys, n):
    # the smallest k with N * size / k <= 2(N-1)/N * size, by search
    k = next(k for k in range(1, n + 1) if n / k <= 2 * (n - 1) / n)
    assert verdict(capsys, exercises.check_ps_shards(k, n_workers=n))
    assert not verdict(capsys, exercises.check_ps_shards(k - 1, n_workers=n))
    assert not verdict(capsys, exercises.check_ps_shards(k + 1, n_workers=n))


def test_old_pipeline_efficiency_from_a_simulated_decode_and_model_time(capsys):
    d, c = 0.008, 0.005  # seconds per image: decode, model

    def rate(n: int) -> float:  # every worker decodes n images per useful one
        return n / (n * d + c)

    right = (d + c) / (4 * d + c)
    assert verdict(capsys, exercises.check_old_pipeline_efficiency(right, rate(1), rate(2), 2))
    assert verdict(capsys, exercises.check_old_pipeline_efficiency(
        (d + c) / (8 * d + c), rate(1), rate(3), m=3, n=8))
    assert not verdict(capsys, exercises.check_old_pipeline_efficiency(
        rate(4) / (4 * rate(1)) + 0.05, rate(1), rate(2), 2))
    assert not verdict(capsys, exercises.check_old_pipeline_efficiency(
        100 * right, rate(1), rate(2), 2))  # a percentage
    assert not verdict(capsys, exercises.check_old_pipeline_efficiency(
        1 / 4, rate(1), rate(2), 2))  # the flat-line limit, not this machine's answer
    # linear rates (the new pipeline) do not fit the model: a hint, not a verdict on d < 0
    assert not verdict(capsys, exercises.check_old_pipeline_efficiency(0.5, 100.0, 200.0, 2))
    # slower than decoding twice explains (c < 0): a hint to measure again, not a verdict
    assert not verdict(capsys, exercises.check_old_pipeline_efficiency(0.4, 100.0, 60.0, 2))
    with pytest.raises(ValueError):
        exercises.check_old_pipeline_efficiency(0.5, 100.0, 100.0, 1)


def test_checks_answer_bad_types_with_a_hint_not_an_exception(capsys):
    assert not verdict(capsys, exercises.check_gpu_capabilities(5))
    # numbers given as strings are read as numbers
    assert verdict(capsys, exercises.check_which_is_faster("a", {"a": "85", "b": "40"}))


# --- the placeholder and the notebooks --------------------------------------------------------

def test_placeholder_answers_fail_quietly(capsys, converted):
    files = T.list_shards(converted, "train")
    fed = benchmark.FedTrainingResult([1.0], [1.0], [1.0], 1, 1)
    calls = [
        lambda: exercises.check_thread_budget(None),
        lambda: exercises.check_ranks_without_local_gpu(None),
        lambda: exercises.check_gpu_capabilities(None),
        lambda: exercises.check_shard_layout(None, converted),
        lambda: exercises.check_images_per_patient(None, synthetic.sample_records(20)),
        lambda: exercises.check_step_times(None, 30, 60),
        lambda: exercises.check_serial_decode(None, 100.0),
        lambda: exercises.check_worker_shares(None, files, 2, [1] * len(files)),
        lambda: exercises.check_which_is_faster(None, {"a": 1.0, "b": None}),
        lambda: exercises.check_resume(None, converted, None, None, 3),
        lambda: exercises.check_cam(None, None, None, (0,)),
        lambda: exercises.check_full_size_prediction(None, fed, lambda: (1.0, 1.0)),
        lambda: exercises.check_efficiency(None, 8, 1e6, 0.1, 1e-5, 1e-9),
        lambda: exercises.check_ps_shards(None),
        lambda: exercises.check_old_pipeline_efficiency(None, 70.0, 90.0, 2),
    ]
    for call in calls:
        assert verdict(capsys, call()) is False


def notebook_calls() -> set[str]:
    found: set[str] = set()
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            found |= set(re.findall(r"exercises\.(check_\w+)\(", "".join(cell["source"])))
    return found


def test_notebooks_call_existing_checks_and_every_check_is_used():
    called = notebook_calls()
    public = {name for name in exercises.__all__ if name.startswith("check_")}
    assert called - public == set(), "notebooks call checks that do not exist"
    assert public - called == set(), "checks no notebook uses"


def test_fit_conversion_record_ids_round_trip_through_the_labels():
    from chexnet_utils.notebook.exercises import fit_conversion as fc

    assert [fc.label_id(fc.id_label(i)) for i in range(200)] == list(range(200))
    assert all(sum(fc.id_label(i)) > 0 for i in range(200))      # never an all-zero label


def test_fit_conversion_names_an_error_with_its_hint():
    from chexnet_utils.notebook.exercises import fit_conversion as fc

    ranks = [{"rank": 0, "error": "AttributeError: 'Variable' object has no attribute 'ref'"}]
    assert "v.value" in fc.fit_conversion_problems(ranks)[0]


def test_uneven_shards_verdicts(capsys):
    from chexnet_utils.training.experiments import join_problem

    ok = [{"rank": 0, "batches": 4, "ran": 4, "end": "e"}, {"rank": 1, "batches": 2, "ran": 2,
                                                           "end": "e"}]
    assert join_problem(ok) is None
    assert "broadcast" in join_problem([ok[0], {**ok[1], "end": "x"}])
    assert "all their batches" in join_problem([ok[0], {**ok[1], "ran": 1}])
    assert "optimizer.variables" in join_problem([ok[0], {**ok[1], "after": "y"}])  # Adam's state
    assert exercises.check_uneven_shards(None) is False


def test_uneven_shards_error_is_reported_not_raised():
    from chexnet_utils.training.experiments import join_problem

    ranks = [{"rank": r, "batches": 2, "ran": 2, "end": "e",
              "error": "TypeError: Expected int for argument 'root_rank'"} for r in range(2)]
    assert "int(...)" in join_problem(ranks)
