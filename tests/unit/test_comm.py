"""Gradient communication (notebook 05), pure part: message sizes, bandwidth, the numpy
simulations of ring all-reduce and parameter server, the alpha-beta fit, the timeline parser."""


import numpy as np
import pytest

from chexnet_utils import comm

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

# a backslash at the end of a line inside these strings joins it to the next: each string
# holds the same lines as the timeline Horovod writes
HEAD = """[
{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros":1}},
{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grad_0"}},
{"name": "process_sort_index", "ph": "M", "pid": 1, "args": {"sort_index": 1}},
{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 100, "pid": 1},\
{"ph": "X", "name": "0", "ts": 101, "pid": 1, "dur": 0},\
{"ph": "X", "name": "1", "ts": 150, "pid": 1, "dur": 0},{"ph": "E", "ts": 151, "pid": 1},
{"ph": "B", "name": "ALLREDUCE", "ts": 160, "pid": 1},\
{"ph": "B", "name": "MEMCPY_IN_FUSION_BUFFER", "ts": 161, "pid": 1},\
{"ph": "E", "ts": 170, "pid": 1},
{"ph": "B", "name": "MPI_ALLREDUCE", "ts": 171, "pid": 1},{"ph": "E", "ts": 300, "pid": 1},\
{"ph": "E", "ts": 310, "pid": 1, "args": {"dtype": "float32", "shape": "[10]"}}"""
MORE = """,
{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 400, "pid": 1},{"ph": "E", "ts": 420, "pid": 1},\
{"ph": "B", "name": "ALLREDUCE", "ts": 430, "pid": 1},\
{"ph": "B", "name": "MPI_ALLREDUCE", "ts": 431, "pid": 1},{"ph": "E", "ts": 500, "pid": 1},"""


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
