"""The pure part of Horovod data-parallel training (notebook 04): the scaling efficiency
formula, the typed scaling result (its figures, table and JSON). The training on ipyparallel
MPI engines is in tests/mpi/test_horovod_training.py."""

import pytest


def test_efficiency_formula():
    from chexnet_utils.bench.scaling import efficiency

    assert efficiency({1: 100.0, 2: 180.0, 4: 200.0}) == {1: 1.0, 2: 0.9, 4: 0.5}
    with pytest.raises(ValueError):
        efficiency({2: 10.0})


def test_bench_scaling_cli_wiring_with_a_fake_cluster(monkeypatch, tmp_path, capsys):
    """``bench scaling``'s wiring, in a second: the CLI's options reach every engine run, the
    runs alternate pipelines and modes on one cluster per worker count, and the JSON holds
    the rates, the efficiency and the engines' real environment. The fake stands in for
    the engines only: its ``env_overrides`` is MPICluster's own. What the engines measure
    is notebook 04's scaling cell (under nbval) and
    ``tests/mpi/test_horovod_training.py::test_emulated_step_waits_for_the_device_and_averages_across_engines``.
    """
    import json

    from chexnet_utils.cli import main
    from chexnet_utils.cluster import distributed

    clusters: list[dict] = []

    class FakeCluster(distributed.MPICluster):
        def start(self):
            self.start_seconds = 0.5
            clusters.append({"n": self.n, "bind_to": self.bind_to, "env": dict(self.env),
                             "runs": []})
            return self

        def stop(self):
            self.stop_seconds = 0.1

        def run(self, fn, cfg, stream_rank0=True, timeout=None):
            assert fn.__name__ == "throughput_on_engine" and stream_rank0 is False
            clusters[-1]["runs"].append((cfg["pipeline"], cfg["accelerator_ms"]))
            assert (cfg["image_size"], cfg["batch_size"], cfg["steps"],
                    cfg["warmup_steps"]) == (32, 4, 2, 1)
            # the new pipeline is twice as fast; 2 workers scale at 90 %
            rate = (200.0 if cfg["pipeline"] == "new" else 100.0) * self.n * (
                0.9 if self.n > 1 else 1.0)
            return [{"rank": r, "img_per_s": rate} for r in range(self.n)]

    monkeypatch.setattr(distributed, "MPICluster", FakeCluster)
    out = tmp_path / "scaling.json"
    assert main(["bench", "scaling", "--workers", "1,2", "--tfrecords", str(tmp_path),
                 "--image-size", "32", "--batch-size", "4", "--steps", "2", "--warmup", "1",
                 "--repeats", "2", "--emulate-accelerator", "5",
                 "--env", "HOROVOD_CYCLE_TIME=2", "--json", str(out)]) == 0
    assert [c["n"] for c in clusters] == [1, 2]  # one cluster per worker count, in order
    for c in clusters:
        assert c["bind_to"] == "core" and c["env"]["HOROVOD_CYCLE_TIME"] == "2"
        assert c["env"]["TF_NUM_INTRAOP_THREADS"] == "1"  # bound: one thread per core
        # CPU model first, then the emulated device; each repeat flips the pipeline order
        assert c["runs"] == [("old", 0.0), ("new", 0.0), ("new", 0.0), ("old", 0.0),
                             ("old", 5.0), ("new", 5.0), ("new", 5.0), ("old", 5.0)]
    printed = capsys.readouterr().out.splitlines()  # the ScalingResult's table
    cpu_at = printed.index("model on the CPU (one core per worker):")
    assert printed[cpu_at + 3] == "       2         180.0   0.90         360.0   0.90"
    assert printed[cpu_at + 4].startswith("emulated accelerator (5 ms per step")
    r = json.loads(out.read_text())
    assert r["env"] == {"HOROVOD_CYCLE_TIME": "2"} and r["warmup_steps"] == 1
    for n in ("1", "2"):  # what the engines run with is recorded, from MPICluster's logic
        assert r["engine_env"][n]["HOROVOD_CYCLE_TIME"] == "2"
        assert r["engine_env"][n]["TF_NUM_INTRAOP_THREADS"] == "1"
    assert r["engine_env"]["2"]["OMPI_MCA_mpi_yield_when_idle"] == "1"  # each bound to a core
    assert r["cluster_seconds"]["2"] == {"start_s": 0.5, "stop_s": 0.1}
    assert r["emulated"]["accelerator_ms"] == 5.0
    for block in (r, r["emulated"]):
        assert block["img_per_s"] == {"old": {"1": 100.0, "2": 180.0},
                                      "new": {"1": 200.0, "2": 360.0}}
        assert block["runs"]["new"]["2"] == [360.0, 360.0]  # both repeats kept
        for p in ("old", "new"):
            assert block["efficiency"][p] == pytest.approx({"1": 1.0, "2": 0.9})


def _scaling_result(emulated: bool = True):
    from chexnet_utils.bench.scaling import ClusterSeconds, ScalingBlock, ScalingResult

    cpu = ScalingBlock(runs={"old": {1: [90.0, 110.0], 2: [150.0]},
                             "new": {1: [100.0], 2: [190.0, 170.0]}})
    accel = ScalingBlock(runs={"old": {1: [50.0], 2: [50.0]}, "new": {1: [60.0], 2: [120.0]}},
                         accelerator_ms=25.0)
    return ScalingResult(
        workers=[1, 2], pipelines=["old", "new"], arch="small", image_size=64,
        batch_size_per_worker=8, steps=10, warmup_steps=20, repeats=2, bind_to="core", cores=2,
        env={"HOROVOD_CYCLE_TIME": "2"}, tfrecords="/data/tfr", cpu=cpu,
        engine_env={1: {"OMP_NUM_THREADS": "1"}, 2: {"OMP_NUM_THREADS": "1"}},
        cluster_seconds={1: ClusterSeconds(3.0, 0.5), 2: ClusterSeconds(4.0, 0.6)},
        emulated=accel if emulated else None)


def test_scaling_results_of_two_cells_merge_into_one():
    """Notebook 04 times 1 worker and N workers in two cells; merged, they are the one
    measurement bench_scaling would return for both."""
    import dataclasses

    import pytest

    whole = _scaling_result()

    def only(n):
        def block(b):
            return dataclasses.replace(b, runs={p: {n: v[n]} for p, v in b.runs.items()})
        return dataclasses.replace(whole, workers=[n], cpu=block(whole.cpu),
                                   emulated=block(whole.emulated),
                                   engine_env={n: whole.engine_env[n]},
                                   cluster_seconds={n: whole.cluster_seconds[n]})

    assert only(1).merged(only(2)) == whole
    assert only(1).merged(only(2)).efficiency == {"old": {1: 1.0, 2: 0.75},
                                                  "new": {1: 1.0, 2: 0.9}}
    with pytest.raises(ValueError, match="both measured worker counts"):
        whole.merged(only(2))
    with pytest.raises(ValueError, match="steps"):
        only(1).merged(dataclasses.replace(only(2), steps=99))
    with pytest.raises(ValueError, match="emulated"):
        only(1).merged(dataclasses.replace(only(2), emulated=None))


def test_scaling_result_derived_figures_and_table():
    """Means over the repeats and the efficiency from known runs, and the table's text."""
    r = _scaling_result()
    assert r.img_per_s == {"old": {1: 100.0, 2: 150.0}, "new": {1: 100.0, 2: 180.0}}
    assert r.efficiency == {"old": {1: 1.0, 2: 0.75}, "new": {1: 1.0, 2: 0.9}}
    assert r.runs["new"][2] == [190.0, 170.0] and r.cpu.accelerator_ms == 0.0
    assert r.emulated is not None and r.emulated.efficiency["old"][2] == 0.5
    assert r.emulated.efficiency["new"][2] == 1.0
    assert str(r).splitlines() == [
        "small at 64 px, batch 8/worker, 10 timed steps, bind-to core, 2 cores",
        "model on the CPU (one core per worker):",
        " workers     old img/s   eff.     new img/s   eff.",
        "       1         100.0   1.00         100.0   1.00",
        "       2         150.0   0.75         180.0   0.90",
        "emulated accelerator (25 ms per step; the core only feeds it):",
        " workers     old img/s   eff.     new img/s   eff.",
        "       1          50.0   1.00          60.0   1.00",
        "       2          50.0   0.50         120.0   1.00"]
    assert "emulated" not in str(_scaling_result(emulated=False))
    # without a 1-worker run there is no efficiency, and the table says nan
    from chexnet_utils.bench.scaling import ScalingBlock

    assert ScalingBlock(runs={"new": {2: [10.0]}}).efficiency == {}


def test_scaling_result_json_keeps_the_old_layout():
    """``as_dict()`` has the keys of the dict bench_scaling returned before it was typed;
    written as JSON, worker counts become strings and the numbers survive the round trip."""
    import json

    from chexnet_utils.platform.atomic import json_safe

    d = json.loads(json.dumps(json_safe(_scaling_result())))
    assert list(d) == ["workers", "pipelines", "arch", "image_size", "batch_size_per_worker",
                       "steps", "warmup_steps", "repeats", "bind_to", "cores", "env",
                       "tfrecords", "img_per_s", "efficiency", "runs", "engine_env",
                       "cluster_seconds", "emulated"]
    assert d["img_per_s"] == {"old": {"1": 100.0, "2": 150.0}, "new": {"1": 100.0, "2": 180.0}}
    assert d["efficiency"]["new"] == {"1": 1.0, "2": 0.9}
    assert d["runs"]["old"]["1"] == [90.0, 110.0]
    assert d["engine_env"]["2"] == {"OMP_NUM_THREADS": "1"}
    assert d["cluster_seconds"]["2"] == {"start_s": 4.0, "stop_s": 0.6}
    assert list(d["emulated"]) == ["accelerator_ms", "img_per_s", "efficiency", "runs"]
    assert d["emulated"]["accelerator_ms"] == 25.0
    assert d["emulated"]["efficiency"]["old"] == {"1": 1.0, "2": 0.5}
    assert "emulated" not in _scaling_result(emulated=False).as_dict()
