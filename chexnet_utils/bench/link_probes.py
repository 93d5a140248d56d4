"""The programs :mod:`chexnet_utils.bench.link` runs inside the two namespaces of
:mod:`chexnet_utils.cluster.netns` (``python -m chexnet_utils.bench.link_probes ...``; not meant
to be called by hand):

* ``probe``: one Horovod rank. It reads its veth's byte counters around ``count_iters``
  allreduces of ``count_bytes`` (did the traffic cross the link, and how much?), times an
  allreduce sweep (:func:`chexnet_utils.comm.collectives.allreduce_times`), with
  ``--shape-rate`` shapes its node's end of the link with ``tbf`` and sweeps again, and rank 0
  prints every rank's result as one JSON line;
* ``tcp-recv`` / ``tcp-send``: the two ends of a plain socket transfer, timed by the receiver
  (the link's raw TCP throughput).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chexnet_utils.cluster.netns import tbf_command
from chexnet_utils.comm.collectives import (
    MIB,
    allreduce_times,
    barrier,
    init_horovod,
    quiet_tensorflow,
)
from chexnet_utils.platform.lazy import lazy_module

# TensorFlow: imported on first use (chexnet_utils.platform.lazy)
tf = lazy_module("tensorflow")

TCP_PORT = 5201
"""The port of the TCP transfer (inside the namespaces: nothing else listens there)."""


def _link_iface() -> str:
    """The one non-loopback interface of this namespace."""
    names = sorted(n for n in os.listdir("/sys/class/net") if n != "lo")
    if len(names) != 1:
        raise RuntimeError(f"expected one link interface, found {names}")
    return names[0]


def _read_counters(iface: str) -> tuple[int, int]:
    base = Path("/sys/class/net") / iface / "statistics"
    return (int((base / "tx_bytes").read_text()), int((base / "rx_bytes").read_text()))


def _probe(args: argparse.Namespace) -> int:
    """One rank: counters around ``count_iters`` allreduces, then a timed sweep."""
    quiet_tensorflow()

    hvd = init_horovod()
    iface = _link_iface()
    out: dict[str, Any] = {"rank": hvd.rank(), "size": hvd.size(), "pid": os.getpid(),
                           "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
                           "mpi": bool(hvd.mpi_enabled()), "gloo": bool(hvd.gloo_enabled()),
                           "iface": iface,
                           "hierarchical_env": os.environ.get("HOROVOD_HIERARCHICAL_ALLREDUCE",
                                                              "")}
    if args.count_bytes > 0:
        x = tf.ones([args.count_bytes // 4], tf.float32)
        hvd.allreduce(x, op=hvd.Sum, name="link_warm").numpy()  # connections, buffers
        barrier(hvd)
        tx0, rx0 = _read_counters(iface)
        for i in range(args.count_iters):
            y = hvd.allreduce(x, op=hvd.Sum, name=f"link_count_{i}").numpy()
        barrier(hvd)
        tx1, rx1 = _read_counters(iface)
        out.update(count_bytes=args.count_bytes, count_iters=args.count_iters,
                   tx_bytes=tx1 - tx0, rx_bytes=rx1 - rx0,
                   sum_ok=bool(np.allclose(y[:16], hvd.size())))
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if sizes:
        out["sweep"] = allreduce_times(sizes, repeats=args.repeats, warmup=1)
    if sizes and args.shape_rate > 0:
        # Shape the link from inside (one rank per node shapes its own veth end), sweep
        # again, unshape: one launch measures both links.
        shaper = hvd.local_rank() == 0
        barrier(hvd)
        if shaper:
            subprocess.run(tbf_command(iface, args.shape_rate), check=True,
                           capture_output=True)
        barrier(hvd)
        try:
            out["shaped_sweep"] = allreduce_times(sizes, repeats=args.repeats, warmup=1)
        finally:
            barrier(hvd)
            if shaper:
                subprocess.run(["tc", "qdisc", "del", "dev", iface, "root"],
                               capture_output=True)
    # One line from rank 0 with every rank's result: long lines of several ranks may be
    # interleaved by the launcher's output forwarding, and then only fragments would parse.
    everyone = hvd.allgather_object(out)
    if hvd.rank() == 0:
        print(json.dumps({"probe_ranks": everyone}), flush=True)
    return 0


def _tcp_recv(args: argparse.Namespace) -> int:
    """Accept one connection, read ``bytes``; print the bytes received after the first
    read and the time they took (the clock starts when the first data arrives, so the
    bytes of that first read are not counted: they arrived before the clock started)."""
    with socket.create_server((args.host, args.port)) as srv:
        srv.settimeout(60)
        conn, _ = srv.accept()
        with conn:
            buf = bytearray(4 * MIB)
            view = memoryview(buf)
            first = got = conn.recv_into(view)
            t0 = time.perf_counter()
            while got < args.bytes:
                n = conn.recv_into(view)
                if n == 0:
                    break
                got += n
            dt = time.perf_counter() - t0
    print(json.dumps({"bytes": got - first, "seconds": dt, "total_bytes": got}), flush=True)
    return 0


def _tcp_send(args: argparse.Namespace) -> int:
    """Connect (retrying while the receiver starts) and send ``bytes``."""
    deadline = time.monotonic() + 30
    while True:
        try:
            sock = socket.create_connection((args.host, args.port), timeout=30)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    chunk = memoryview(bytes(4 * MIB))
    with sock:
        left = args.bytes
        while left > 0:
            n = min(left, len(chunk))
            sock.sendall(chunk[:n])
            left -= n
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)  # the receiver closes when it has everything
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``probe`` / ``tcp-recv`` / ``tcp-send``: what :mod:`chexnet_utils.bench.link` launches."""
    p = argparse.ArgumentParser(prog="python -m chexnet_utils.bench.link_probes")
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("probe")
    pr.add_argument("--sizes", default="")
    pr.add_argument("--repeats", type=int, default=3)
    pr.add_argument("--count-bytes", type=int, default=0)
    pr.add_argument("--count-iters", type=int, default=1)
    pr.add_argument("--shape-rate", type=float, default=0.0)
    pr.set_defaults(fn=_probe)
    for name, fn in (("tcp-recv", _tcp_recv), ("tcp-send", _tcp_send)):
        t = sub.add_parser(name)
        t.add_argument("--host", required=True)
        t.add_argument("--port", type=int, default=TCP_PORT)
        t.add_argument("--bytes", type=int, required=True)
        t.set_defaults(fn=fn)
    args = p.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
