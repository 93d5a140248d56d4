"""Measurements across the two-namespace link of :mod:`chexnet_utils.cluster.netns`.

* :func:`run_probe`: Horovod across nodeA / nodeB (``mpirun`` with the namespace launch
  agent, or ``horovodrun --gloo``): every rank reads its veth's byte counters around
  ``count_iters`` allreduces of ``count_bytes`` (did the traffic cross the link, and how
  much?) and times an allreduce sweep (:func:`chexnet_utils.comm.collectives.allreduce_times`).
* :func:`tcp_throughput`: the link's raw TCP throughput, a plain socket transfer from
  nodeA to nodeB, timed by the receiver (a :class:`TcpThroughput`).
* :func:`bench_link`: all of it unshaped and with the link shaped by ``tbf`` (default
  1 Gbit/s), the alpha-beta fit of :mod:`chexnet_utils.comm.costmodel` on each, the model's
  prediction error on the shaped link, bus bandwidth as a fraction of raw TCP, and
  ``HOROVOD_HIERARCHICAL_ALLREDUCE=1`` with two ranks per node (MPI and Gloo), as a
  :class:`LinkResult`: a :class:`LinkBlock` per state of the link (its :class:`TcpThroughput`
  and a :class:`SweepFit` per launcher), :class:`LinkCounts` per launcher,
  :class:`ShapedPrediction` per launcher (a property) and :class:`HierarchicalRow` s.
  ``str(result)`` is the text tables ``python -m chexnet_utils bench link`` prints,
  ``result.tables()`` their rows, ``result.as_dict()`` what its ``--json`` writes.

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

The programs that run inside the namespaces (the probe of every rank, the two ends of the
TCP transfer) are :mod:`chexnet_utils.bench.link_probes`; this module starts them and reads
what they print.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from chexnet_utils.bench.link_results import (
    LAUNCHERS,
    PRESETS,
    HierarchicalRow,
    LinkBlock,
    LinkCounts,
    LinkPreset,
    LinkResult,
    PresetName,
    RingPrediction,
    ShapedPrediction,
    SweepFit,
    TcpThroughput,
    expected_link_bytes,
    predict_shaped,
    relative_error,
)
from chexnet_utils.bench.registry import BenchCommand
from chexnet_utils.cluster.distributed import json_objects
from chexnet_utils.cluster.netns import TwoNodes, two_nodes, unavailable_reason
from chexnet_utils.comm.collectives import MIB, format_bytes
from chexnet_utils.platform.options import Option, default_of, option_values

__all__ = ["COMMAND", "LAUNCHERS", "OPTIONS", "PRESETS", "HierarchicalRow", "LinkBlock",
           "LinkCounts", "LinkPreset", "LinkResult", "PresetName", "RingPrediction",
           "ShapedPrediction", "SweepFit", "TcpThroughput", "bench_link", "expected_link_bytes",
           "link_unavailable", "measure_link", "predict_shaped", "relative_error", "run_probe",
           "sweep_summary", "tcp_throughput"]

PROBES = "chexnet_utils.bench.link_probes"
"""The module whose programs run inside the namespaces (``python -m``)."""
"""Port of the raw TCP transfer (inside the private namespaces: no collision possible)."""




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
    argv = ["python", "-m", PROBES, "probe",
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
                   ) -> TcpThroughput:
    """Raw TCP from nodeA to nodeB: one socket, ``nbytes``, timed by the receiver.

    The :class:`TcpThroughput` counts the bytes after the receiver's first read (when its
    clock starts). Both ends are plain Python (a 4 MiB buffer each way), the same
    interpreter that runs the ranks.
    """
    prog = [sys.executable, "-m", PROBES]
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
    return TcpThroughput(bytes=int(res["bytes"]), seconds=float(res["seconds"]))


def sweep_summary(sweep: Mapping[str, Any], tcp_bps: float, wall_s: float = 0.0) -> SweepFit:
    """One allreduce sweep of :func:`run_probe` (a rank's ``sweep`` or ``shaped_sweep``:
    the times of the slowest rank) as a :class:`SweepFit` (alpha-beta fit, bus bandwidth),
    compared with the raw TCP throughput ``tcp_bps`` (bytes/s) of the same link; ``wall_s``:
    the probe launch's wall time."""
    return SweepFit(sizes_bytes=[int(s) for s in sweep["sizes_bytes"]],
                    times_s=[float(t) for t in sweep["times_s"]], ranks=int(sweep["size"]),
                    tcp_Bps=float(tcp_bps), wall_s=float(wall_s))


def _counts(ranks: list[dict[str, Any]], slots: int = 1,
            hierarchical: bool = False) -> LinkCounts:
    """Bytes that crossed the link per allreduce (node A's veth tx, read by rank 0), for
    ``slots`` ranks per node."""
    r0 = ranks[0]
    iters = int(r0["count_iters"])
    return LinkCounts(count_bytes=int(r0["count_bytes"]), count_iters=iters,
                      tx_per_allreduce=r0["tx_bytes"] / iters,
                      rx_per_allreduce=r0["rx_bytes"] / iters,
                      sum_ok=all(bool(r["sum_ok"]) for r in ranks),
                      local_size=int(r0["local_size"]), hierarchical_env=bool(hierarchical),
                      slots=slots)


def measure_link(nodes: TwoNodes, preset: LinkPreset, launchers: Sequence[str],
                 rate_bit: float, log: Callable[[str], None] = lambda m: None
                 ) -> LinkResult:
    """Raw TCP unshaped and shaped to ``rate_bit``, then one probe per launcher:
    crossed-link byte counts and a fitted sweep on the unshaped and the shaped link.

    The :class:`LinkResult` has no ``hierarchical`` rows; its ``wall_s`` is this
    measurement's."""
    t_start = time.perf_counter()
    tcp_free = tcp_throughput(nodes, preset.tcp_bytes)
    nodes.shape(rate_bit)
    try:
        qdisc = nodes.qdisc(0)
        tcp_shaped = tcp_throughput(nodes, min(preset.tcp_bytes,
                                               max(16 * MIB, int(rate_bit / 8 * 0.5))))
    finally:
        nodes.unshape()
    log(f"raw TCP {tcp_free.bytes_per_s * 8 / 1e9:.2f} Gbit/s unshaped, "
        f"{tcp_shaped.bytes_per_s * 8 / 1e9:.2f} Gbit/s with tbf {rate_bit / 1e9:g} Gbit/s")
    sizes = preset.sizes_bytes
    free: dict[str, SweepFit] = {}
    shaped: dict[str, SweepFit] = {}
    counts: dict[str, LinkCounts] = {}
    for launcher in launchers:
        t0 = time.perf_counter()
        ranks = run_probe(nodes, launcher, sizes, preset.repeats, preset.count_bytes,
                          preset.count_iters, shape_rate=rate_bit)
        wall = time.perf_counter() - t0
        free[launcher] = sweep_summary(ranks[0]["sweep"], tcp_free.bytes_per_s, wall)
        shaped[launcher] = sweep_summary(ranks[0]["shaped_sweep"], tcp_shaped.bytes_per_s,
                                         wall)
        counts[launcher] = _counts(ranks)
        log(f"{launcher} ({wall:.0f} s): busbw/TCP "
            f"{free[launcher].busbw_fraction_of_tcp:.2f} unshaped, "
            f"{shaped[launcher].busbw_fraction_of_tcp:.2f} shaped; link bytes / "
            f"expected {counts[launcher].ratio_to_flat:.3f}")
    return LinkResult(preset=preset.name, rate_bit=rate_bit, sizes_bytes=sizes,
                      launchers=list(launchers), ips=nodes.ips, prefix=nodes.prefix,
                      unshaped=LinkBlock(tcp=tcp_free, fits=free),
                      shaped=LinkBlock(tcp=tcp_shaped, fits=shaped), qdisc=qdisc,
                      counts=counts, hierarchical=None,
                      wall_s=time.perf_counter() - t_start)


def bench_link(preset: PresetName = "full", rate_bit: float = 1e9,
               launchers: Sequence[str] | None = None, hierarchical: bool = True,
               log: Callable[[str], None] = lambda m: None) -> LinkResult:
    """Everything of the module on a fresh pair of nodes (built and torn down here).

    ``preset``: ``"quick"`` (a notebook section: 16 MiB top, ``mpirun`` and ``gloo``,
    hierarchical with the flag on only) or ``"full"`` (64 MiB, also ``mpirun-rd``, flag on
    and off); see :data:`PRESETS`. ``launchers``: names of :data:`LAUNCHERS` (default: the
    preset's). ``print(result)`` shows its tables.
    """
    cfg = PRESETS[preset]
    launchers = list(cfg.launchers if launchers is None else launchers)
    unknown = sorted(set(launchers) - set(LAUNCHERS))
    if unknown or not launchers:
        raise ValueError(f"unknown launcher(s) {unknown}: use {sorted(LAUNCHERS)}" if unknown
                         else f"no launcher given: use one or more of {sorted(LAUNCHERS)}")
    t_start = time.perf_counter()
    with two_nodes() as nodes:
        result = measure_link(nodes, cfg, launchers, rate_bit, log)
        rows = _hierarchical(nodes, launchers, cfg, log) if hierarchical else None
    return replace(result, hierarchical=rows, wall_s=time.perf_counter() - t_start)


def _hierarchical(nodes: TwoNodes, launchers: Sequence[str], cfg: LinkPreset,
                  log: Callable[[str], None]) -> list[HierarchicalRow]:
    """2 ranks per node: link bytes and time per allreduce, flag on (and off in full)."""
    rows = []
    size = cfg.hier_bytes
    flags = (True, False) if cfg.hier_flat else (True,)
    for launcher in [name for name in launchers if name != "mpirun-rd"]:
        for flag in flags:
            env = {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1" if flag else "0"}
            t0 = time.perf_counter()
            ranks = run_probe(nodes, launcher, [size], repeats=cfg.repeats,
                              count_bytes=size, count_iters=cfg.count_iters, slots=2,
                              env=env)
            row = HierarchicalRow(launcher=launcher,
                                  counts=_counts(ranks, slots=2, hierarchical=flag),
                                  time_s=float(ranks[0]["sweep"]["times_s"][0]),
                                  wall_s=time.perf_counter() - t0)
            rows.append(row)
            log(f"hierarchical={flag} {launcher}: "
                f"{format_bytes(row.counts.tx_per_allreduce)} over the link per allreduce "
                f"of {format_bytes(size)}")
    return rows


def link_unavailable() -> str | None:
    """Why ``bench link`` cannot run here (see
    :func:`chexnet_utils.cluster.netns.unavailable_reason`)."""
    return unavailable_reason()


OPTIONS: dict[str, Option] = {
    "launchers": Option("--launchers", "comma list of mpirun, mpirun-rd, gloo (default: the "
                                       "preset's)", "LIST"),
}
"""``bench link``'s option from :func:`bench_link`'s parameter; ``--quick`` (the preset),
``--rate-gbit`` (its default from ``rate_bit``) and ``--no-hierarchical`` by hand."""


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="notebook-sized run (16 MiB top, about a minute)")
    rate_gbit = default_of(bench_link, "rate_bit") / 1e9
    parser.add_argument("--rate-gbit", type=float, default=rate_gbit, metavar="GBIT",
                        help=f"tbf rate of the shaped link in Gbit/s (default {rate_gbit:g})")
    parser.add_argument("--no-hierarchical", action="store_true",
                        help="skip the 2-ranks-per-node HOROVOD_HIERARCHICAL_ALLREDUCE runs")


def _run(args: argparse.Namespace, log: Callable[[str], None]) -> LinkResult | int:
    reason = link_unavailable()
    if reason:
        print(f"bench link: cannot build two network namespaces here: {reason}",
              file=sys.stderr)
        return 3
    return bench_link("quick" if args.quick else "full", rate_bit=args.rate_gbit * 1e9,
                      hierarchical=not args.no_hierarchical, log=log,
                      **option_values(args, OPTIONS))


COMMAND = BenchCommand("Horovod across two network namespaces joined by a veth: crossed-link "
                       "bytes, allreduce vs size, tc-shaped link vs the alpha-beta model "
                       "(root; exit 3 otherwise)", bench_link, OPTIONS, _run, _arguments)
