"""The pure part of Horovod data-parallel training (notebook 04): the scaling efficiency
formula. The training on ipyparallel MPI engines is in tests/mpi/test_horovod_training.py."""

import pytest


def test_efficiency_formula():
    from chexnet_utils.bench.scaling import efficiency

    assert efficiency({1: 100.0, 2: 180.0, 4: 200.0}) == {1: 1.0, 2: 0.9, 4: 0.5}
    with pytest.raises(ValueError):
        efficiency({2: 10.0})


def test_bench_scaling_cli_wiring_with_a_fake_cluster(monkeypatch, tmp_path):
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
