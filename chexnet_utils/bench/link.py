"""Measurements across the two-namespace link of :mod:`chexnet_utils.cluster.netns`.

* :func:`run_probe`: Horovod across nodeA / nodeB (``mpirun`` with the namespace launch
  agent, or ``horovodrun --gloo``): every rank reads its veth's byte counters around
  ``count_iters`` allreduces of ``count_bytes`` (did the traffic cross the link, and how
  much?) and times an allreduce sweep (:func:`chexnet_utils.comm.collectives.allreduce_times`).
* :func:`tcp_throughput`: the link's raw TCP throughput, a plain socket transfer from
  nodeA to nodeB, timed by the receiver.
* :func:`bench_link`: all of it unshaped and with the link shaped by ``tbf`` (default
  1 Gbit/s), the alpha-beta fit of :mod:`chexnet_utils.comm.costmodel` on each, the model's
  prediction error on the shaped link, bus bandwidth as a fraction of raw TCP, and
  ``HOROVOD_HIERARCHICAL_ALLREDUCE=1`` with two ranks per node (MPI and Gloo).
  ``python -m chexnet_utils bench link`` prints them as text tables.

Expected link traffic of one ring allreduce of ``S`` bytes over ``N`` ranks: every rank
sends ``2 (N - 1) / N * S``; with two nodes of one rank each that is ``S`` per direction
(:func:`expected_link_bytes` covers ``k`` ranks per node, flat ring and hierarchical).

``HOROVOD_HIERARCHICAL_ALLREDUCE=1`` on this CPU build (no NCCL) changes nothing: Horovod's
only hierarchical allreduces (``NCCLHierarchicalAllreduce``, ``NCCLTorusAllreduce``) are
NCCL operations for GPU tensors; CPU tensors go to ``MPIAllreduce`` (one ``MPI_Allreduce``,
Open MPI picks the algorithm) or ``GlooAllreduce`` whatever the flag. Measured with 2 x 2
ranks: the same bytes cross the link with the flag on and off (Gloo's flat ring: 1.5 x the
tensor; Open MPI's own choice for 4 ranks happens to send 1 x, what a hierarchical scheme
would).

``python -m chexnet_utils.bench.link probe|tcp-recv|tcp-send ...`` are the programs run
inside the namespaces (not meant to be called by hand).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chexnet_utils.cluster.distributed import json_objects
from chexnet_utils.cluster.netns import TwoNodes, tbf_command, two_nodes, unavailable_reason
from chexnet_utils.comm.collectives import KIB, MIB, format_bytes, message_sizes
from chexnet_utils.comm.costmodel import busbw, fit_alpha_beta, predict_ring

TCP_PORT = 5201
"""Port of the raw TCP transfer (inside the private namespaces: no collision possible)."""

LAUNCHERS: dict[str, tuple[str, dict[str, str]]] = {
    "mpirun": ("mpirun", {}),
    "mpirun-rd": ("mpirun", {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
                             "OMPI_MCA_coll_tuned_allreduce_algorithm": "3"}),
    "gloo": ("gloo", {}),
}
"""Launcher names of :func:`run_probe`: ``mpirun`` (Open MPI's own choice of allreduce
algorithm), ``mpirun-rd`` (Open MPI told to use recursive doubling, algorithm 3: for 2
ranks one exchange of the whole tensor each way) and ``gloo`` (``horovodrun --gloo``)."""

PRESETS: dict[str, dict[str, Any]] = {
    "quick": {"max_bytes": 16 * MIB, "factor": 4, "repeats": 3, "count_bytes": 16 * MIB,
              "count_iters": 2, "tcp_bytes": 64 * MIB, "hier_bytes": 4 * MIB,
              "hier_flat": False, "launchers": ("mpirun", "gloo")},
    "full": {"max_bytes": 64 * MIB, "factor": 2, "repeats": 5, "count_bytes": 64 * MIB,
             "count_iters": 3, "tcp_bytes": 256 * MIB, "hier_bytes": 16 * MIB,
             "hier_flat": True, "launchers": ("mpirun", "mpirun-rd", "gloo")},
}
"""``quick`` fits a notebook section (about a minute on 2 cores), ``full`` is
``bench link``'s default."""


# ---------------------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------------------


def expected_link_bytes(size_bytes: float, ranks_per_node: int = 1, nodes: int = 2,
                        hierarchical: bool = False) -> float:
    """Payload bytes one node sends over its link per allreduce of ``size_bytes``.

    Flat ring over ``n = nodes * k`` ranks placed node by node: each rank sends
    ``2 (n - 1) / n * S`` to its right neighbour, and ``1`` of the ``k`` ranks of a node
    has its neighbour on the next node: ``2 (n - 1) / n * S`` per node (``S`` for 2 x 1,
    ``1.5 S`` for 2 x 2). Hierarchical (reduce on the node, ring across nodes, broadcast
    on the node): ``2 (nodes - 1) / nodes * S`` (``S`` for two nodes, whatever ``k``).
    """
    n = nodes * ranks_per_node
    if hierarchical:
        return 2 * (nodes - 1) / nodes * size_bytes
    return 2 * (n - 1) / n * size_bytes


def relative_error(predicted: float, measured: float) -> float:
    """``(predicted - measured) / measured``."""
    return (predicted - measured) / measured


# ---------------------------------------------------------------------------------------
# Programs run inside the namespaces
# ---------------------------------------------------------------------------------------


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
    from chexnet_utils.comm.collectives import (
        allreduce_times,
        barrier,
        init_horovod,
        quiet_tensorflow,
    )

    quiet_tensorflow()
    import tensorflow as tf

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
    """``probe`` / ``tcp-recv`` / ``tcp-send``: the programs of this module's launchers."""
    p = argparse.ArgumentParser(prog="python -m chexnet_utils.bench.link")
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


# ---------------------------------------------------------------------------------------
# Driver side
# ---------------------------------------------------------------------------------------


def run_probe(nodes: TwoNodes, launcher: str = "mpirun", sizes: Sequence[int] = (),
              repeats: int = 3, count_bytes: int = 0, count_iters: int = 1,
              slots: int = 1, env: dict[str, str] | None = None, timeout: float = 300,
              shape_rate: float = 0.0) -> list[dict[str, Any]]:
    """Run the probe on ``2 x slots`` ranks across the nodes; one result per rank (sorted).

    Each rank's result: ``tx_bytes`` / ``rx_bytes`` of its node's veth over
    ``count_iters`` allreduces of ``count_bytes`` (``sum_ok``: the result was right),
    ``sweep`` (:func:`~chexnet_utils.comm.collectives.allreduce_times` of ``sizes``) and, with
    ``shape_rate`` (bits/s), ``shaped_sweep``: the same after the ranks shaped the link
    with ``tbf`` (removed again before the probe ends).

    ``launcher``: a name of :data:`LAUNCHERS` (``"mpirun"``: Open MPI over the veth with
    the launch agent; ``"gloo"``: ``horovodrun --gloo``). ``env`` is set for the launcher and
    forwarded to the ranks.
    """
    argv = ["python", "-m", "chexnet_utils.bench.link", "probe",
            "--sizes", ",".join(str(int(s)) for s in sizes), "--repeats", str(repeats),
            "--count-bytes", str(int(count_bytes)), "--count-iters", str(count_iters),
            "--shape-rate", str(float(shape_rate))]
    env = {"TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1",
           "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
           "OMPI_MCA_mpi_yield_when_idle": "1", **(env or {})}
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {sorted(LAUNCHERS)}, got {launcher!r}")
    kind, launcher_env = LAUNCHERS[launcher]
    env.update(launcher_env)
    if kind == "mpirun":
        cmd = nodes.mpirun_argv(argv, slots=slots, env_vars=sorted(env))
    else:
        cmd = nodes.horovodrun_argv(argv, slots=slots)
    out = nodes.launch(cmd, timeout=timeout, env=env)
    found = [o for o in json_objects(out.stdout) if "probe_ranks" in o]
    ranks = list(found[-1]["probe_ranks"]) if found else []
    if len(ranks) != 2 * slots:
        raise RuntimeError(f"expected {2 * slots} rank results, got {len(ranks)}:\n"
                           f"{out.stdout[-2000:]}")
    return sorted(ranks, key=lambda o: int(o["rank"]))


def tcp_throughput(nodes: TwoNodes, nbytes: int = 256 * MIB, timeout: float = 120
                   ) -> dict[str, float]:
    """Raw TCP from nodeA to nodeB: one socket, ``nbytes``, timed by the receiver.

    Returns ``bytes`` (those after the receiver's first read, when its clock starts),
    ``seconds`` and ``bytes_per_s``. Both ends are plain Python (a 4 MiB buffer each way),
    the same interpreter that runs the ranks.
    """
    prog = [sys.executable, "-m", "chexnet_utils.bench.link"]
    recv = subprocess.Popen(nodes.exec_argv(1, [*prog, "tcp-recv", "--host", nodes.ips[1],
                                                "--bytes", str(nbytes)]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        nodes.run(0, [*prog, "tcp-send", "--host", nodes.ips[1], "--bytes", str(nbytes)],
                  timeout=timeout)
        stdout, stderr = recv.communicate(timeout=timeout)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    if recv.returncode != 0:
        raise RuntimeError(f"tcp receiver failed: {stderr[-1500:]}")
    res = json_objects(stdout)[0]
    return {"bytes": float(res["bytes"]), "seconds": float(res["seconds"]),
            "bytes_per_s": float(res["bytes"]) / float(res["seconds"])}


def sweep_summary(sweep: dict[str, Any], tcp_bps: float) -> dict[str, Any]:
    """Alpha-beta fit (ring, :func:`~chexnet_utils.comm.costmodel.fit_alpha_beta`) and bus
    bandwidth of one allreduce sweep (times of the slowest rank), with the largest size's
    bus bandwidth as a fraction of the raw TCP throughput ``tcp_bps`` (bytes/s)."""
    sizes, times = sweep["sizes_bytes"], sweep["times_s"]
    n = int(sweep["size"])
    alpha, beta = fit_alpha_beta(sizes, times, algorithm="ring", n=n)
    bus = [busbw("ring", s, t, n) for s, t in zip(sizes, times, strict=True)]
    return {"sizes_bytes": sizes, "times_s": times, "busbw_Bps": bus,
            "alpha_s": alpha, "beta_s_per_byte": beta,
            "fit_bandwidth_Bps": 1.0 / beta if beta > 0 else float("inf"),
            "busbw_large_Bps": bus[-1], "busbw_fraction_of_tcp": bus[-1] / tcp_bps}


def _counts(ranks: list[dict[str, Any]], slots: int = 1,
            hierarchical: bool = False) -> dict[str, Any]:
    """Bytes that crossed the link per allreduce (node A's ranks' veth tx) vs expected."""
    r0 = ranks[0]
    per = r0["tx_bytes"] / r0["count_iters"]
    exp = expected_link_bytes(r0["count_bytes"], slots)
    return {"count_bytes": r0["count_bytes"], "count_iters": r0["count_iters"],
            "tx_per_allreduce": per, "rx_per_allreduce": r0["rx_bytes"] / r0["count_iters"],
            "expected_flat": exp,
            "expected_hierarchical": expected_link_bytes(r0["count_bytes"], slots,
                                                         hierarchical=True),
            "ratio_to_flat": per / exp, "sum_ok": all(r["sum_ok"] for r in ranks),
            "local_size": r0["local_size"], "hierarchical_env": bool(hierarchical)}


def measure_link(nodes: TwoNodes, launchers: Sequence[str], sizes: Sequence[int],
                 repeats: int, count_bytes: int, count_iters: int, tcp_bytes: int,
                 rate_bit: float, log: Callable[[str], None] = lambda m: None
                 ) -> dict[str, Any]:
    """Raw TCP unshaped and shaped to ``rate_bit``, then one probe per launcher:
    crossed-link byte counts and a fitted sweep on the unshaped and the shaped link."""
    out: dict[str, Any] = {"unshaped": {"tcp": tcp_throughput(nodes, tcp_bytes)},
                           "shaped": {}}
    nodes.shape(rate_bit)
    try:
        out["qdisc"] = nodes.qdisc(0)
        shaped_bytes = min(tcp_bytes, max(16 * MIB, int(rate_bit / 8 * 0.5)))
        out["shaped"]["tcp"] = tcp_throughput(nodes, shaped_bytes)
    finally:
        nodes.unshape()
    tcp = {k: out[k]["tcp"]["bytes_per_s"] for k in ("unshaped", "shaped")}
    log(f"raw TCP {tcp['unshaped'] * 8 / 1e9:.2f} Gbit/s unshaped, "
        f"{tcp['shaped'] * 8 / 1e9:.2f} Gbit/s with tbf {rate_bit / 1e9:g} Gbit/s")
    for launcher in launchers:
        t0 = time.perf_counter()
        ranks = run_probe(nodes, launcher, sizes, repeats, count_bytes, count_iters,
                          shape_rate=rate_bit)
        wall = time.perf_counter() - t0
        for link, key in (("unshaped", "sweep"), ("shaped", "shaped_sweep")):
            res = sweep_summary(ranks[0][key], tcp[link])
            res["wall_s"] = wall
            out[link][launcher] = res
        out["unshaped"][launcher]["counts"] = _counts(ranks)
        log(f"{launcher} ({wall:.0f} s): busbw/TCP "
            f"{out['unshaped'][launcher]['busbw_fraction_of_tcp']:.2f} unshaped, "
            f"{out['shaped'][launcher]['busbw_fraction_of_tcp']:.2f} shaped; link bytes / "
            f"expected {out['unshaped'][launcher]['counts']['ratio_to_flat']:.3f}")
    return out


def predict_shaped(unshaped: dict[str, Any], shaped: dict[str, Any], rate_bit: float,
                   min_bytes: int = 1 * MIB) -> dict[str, Any]:
    """The alpha-beta model on the shaped link: ``alpha`` fitted on the unshaped link (tbf
    adds no latency), ``beta = 8 / rate``; also with ``beta`` from the shaped link's raw TCP.
    Relative errors per size against the measured shaped times, and their mean over the
    sizes >= ``min_bytes`` (where the model's bandwidth term matters)."""
    n = 2
    alpha = unshaped["alpha_s"]
    sizes, times = shaped["sizes_bytes"], shaped["times_s"]
    out: dict[str, Any] = {"alpha_s": alpha}
    for key, beta in (("rate", 8.0 / rate_bit), ("tcp", 1.0 / shaped["tcp_Bps"])):
        pred = [predict_ring(n, s, alpha, beta) for s in sizes]
        err = [relative_error(p, t) for p, t in zip(pred, times, strict=True)]
        big = ([abs(e) for s, e in zip(sizes, err, strict=True) if s >= min_bytes]
               or [abs(e) for e in err])
        out[key] = {"beta_s_per_byte": beta, "predicted_s": pred, "rel_error": err,
                    "mean_abs_error_large": float(np.mean(big))}
    return out


def bench_link(preset: str = "full", rate_bit: float = 1e9,
               launchers: Sequence[str] | None = None, hierarchical: bool = True,
               log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Everything of the module on a fresh pair of nodes (built and torn down here).

    ``preset``: ``"quick"`` (a notebook section: 16 MiB top, ``mpirun`` and ``gloo``,
    hierarchical with the flag on only) or ``"full"`` (64 MiB, also ``mpirun-rd``, flag on
    and off); see :data:`PRESETS`. ``launchers``: names of :data:`LAUNCHERS` (default: the
    preset's).
    """
    cfg = PRESETS[preset]
    launchers = list(cfg["launchers"] if launchers is None else launchers)
    unknown = sorted(set(launchers) - set(LAUNCHERS))
    if unknown:
        raise ValueError(f"unknown launcher(s) {unknown}: use {sorted(LAUNCHERS)}")
    sizes = message_sizes(cfg["max_bytes"], min_bytes=4 * KIB, factor=cfg["factor"])
    t_start = time.perf_counter()
    result: dict[str, Any] = {"preset": preset, "rate_bit": rate_bit, "sizes_bytes": sizes,
                              "launchers": list(launchers)}
    with two_nodes() as nodes:
        result["ips"], result["prefix"] = list(nodes.ips), nodes.prefix
        m = measure_link(nodes, launchers, sizes, cfg["repeats"], cfg["count_bytes"],
                         cfg["count_iters"], cfg["tcp_bytes"], rate_bit, log)
        result.update(m)
        for launcher in launchers:
            sh = dict(result["shaped"][launcher],
                      tcp_Bps=result["shaped"]["tcp"]["bytes_per_s"])
            result["shaped"][launcher]["prediction"] = predict_shaped(
                result["unshaped"][launcher], sh, rate_bit)
        if hierarchical:
            result["hierarchical"] = _hierarchical(nodes, launchers, cfg, log)
    result["wall_s"] = time.perf_counter() - t_start
    return result


def _hierarchical(nodes: TwoNodes, launchers: Sequence[str], cfg: dict[str, Any],
                  log: Callable[[str], None]) -> list[dict[str, Any]]:
    """2 ranks per node: link bytes and time per allreduce, flag on (and off in full)."""
    rows = []
    size = cfg["hier_bytes"]
    flags = (True, False) if cfg["hier_flat"] else (True,)
    for launcher in [name for name in launchers if name != "mpirun-rd"]:
        for flag in flags:
            env = {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1" if flag else "0"}
            t0 = time.perf_counter()
            ranks = run_probe(nodes, launcher, [size], repeats=cfg["repeats"],
                              count_bytes=size, count_iters=cfg["count_iters"], slots=2,
                              env=env)
            row = {"launcher": launcher, **_counts(ranks, slots=2, hierarchical=flag),
                   "time_s": ranks[0]["sweep"]["times_s"][0],
                   "wall_s": time.perf_counter() - t0}
            rows.append(row)
            log(f"hierarchical={flag} {launcher}: {format_bytes(row['tx_per_allreduce'])} "
                f"over the link per allreduce of {format_bytes(size)}")
    return rows


def link_tables(result: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The results of :func:`bench_link` as table rows, keyed by caption (for
    :func:`chexnet_utils.notebook.tables.table` in a notebook, or ``bench link``'s text)."""
    gbit = 8 / 1e9
    rate = f"tbf {result['rate_bit'] / 1e9:g} Gbit/s"
    rows = []
    for link in ("unshaped", "shaped"):
        m = result[link]
        for launcher in result["launchers"]:
            r = m[launcher]
            rows.append({"link": link if link == "unshaped" else rate, "launcher": launcher,
                         "raw TCP Gbit/s": m["tcp"]["bytes_per_s"] * gbit,
                         "busbw Gbit/s": r["busbw_large_Bps"] * gbit,
                         "busbw/TCP": r["busbw_fraction_of_tcp"],
                         "alpha us": r["alpha_s"] * 1e6,
                         "1/beta Gbit/s": r["fit_bandwidth_Bps"] * gbit,
                         "link bytes/expected":
                             result["unshaped"][launcher]["counts"]["ratio_to_flat"]})
    tables = {f"two nodes over a veth ({result['ips'][0]} <-> {result['ips'][1]}), largest "
              f"allreduce {format_bytes(result['sizes_bytes'][-1])}": rows}
    tables["alpha-beta model on the shaped link: alpha fitted unshaped, mean |relative "
           "error| over sizes >= 1 MiB"] = [
        {"launcher": launcher,
         "alpha us (unshaped)": result["shaped"][launcher]["prediction"]["alpha_s"] * 1e6,
         "error, beta = 8/rate":
             result["shaped"][launcher]["prediction"]["rate"]["mean_abs_error_large"],
         "error, beta = 1/raw TCP":
             result["shaped"][launcher]["prediction"]["tcp"]["mean_abs_error_large"]}
        for launcher in result["launchers"]]
    if result.get("hierarchical"):
        tables["2 ranks per node: bytes over the link per allreduce"] = [
            {"launcher": r["launcher"],
             "HOROVOD_HIERARCHICAL_ALLREDUCE": int(r["hierarchical_env"]),
             "size": format_bytes(r["count_bytes"]),
             "link tx / allreduce": format_bytes(r["tx_per_allreduce"]),
             "flat ring expects": format_bytes(r["expected_flat"]),
             "hierarchical expects": format_bytes(r["expected_hierarchical"]),
             "time ms": r["time_s"] * 1e3} for r in result["hierarchical"]]
    return tables


def loopback_comparison(result: dict[str, Any],
                        loopback: Mapping[str, tuple[float, float]]) -> list[dict[str, Any]]:
    """Table rows: the alpha-beta fits of one machine's loopback (``loopback``: name ->
    ``(alpha_s, beta_s_per_byte)``, e.g. notebook 05's section 6 fits) beside the same fits
    across the two nodes' link, unshaped and shaped (from a :func:`bench_link` result).

    ``1/beta`` is the bandwidth the model sees; loopback and an unshaped veth are both
    limited by the CPUs copying, the shaped link by its rate."""
    gbit = 8 / 1e9

    def row(where: str, launcher: str, alpha: float, beta: float) -> dict[str, Any]:
        return {"where": where, "launcher": launcher, "alpha us": alpha * 1e6,
                "1/beta Gbit/s": gbit / beta if beta > 0 else float("inf")}

    rows = [row("one machine (loopback, shared memory)", name, a, b)
            for name, (a, b) in loopback.items()]
    rate = f"two nodes, tbf {result['rate_bit'] / 1e9:g} Gbit/s"
    for link, where in (("unshaped", "two nodes, veth unshaped"), ("shaped", rate)):
        rows += [row(where, name, result[link][name]["alpha_s"],
                     result[link][name]["beta_s_per_byte"]) for name in result["launchers"]]
    return rows


def link_unavailable() -> str | None:
    """Why ``bench link`` cannot run here (see
    :func:`chexnet_utils.cluster.netns.unavailable_reason`)."""
    return unavailable_reason()


if __name__ == "__main__":
    sys.exit(main())
