"""The tf.data service of :mod:`chexnet_utils.input.tfdata_service`: dispatcher and workers as
separate processes, every example exactly once in ``distributed_epoch`` mode (k times in
``parallel_epochs``), a clean teardown (no process, no open port), a dead worker seen by the
trainer in bounded time, and nothing left behind when the parent is SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from chexnet_utils.data import tfrecords as T
from chexnet_utils.input.tfdata_service import (
    ServiceStalled,
    TFDataService,
    distribute,
    next_within,
    port_open,
)
from chexnet_utils.platform.processes import alive, pid_alive
from tests.support.datasets import write_records

tf = pytest.importorskip("tensorflow")

N_SHARDS, PER_SHARD = 6, 5
NAMES = [f"{i + 1:08d}_000.png" for i in range(N_SHARDS * PER_SHARD)]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("svc-tfrecords")
    for s in range(N_SHARDS):
        recs = [T.make_example(b"not-an-image", "png", 1, 1, [0.0] * 14, NAMES[i], i)
                for i in range(s * PER_SHARD, (s + 1) * PER_SHARD)]
        write_records(root / T.shard_name("train", s, N_SHARDS), recs)
    return [str(f) for f in T.list_shards(root, "train")]


def names_pipeline(files: list[str]) -> tf.data.Dataset:
    """File names -> records -> image names: the source a distributed epoch splits is the
    list of files, as in the new approach."""
    ds = tf.data.Dataset.from_tensor_slices(files)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=2)
    return ds.map(lambda r: T.parse_example(r)["name"])


@pytest.fixture(scope="module")
def service():
    svc = TFDataService(num_workers=2).start()
    yield svc
    svc.stop()


def test_service_processes_are_separate_and_listening(service):
    assert len(service.workers) == 2 and service.dispatcher is not None
    assert os.getpid() not in service.pids and len(set(service.pids)) == 3
    assert all(pid_alive(p) for p in service.pids)
    assert all(port_open(p) for p in service.ports)
    assert service.target == f"grpc://127.0.0.1:{service.dispatcher.port}"
    # #27: each in its own session, out of this process's group: a notebook's Interrupt
    # (SIGINT to the kernel's process group) does not reach them, even while they start
    assert all(os.getsid(pid) == pid for pid in service.pids)
    assert os.getpgid(0) not in {os.getpgid(pid) for pid in service.pids}


def test_distributed_epoch_delivers_every_example_exactly_once(service, shards):
    got = [x.decode() for x in
           distribute(names_pipeline(shards), service.target, "distributed_epoch")
           .as_numpy_iterator()]
    counts = Counter(got)
    assert sorted(counts) == NAMES
    assert set(counts.values()) == {1}, {k: v for k, v in counts.items() if v != 1}


def test_parallel_epochs_gives_each_worker_the_whole_data_set(service, shards):
    got = Counter(x.decode() for x in
                  distribute(names_pipeline(shards), service.target, "parallel_epochs")
                  .as_numpy_iterator())
    assert sorted(got) == NAMES
    assert set(got.values()) == {len(service.workers)}


def test_unknown_processing_mode_is_refused(service, shards):
    with pytest.raises(ValueError, match="processing_mode"):
        distribute(names_pipeline(shards), service.target, "each_once")


def test_stop_leaves_no_process_and_no_open_port():
    svc = TFDataService(num_workers=1).start()
    procs = [psutil.Process(p) for p in svc.pids]
    ports = svc.ports
    report = svc.stop()
    assert report["left"] == [] and report["open_ports"] == []
    assert sorted(report["stopped"]) == sorted(p.pid for p in procs)
    assert alive(p.pid for p in procs) == []
    assert not any(port_open(p) for p in ports)
    assert svc.stop() == {"stopped": [], "left": [], "open_ports": []}  # twice is fine


def test_a_worker_killed_mid_epoch_stalls_the_trainer_in_bounded_time():
    with TFDataService(num_workers=1) as svc:
        ds = distribute(tf.data.Dataset.range(10**9), svc.target, "distributed_epoch")
        it = iter(ds)
        assert int(next_within(it, 30)) >= 0  # the epoch is running
        svc.kill_worker(0)
        t0 = time.monotonic()
        with pytest.raises(ServiceStalled):
            for _ in range(10**6):  # buffered elements first, then the wait
                next_within(it, 3.0)
        assert time.monotonic() - t0 < 30


def test_next_within_passes_values_and_end_of_data_through():
    it = iter([1, 2])
    assert next_within(it, 1) == 1 and next_within(it, 1) == 2
    with pytest.raises(StopIteration):
        next_within(it, 1)


def test_a_sigkilled_parent_leaves_no_service_process(tmp_path):
    script = ("import json, time\n"
              "from chexnet_utils.input.tfdata_service import TFDataService\n"
              "svc = TFDataService(num_workers=1).start()\n"
              "print(json.dumps({'pids': svc.pids, 'ports': svc.ports}), flush=True)\n"
              "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        info = json.loads(parent.stdout.readline())
        children = [psutil.Process(p) for p in info["pids"]]
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        from chexnet_utils.platform.processes import wait_gone

        assert wait_gone(children, 10) == []
        # nobody of theirs listens any more (a port may be reused at once by someone else)
        pids = {c.pid for c in children}
        listeners = {c.pid for c in psutil.net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port in info["ports"]}
        assert not listeners & pids
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.stdout.close()
