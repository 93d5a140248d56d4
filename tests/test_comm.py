"""Gradient communication (notebook 05): cost model, timeline parser, PS vs ring on engines."""

import json
import subprocess
import sys
import textwrap

import cloudpickle
import numpy as np
import pytest

from chexnet_utils import comm

# the engines cannot import this test module: send its functions by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MIB = comm.MIB


# -- sizes and bandwidth -------------------------------------------------------------------

def test_message_sizes_cover_the_range_in_float32_multiples():
    sizes = comm.message_sizes(32 * MIB)
    assert sizes[0] == 1024 and sizes[-1] == 32 * MIB and len(sizes) == 16
    assert all(s % 4 == 0 for s in sizes) and sizes == sorted(set(sizes))
    assert comm.message_sizes(3000, min_bytes=1024) == [1024, 2048, 3000]
    assert comm.format_bytes(1024) == "1 KiB" and comm.format_bytes(32 * MIB) == "32 MiB"
    with pytest.raises(ValueError):
        comm.message_sizes(512, min_bytes=1024)


def test_max_message_size_follows_scale_and_env(monkeypatch):
    monkeypatch.delenv("CHEXNET_COMM_MAX_MB", raising=False)
    assert comm.default_max_bytes("ci") == 32 * MIB
    assert comm.default_max_bytes("gpu-node") == 256 * MIB
    monkeypatch.setenv("CHEXNET_COMM_MAX_MB", "4")
    assert comm.default_max_bytes("gpu-node") == 4 * MIB


def test_bus_bandwidth_factors():
    assert comm.algbw(1e9, 1.0) == 1e9
    assert comm.busbw("ring", 1e9, 1.0, 2) == pytest.approx(1e9)          # 2(N-1)/N = 1
    assert comm.busbw("ring", 1e9, 1.0, 8) == pytest.approx(1e9 * 14 / 8)
    assert comm.busbw("ps", 1e9, 1.0, 8) == pytest.approx(8e9)
    assert comm.busbw("ps", 1e9, 1.0, 8, colocated_server=True) == pytest.approx(7e9)
    with pytest.raises(ValueError):
        comm.busbw("tree", 1, 1, 2)


# -- the algorithms in numpy -----------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_simulated_ring_allreduce_averages_and_sends_2_n_minus_1_over_n(n):
    rng = np.random.default_rng(n)
    arrays = [rng.standard_normal(1000).astype(np.float32) for _ in range(n)]
    sim = comm.simulate_ring_allreduce(arrays)
    mean = np.mean(np.asarray(arrays, dtype=np.float64), axis=0)
    for r in sim["result"]:
        np.testing.assert_allclose(r, mean, rtol=1e-12, atol=1e-12)
    assert sim["steps"] == 2 * (n - 1)
    # chunks of 1000/n elements (array_split: sizes differ by at most one element)
    for sent in sim["sent_bytes"]:
        assert sent == pytest.approx(2 * (n - 1) / n * 4000, abs=2 * (n - 1) * 4)
    assert sum(sim["sent_bytes"]) == 2 * (n - 1) * 4000


def test_simulated_parameter_server_loads_one_link():
    arrays = [np.full(250, float(i), np.float32) for i in range(4)]
    ded = comm.simulate_parameter_server(arrays)
    assert ded["server_in_bytes"] == ded["server_out_bytes"] == 4 * 1000
    col = comm.simulate_parameter_server(arrays, server=0)
    assert col["server_in_bytes"] == 3 * 1000 and col["worker_sent_bytes"][0] == 0
    for r in col["result"]:
        np.testing.assert_allclose(r, 1.5)


# -- alpha-beta model ------------------------------------------------------------------------

SIZES = np.array(comm.message_sizes(64 * MIB), dtype=float)


@pytest.mark.parametrize("algorithm,n,colocated", [("linear", 2, False), ("ring", 2, False),
                                                   ("ring", 8, False), ("ps", 2, True),
                                                   ("ps", 4, False)])
def test_fit_recovers_alpha_beta_noise_free(algorithm, n, colocated):
    alpha, beta = 25e-6, 0.4e-9
    t = [comm.predict(algorithm, n, s, alpha, beta, colocated) for s in SIZES]
    a, b = comm.fit_alpha_beta(SIZES, t, algorithm, n, colocated)
    assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(beta, rel=1e-6)
    a2, b2 = comm.fit_alpha_beta(SIZES, t, algorithm, n, colocated, relative=False)
    assert a2 == pytest.approx(alpha, rel=1e-4) and b2 == pytest.approx(beta, rel=1e-6)


def test_fit_recovers_alpha_beta_with_noise():
    rng = np.random.default_rng(0)
    alpha, beta = 0.5e-3, 2.5e-9
    exact = np.array([comm.predict_ring(2, s, alpha, beta) for s in SIZES])
    noisy = exact * (1 + 0.03 * rng.standard_normal(exact.size))
    a, b = comm.fit_alpha_beta(SIZES, noisy, "ring", 2)
    assert a == pytest.approx(alpha, rel=0.05) and b == pytest.approx(beta, rel=0.05)


def test_fit_never_returns_negative_parameters():
    sizes = [1e3, 1e4, 1e5, 1e6]
    a, b = comm.fit_alpha_beta(sizes, [1e-3, 0.9e-3, 0.8e-3, 0.7e-3])  # time falls with size
    assert a > 0 and b == 0
    a, b = comm.fit_alpha_beta(sizes, [1e-6, 1e-5, 1e-4, 1e-3])          # pure bandwidth
    assert a == pytest.approx(0, abs=1e-12) and b == pytest.approx(1e-9, rel=1e-6)
    with pytest.raises(ValueError):
        comm.fit_alpha_beta([1, 2], [1.0, -1.0])


def test_predictions_ring_flat_ps_linear_and_efficiency():
    alpha, beta, size = 10e-6, 1e-9, 28e6
    ring = [comm.predict_ring(n, size, alpha, beta) for n in (2, 8, 64, 256)]
    ps = [comm.predict_ps(n, size, alpha, beta) for n in (2, 8, 64, 256)]
    assert comm.predict_ring(1, size, alpha, beta) == 0.0
    assert ring[-1] < 2 * size * beta + 2 * 255 * alpha + 1e-12  # bandwidth term saturates
    assert ps[-1] / ps[1] == pytest.approx(256 / 8, rel=0.01)      # grows with N
    assert comm.predict_ring(8, size, alpha, beta, overhead_s=1e-3) == pytest.approx(
        ring[1] + 1e-3)
    eff = [comm.scaling_efficiency_prediction(n, size, 0.1, alpha, beta) for n in (1, 8, 256)]
    assert eff[0] == 1.0 and 1 > eff[1] > eff[2] > 0
    assert comm.scaling_efficiency_prediction(8, size, 0.1, alpha, beta, overlap=1.0) == 1.0
    unfused = comm.scaling_efficiency_prediction(256, size, 0.1, alpha, beta, n_messages=364)
    assert unfused < eff[2]
    ps_eff = comm.scaling_efficiency_prediction(64, size, 0.1, alpha, beta, algorithm="ps")
    assert ps_eff < comm.scaling_efficiency_prediction(64, size, 0.1, alpha, beta)


# -- timeline parser ---------------------------------------------------------------------------

HEAD = """[
{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros":1}},
{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grad_0"}},
{"name": "process_sort_index", "ph": "M", "pid": 1, "args": {"sort_index": 1}},
{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 100, "pid": 1},{"ph": "X", "name": "0", "ts": 101, "pid": 1, "dur": 0},{"ph": "X", "name": "1", "ts": 150, "pid": 1, "dur": 0},{"ph": "E", "ts": 151, "pid": 1},
{"ph": "B", "name": "ALLREDUCE", "ts": 160, "pid": 1},{"ph": "B", "name": "MEMCPY_IN_FUSION_BUFFER", "ts": 161, "pid": 1},{"ph": "E", "ts": 170, "pid": 1},
{"ph": "B", "name": "MPI_ALLREDUCE", "ts": 171, "pid": 1},{"ph": "E", "ts": 300, "pid": 1},{"ph": "E", "ts": 310, "pid": 1, "args": {"dtype": "float32", "shape": "[10]"}}"""
MORE = """,
{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 400, "pid": 1},{"ph": "E", "ts": 420, "pid": 1},{"ph": "B", "name": "ALLREDUCE", "ts": 430, "pid": 1},{"ph": "B", "name": "MPI_ALLREDUCE", "ts": 431, "pid": 1},{"ph": "E", "ts": 500, "pid": 1},"""


def test_parse_timeline_matches_begin_end_and_tolerates_an_open_file(tmp_path):
    closed = comm.parse_timeline(text=HEAD + "\n]\n")
    phases = [(e.phase, e.start_us, e.duration_us, e.depth) for e in closed]
    assert ("NEGOTIATE_ALLREDUCE", 100, 51, 0) in phases
    assert ("MPI_ALLREDUCE", 171, 129, 1) in phases
    assert ("ALLREDUCE", 160, 150, 0) in phases
    assert [e.rank for e in closed if e.phase == "READY"] == [0, 1]
    assert all(e.complete and e.tensor == "grad_0" for e in closed)
    assert closed == sorted(closed, key=lambda e: (e.start_us, e.depth))
    # Horovod still writing: no closing bracket, a trailing comma, the last ALLREDUCE open
    path = tmp_path / "open.json"
    path.write_text(HEAD + MORE)
    events = comm.parse_timeline(path)
    open_spans = [e for e in events if not e.complete]
    assert [(e.phase, e.start_us, e.end_us) for e in open_spans] == [("ALLREDUCE", 430, 500)]
    assert len([e for e in events if e.phase == "NEGOTIATE_ALLREDUCE"]) == 2
    # cut in the middle of an object: everything before it is kept
    cut = HEAD[: HEAD.index('"ts": 300') + 4]
    assert [e.phase for e in comm.parse_timeline(text=cut) if e.complete][-1] == \
        "MEMCPY_IN_FUSION_BUFFER"
    assert comm.parse_timeline(text="") == []
    summary = comm.timeline_summary(closed)
    assert summary["MPI_ALLREDUCE"]["count"] == 1
    assert summary["MPI_ALLREDUCE"]["total_ms"] == pytest.approx(0.129)


def test_busy_time_is_the_union_of_intervals():
    ev = [comm.TimelineEvent("a", "ALLREDUCE", 0, 10), comm.TimelineEvent("b", "ALLREDUCE", 5, 10),
          comm.TimelineEvent("c", "ALLREDUCE", 30, 5), comm.TimelineEvent("c", "QUEUE", 0, 99)]
    assert comm.busy_time_us(ev, ["ALLREDUCE"]) == 20
    assert comm.busy_time_us(ev, ["NOTHING"]) == 0


def test_short_tensor_names():
    assert comm.short_tensor_name("HorovodGroupedAllreduce_a_b_c_3of17") == "group member 3/17"
    assert comm.short_tensor_name("grad_4") == "grad_4"
    assert len(comm.short_tensor_name("x" * 100)) == 32


RECORD = textwrap.dedent("""
    import time
    import horovod.tensorflow as hvd
    import tensorflow as tf
    hvd.init()
    for i in range(4):
        hvd.allreduce(tf.ones([1000 * (i + 1)]), op=hvd.Average).numpy()
    hvd.broadcast(tf.ones([10]), root_rank=0).numpy()
    hvd.allreduce(tf.ones([7]), op=hvd.Sum).numpy()  # may be lost: see below
    time.sleep(0.5)  # let rank 0's writer thread drain its queue
    hvd.shutdown()
""")


@pytest.mark.mpi
def test_timeline_recorded_by_horovod_is_parsed(tmp_path):
    from chexnet_utils.distributed import mpi_environment, mpirun_command

    script = tmp_path / "record.py"
    script.write_text(RECORD)
    path = tmp_path / "timeline.json"
    env = mpi_environment(2)
    env["HOROVOD_TIMELINE"] = str(path)
    cmd = mpirun_command(2, ["python", str(script)], extra=["-x", "HOROVOD_TIMELINE"])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert comm.wait_for_timeline(path, timeout=10)
    text = path.read_text()
    json.loads(text)  # hvd.shutdown() closed the array
    events = comm.parse_timeline(path)
    phases = {e.phase for e in events}
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "MPI_ALLREDUCE", "READY", "BROADCAST"} <= phases
    shapes = [e.args.get("shape") for e in events if e.phase == "ALLREDUCE"]
    assert {"[1000]", "[2000]", "[3000]", "[4000]"} <= set(shapes)
    assert all(e.duration_us >= 0 for e in events)
    # hvd.shutdown() closes the array but may drop the last records (seen with Horovod
    # 0.28: the op just before shutdown left half-written): everything up to the broadcast
    # is complete
    bcast_end = max(e.end_us for e in events if e.phase == "BROADCAST")
    assert all(e.complete for e in events if e.end_us <= bcast_end)
    # the same file cut at 60 %, as if read while Horovod was still writing it
    partial = comm.parse_timeline(text=text[: int(len(text) * 0.6)])
    assert 0 < len(partial) < len(events)
    assert comm.wait_for_timeline(tmp_path / "missing.json", timeout=0.3) is False


# -- on two Horovod engines -------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    from chexnet_utils.distributed import MPICluster

    with MPICluster(n=2, env={"HOROVOD_TIMELINE": "DYNAMIC"}) as c:
        ports = c.run(comm.free_local_port)
        # MultiWorkerMirroredStrategy first: before any other TensorFlow op in the engines
        setup = c.run(comm.mwms_setup_on_engine, ports, timeout=120)
        assert [s["replicas"] for s in setup] == [2, 2]
        yield c


@pytest.mark.mpi
def test_ring_and_ps_times_on_two_engines(cluster):
    sizes = [1024, 64 * 1024, 1024 * 1024]
    ring, _ = cluster.run(comm.allreduce_times, sizes, 3, timeout=120)
    ps, _ = cluster.run(comm.parameter_server_times, sizes, 3, timeout=120)
    mpi_ps, _ = cluster.run(comm.parameter_server_times, sizes, 2, backend="mpi", timeout=120)
    mpi_ring, _ = cluster.run(comm.allreduce_times, sizes, 2, backend="mpi", timeout=120)
    for res in (ring, ps, mpi_ps, mpi_ring):
        assert res["size"] == 2 and res["sizes_bytes"] == sizes
        assert len(res["times_s"]) == 3 and all(t > 0 for t in res["times_s"] + res["min_s"])
        assert all(len(r) == 3 or len(r) == 2 for r in res["runs_s"])
    # the PS reduction is an average, exactly what hvd.allreduce(op=Average) computes
    assert max(ps["max_abs_diff_vs_allreduce"]) < 1e-6
    assert max(mpi_ps["max_abs_diff_vs_allreduce"]) < 1e-6
    fp16, _ = cluster.run(comm.allreduce_times, [4096], 2, compression="fp16", timeout=60)
    assert 0 < fp16["max_rel_error"][0] < 2e-3  # float16 keeps ~3 decimal digits


@pytest.mark.mpi
def test_ps_average_matches_allreduce_values(cluster):
    def both():
        import horovod.tensorflow as hvd
        import tensorflow as tf

        hvd.init()
        x = tf.constant(np.arange(10, dtype=np.float32) * (hvd.rank() + 1))
        return (comm.ps_average(x).numpy().tolist(),
                hvd.allreduce(x, op=hvd.Average).numpy().tolist())

    for ps, ring in cluster.run(both):
        assert ps == ring == pytest.approx((np.arange(10) * 1.5).tolist())


@pytest.mark.mpi
def test_burst_and_training_steps_with_both_back_ends(cluster, tmp_path):
    burst, _ = cluster.run(comm.allreduce_burst_times, [10, 1000, 5000], 2, timeout=120)
    assert burst["n_tensors"] == 3 and burst["median_s"] > 0
    cfg = {"arch": "small", "image_size": 32, "batch_size": 4, "steps": 2, "warmup_steps": 1}
    timeline = tmp_path / "tl.json"
    hvd_res = cluster.run(comm.throughput_on_engine, "horovod", cfg,
                          timeline_path=str(timeline), timeline_steps=2, timeout=180)
    mwms_res = cluster.run(comm.throughput_on_engine, "mwms", cfg, timeout=180)
    for res in (hvd_res, mwms_res):
        assert [r["rank"] for r in res] == [0, 1] and all(r["img_per_s"] > 0 for r in res)
        # gradients averaged: both workers hold the same weights
        assert res[0]["weights_checksum"] == pytest.approx(res[1]["weights_checksum"],
                                                           rel=1e-9)
    # same seed, same data, same SGD steps (the timeline steps come after the checksum):
    # both back ends averaged the same gradients, so the weights moved by the same amount
    # (a sum instead of a mean would double it)
    assert hvd_res[0]["update_norm"] > 0
    assert mwms_res[0]["update_norm"] == pytest.approx(hvd_res[0]["update_norm"], rel=1e-3)
    assert hvd_res[0]["timeline_path"] == str(timeline) and hvd_res[1]["timeline_path"] is None
    assert comm.wait_for_timeline(timeline, timeout=10)
    events = comm.parse_timeline(timeline)
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"} <= {e.phase for e in events}


def test_gradient_sizes_small_model(tmp_path):
    sizes = comm.chexnet_gradient_sizes(("small",), cache=tmp_path / "g.json")
    g = sizes["small"]
    assert g["grad_bytes"] == 4 * g["trainable_params"] == 4 * sum(g["tensor_elems"])
    assert g["trainable_params"] <= g["params"] and g["n_tensors"] == len(g["tensor_elems"])
    assert json.loads((tmp_path / "g.json").read_text())["small"]["params"] == g["params"]
