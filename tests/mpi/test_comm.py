"""Gradient communication (notebook 05) on MPI: a Horovod timeline recorded by mpirun, PS vs
ring all-reduce and both training back ends on two ipyparallel engines."""

import json
import subprocess
import sys
import textwrap

import cloudpickle
import numpy as np
import pytest

from chexnet_utils import comm
from chexnet_utils.bench import engine_steps

# the engines cannot import this test module: send its functions by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])


RECORD = textwrap.dedent("""
    import os
    import time
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from chexnet_utils.comm.timeline import parse_timeline

    def broadcast_on_disk():
        try:
            events = parse_timeline(os.environ["HOROVOD_TIMELINE"])
        except OSError:
            return False
        return any(e.phase == "BROADCAST" and e.complete for e in events)

    hvd.init()
    for i in range(4):
        hvd.allreduce(tf.ones([1000 * (i + 1)]), op=hvd.Average).numpy()
    hvd.broadcast(tf.ones([10]), root_rank=0).numpy()
    hvd.allreduce(tf.ones([7]), op=hvd.Sum).numpy()  # may be lost: see below
    # Handshake instead of a sleep: rank 0's writer thread writes the queued records in
    # order but flushes only with a new tensor's header, and hvd.shutdown() drops what it
    # has not written. A new tensor makes it flush; rank 0 then waits until the broadcast
    # (and so everything before it) is in the file, while the other ranks wait for it in
    # the second allreduce.
    hvd.allreduce(tf.zeros([1]), op=hvd.Sum, name="timeline_flush").numpy()
    if hvd.rank() == 0:
        deadline = time.monotonic() + 60
        while not broadcast_on_disk():
            if time.monotonic() > deadline:
                raise SystemExit("the broadcast never reached the timeline file")
            time.sleep(0.05)
    hvd.allreduce(tf.zeros([1]), op=hvd.Sum, name="timeline_checked").numpy()
    hvd.shutdown()
""")


@pytest.mark.mpi
def test_timeline_recorded_by_horovod_is_parsed(tmp_path):
    from chexnet_utils.cluster.distributed import mpi_environment, mpirun_command

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
    from chexnet_utils.cluster.distributed import MPICluster

    with MPICluster(n=2, env={"HOROVOD_TIMELINE": "DYNAMIC"}) as c:
        ports = c.run(comm.free_port)
        # MultiWorkerMirroredStrategy first: before any other TensorFlow op in the engines
        setup = c.run(engine_steps.mwms_setup_on_engine, ports, timeout=120)
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
    hvd_res = cluster.run(engine_steps.backend_throughput_on_engine, "horovod", cfg,
                          timeline_path=str(timeline), timeline_steps=2, timeout=180)
    mwms_res = cluster.run(engine_steps.backend_throughput_on_engine, "mwms", cfg, timeout=180)
    for res in (hvd_res, mwms_res):
        assert [r["rank"] for r in res] == [0, 1] and all(r["img_per_s"] > 0 for r in res)
        # gradients averaged: both workers hold the same weights
        assert res[0]["weights_checksum"] == res[1]["weights_checksum"]  # sha256, bit for bit
    # same seed, same data, same SGD steps (the timeline steps come after the checksum):
    # both back ends averaged the same gradients, so the weights moved by the same amount
    # (a sum instead of a mean would double it)
    assert hvd_res[0]["update_norm"] > 0
    assert mwms_res[0]["update_norm"] == pytest.approx(hvd_res[0]["update_norm"], rel=1e-3)
    assert hvd_res[0]["timeline_path"] == str(timeline) and hvd_res[1]["timeline_path"] is None
    assert comm.wait_for_timeline(timeline, timeout=10)
    events = comm.parse_timeline(timeline)
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"} <= {e.phase for e in events}
