"""The package functions notebooks 04 and 05 call instead of defining their own helpers:
the cost model's prediction table, the fusion bursts, idle CPU (the engine training
config: tests/unit/test_run_configs.py)."""

from __future__ import annotations

import subprocess
import sys

from chexnet_utils.comm import costmodel, experiments


def test_predict_efficiencies_is_the_cost_model_per_model_and_worker_count():
    grads = {"a": 28e6, "b": 94e6}
    table = costmodel.predict_efficiencies(grads, (2, 64), 0.1, 10e-6, 1e-9, overhead_s=2e-3)
    assert list(table) == ["a_2", "a_64", "b_2", "b_64"]
    row = table["b_64"]
    assert (row["model"], row["workers"]) == ("b", 64)
    assert row["ring_s"] == costmodel.predict_ring(64, 94e6, 10e-6, 1e-9, overhead_s=2e-3)
    assert row["ps_s"] == costmodel.predict_ps(64, 94e6, 10e-6, 1e-9, overhead_s=2e-3)
    assert row["ring_eff"] == costmodel.scaling_efficiency_prediction(
        64, 94e6, 0.1, 10e-6, 1e-9, "ring", overhead_s=2e-3)
    # the parameter server's link carries N x size: it falls behind the ring as N grows
    assert table["a_64"]["ps_eff"] < table["a_2"]["ps_eff"]
    assert table["a_64"]["ps_eff"] < table["a_64"]["ring_eff"]


class _Cluster:
    """Records what would have run on the engines; rank 0's answer is the element count."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def run(self, fn, *args, **kwargs):  # noqa: ANN001, ANN201
        self.calls.append((fn, args, kwargs))
        return [{"n": len(args[0]), "rank": 0}, {"n": len(args[0]), "rank": 1}]


def test_run_bursts_runs_each_burst_and_keeps_rank_0():
    cluster = _Cluster()
    out = experiments.run_bursts(cluster, {"big": [10, 20], "small": [1] * 5}, repeats=3)
    assert out == {"big": {"n": 2, "rank": 0}, "small": {"n": 5, "rank": 0}}
    fn, args, kwargs = cluster.calls[0]
    assert fn is experiments.allreduce_burst_times
    assert args == ([10, 20], 3) and kwargs["stream_rank0"] is False


def test_idle_cpu_percent_tells_a_sleeping_from_a_spinning_process():
    ready = "print('ready', flush=True)\n"
    procs = [subprocess.Popen([sys.executable, "-c", ready + code], stdout=subprocess.PIPE,
                              text=True)
             for code in ("import time; time.sleep(60)", "while True: pass")]
    try:
        assert [p.stdout.readline() for p in procs] == ["ready\n"] * 2  # started up: a handshake
        sleeping, spinning = experiments.idle_cpu_percent([p.pid for p in procs],
                                                               seconds=0.5)
    finally:
        for p in procs:
            p.kill()
            p.wait()
            p.stdout.close()
    assert sleeping < 5 < spinning
