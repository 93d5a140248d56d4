"""``bench link``'s presets and results: the two presets (:data:`PRESETS`), the launchers, the
bytes a ring allreduce should put on the link (:func:`expected_link_bytes`), and the result
dataclasses :func:`chexnet_utils.bench.link.bench_link` returns (:class:`LinkResult` and its
parts). Kept apart from the measurements so that each module stays readable; import them
from :mod:`chexnet_utils.bench.link`, which re-exports them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np

from chexnet_utils.comm.collectives import KIB, MIB, format_bytes, message_sizes
from chexnet_utils.comm.costmodel import busbw, fit_alpha_beta, predict_ring
from chexnet_utils.platform.markdown import markdown_table

__all__ = ["LAUNCHERS", "PRESETS", "HierarchicalRow", "LinkBlock", "LinkCounts", "LinkPreset",
           "LinkResult", "PresetName", "RingPrediction", "ShapedPrediction", "SweepFit",
           "TcpThroughput", "expected_link_bytes", "predict_shaped", "relative_error"]

LAUNCHERS: dict[str, tuple[str, dict[str, str]]] = {
    "mpirun": ("mpirun", {}),
    "mpirun-rd": ("mpirun", {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
                             "OMPI_MCA_coll_tuned_allreduce_algorithm": "3"}),
    "gloo": ("gloo", {}),
}
"""Launcher names of :func:`run_probe`: ``mpirun`` (Open MPI's own choice of allreduce
algorithm), ``mpirun-rd`` (Open MPI told to use recursive doubling, algorithm 3: for 2
ranks one exchange of the whole tensor each way) and ``gloo`` (``horovodrun --gloo``)."""


PresetName = Literal["quick", "full"]
"""The names of :data:`PRESETS`."""


@dataclass(frozen=True)
class LinkPreset:
    """Sizes and counts of one :func:`bench_link` run (:data:`PRESETS`)."""

    name: PresetName
    """The preset's key in :data:`PRESETS`."""
    max_bytes: int
    """Largest allreduce of the sweep (bytes); the sweep starts at 4 KiB."""
    factor: int
    """Ratio of consecutive sizes of the sweep."""
    repeats: int
    """Timed allreduces per size (their median is kept)."""
    count_bytes: int
    """Size of the allreduces whose bytes over the link are counted (bytes)."""
    count_iters: int
    """How many of them are counted."""
    tcp_bytes: int
    """Bytes of the raw TCP transfer on the unshaped link (the shaped one sends at most as
    many: half a second at the rate, at least 16 MiB)."""
    hier_bytes: int
    """Allreduce size of the runs with two ranks per node (bytes)."""
    hier_flat: bool
    """Those runs also with ``HOROVOD_HIERARCHICAL_ALLREDUCE=0`` (else only ``=1``)."""
    launchers: tuple[str, ...]
    """Default launchers (names of :data:`LAUNCHERS`)."""

    @property
    def sizes_bytes(self) -> list[int]:
        """The sweep's sizes: 4 KiB, then times :attr:`factor` up to :attr:`max_bytes`."""
        return message_sizes(self.max_bytes, min_bytes=4 * KIB, factor=self.factor)


PRESETS: dict[PresetName, LinkPreset] = {p.name: p for p in (
    LinkPreset("quick", max_bytes=16 * MIB, factor=4, repeats=3, count_bytes=16 * MIB,
               count_iters=2, tcp_bytes=64 * MIB, hier_bytes=4 * MIB, hier_flat=False,
               launchers=("mpirun", "gloo")),
    LinkPreset("full", max_bytes=64 * MIB, factor=2, repeats=5, count_bytes=64 * MIB,
               count_iters=3, tcp_bytes=256 * MIB, hier_bytes=16 * MIB, hier_flat=True,
               launchers=("mpirun", "mpirun-rd", "gloo")),
)}
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
# Results
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TcpThroughput:
    """Raw TCP from nodeA to nodeB (:func:`tcp_throughput`): one socket, timed by the
    receiver."""

    bytes: int
    """Bytes received after the receiver's first read (its clock starts then)."""
    seconds: float
    """Time those bytes took (s)."""

    @property
    def bytes_per_s(self) -> float:
        """Throughput (bytes/s)."""
        return self.bytes / self.seconds

    def as_dict(self) -> dict[str, Any]:
        """``bytes``, ``seconds``, ``bytes_per_s``."""
        return {**asdict(self), "bytes_per_s": self.bytes_per_s}

    def __str__(self) -> str:
        """Bytes, seconds and the rate in Gbit/s, on one line."""
        return (f"{format_bytes(self.bytes)} in {self.seconds:.3g} s: "
                f"{self.bytes_per_s * 8 / 1e9:.3g} Gbit/s")


@dataclass(frozen=True)
class SweepFit:
    """One allreduce sweep across the link (:func:`sweep_summary`) and what follows from
    it: the ring's alpha-beta fit (:func:`~chexnet_utils.comm.costmodel.fit_alpha_beta`)
    and bus bandwidth, the largest size's as a fraction of the link's raw TCP."""

    sizes_bytes: list[int]
    """Allreduce sizes (bytes), ascending."""
    times_s: list[float]
    """Time per allreduce of each size (s): the median over the repeats of the slowest
    rank."""
    ranks: int
    """Ranks of the allreduce (2: one per node)."""
    tcp_Bps: float
    """Raw TCP throughput of the same link (bytes/s): the block's ``tcp``, what
    :attr:`busbw_fraction_of_tcp` divides by."""
    wall_s: float
    """Wall time of the probe launch that measured it (s; one launch measures the unshaped
    and the shaped sweep)."""

    def __post_init__(self) -> None:
        if len(self.sizes_bytes) != len(self.times_s):
            raise ValueError(f"{len(self.sizes_bytes)} sizes but {len(self.times_s)} times")

    @cached_property  # fitted once: the figures below all read it
    def alpha_beta(self) -> tuple[float, float]:
        """``(alpha_s, beta_s_per_byte)`` of the ring model fitted to the sweep."""
        return fit_alpha_beta(self.sizes_bytes, self.times_s, algorithm="ring", n=self.ranks)

    @property
    def alpha_s(self) -> float:
        """Fitted latency per message (s)."""
        return self.alpha_beta[0]

    @property
    def beta_s_per_byte(self) -> float:
        """Fitted time per byte (s/byte)."""
        return self.alpha_beta[1]

    @property
    def fit_bandwidth_Bps(self) -> float:
        """``1 / beta`` (bytes/s): the bandwidth the model sees (inf when ``beta`` is 0)."""
        beta = self.beta_s_per_byte
        return 1.0 / beta if beta > 0 else float("inf")

    @property
    def busbw_Bps(self) -> list[float]:
        """Bus bandwidth of each size (bytes/s, :func:`~chexnet_utils.comm.costmodel.busbw`,
        ring)."""
        return [busbw("ring", s, t, self.ranks)
                for s, t in zip(self.sizes_bytes, self.times_s, strict=True)]

    @property
    def busbw_large_Bps(self) -> float:
        """Bus bandwidth of the largest size (bytes/s)."""
        return self.busbw_Bps[-1]

    @property
    def busbw_fraction_of_tcp(self) -> float:
        """:attr:`busbw_large_Bps` over the link's raw TCP throughput."""
        return self.busbw_large_Bps / self.tcp_Bps

    def as_dict(self) -> dict[str, Any]:
        """The sweep, its bus bandwidths and fit, ``wall_s`` (``ranks`` and ``tcp_Bps`` are
        not repeated: the JSON keeps the raw TCP in the block's ``tcp``)."""
        return {"sizes_bytes": self.sizes_bytes, "times_s": self.times_s,
                "busbw_Bps": self.busbw_Bps, "alpha_s": self.alpha_s,
                "beta_s_per_byte": self.beta_s_per_byte,
                "fit_bandwidth_Bps": self.fit_bandwidth_Bps,
                "busbw_large_Bps": self.busbw_large_Bps,
                "busbw_fraction_of_tcp": self.busbw_fraction_of_tcp, "wall_s": self.wall_s}


@dataclass(frozen=True)
class LinkCounts:
    """Bytes that crossed the link per allreduce (node A's veth counters, read by rank 0
    around ``count_iters`` allreduces) against what the ring sends (:func:`_counts`)."""

    count_bytes: int
    """Size of each counted allreduce (bytes)."""
    count_iters: int
    """How many allreduces were counted."""
    tx_per_allreduce: float
    """Bytes node A sent over its veth per allreduce (payload plus TCP/IP headers)."""
    rx_per_allreduce: float
    """Bytes node A received per allreduce."""
    sum_ok: bool
    """Every rank's allreduce result was right."""
    local_size: int
    """Ranks per node, as Horovod reported them."""
    hierarchical_env: bool
    """Run with ``HOROVOD_HIERARCHICAL_ALLREDUCE=1``."""
    slots: int = 1
    """Ranks per node asked for: the expected bytes are those of this layout, so ranks
    placed otherwise (``local_size`` differs) show as a ratio far from 1."""

    @property
    def expected_flat(self) -> float:
        """Bytes a flat ring sends over one node's link (:func:`expected_link_bytes`)."""
        return expected_link_bytes(self.count_bytes, self.slots)

    @property
    def expected_hierarchical(self) -> float:
        """Bytes a hierarchical allreduce sends over one node's link."""
        return expected_link_bytes(self.count_bytes, self.slots, hierarchical=True)

    @property
    def ratio_to_flat(self) -> float:
        """:attr:`tx_per_allreduce` over :attr:`expected_flat` (a little above 1: headers)."""
        return self.tx_per_allreduce / self.expected_flat

    def as_dict(self) -> dict[str, Any]:
        """The fields and the expected bytes, in the order of the saved JSON."""
        return {"count_bytes": self.count_bytes, "count_iters": self.count_iters,
                "tx_per_allreduce": self.tx_per_allreduce,
                "rx_per_allreduce": self.rx_per_allreduce,
                "expected_flat": self.expected_flat,
                "expected_hierarchical": self.expected_hierarchical,
                "ratio_to_flat": self.ratio_to_flat, "sum_ok": self.sum_ok,
                "local_size": self.local_size, "hierarchical_env": self.hierarchical_env}


@dataclass(frozen=True)
class RingPrediction:
    """The ring model's times on the shaped link with one choice of ``beta``, against the
    measured ones (:func:`predict_shaped`)."""

    beta_s_per_byte: float
    """The ``beta`` used (s/byte)."""
    predicted_s: list[float]
    """Predicted time of each size of the sweep (s)."""
    rel_error: list[float]
    """``(predicted - measured) / measured`` of each size."""
    mean_abs_error_large: float
    """Mean ``|rel_error|`` over the sizes >= 1 MiB (all sizes if none is)."""


@dataclass(frozen=True)
class ShapedPrediction:
    """The alpha-beta model on the shaped link (:func:`predict_shaped`): ``alpha`` fitted
    on the unshaped link, ``beta`` from the rate or from the shaped link's raw TCP."""

    alpha_s: float
    """``alpha`` of the unshaped fit (s)."""
    rate: RingPrediction
    """With ``beta = 8 / rate``."""
    tcp: RingPrediction
    """With ``beta = 1 / raw TCP`` of the shaped link."""

    def as_dict(self) -> dict[str, Any]:
        """``alpha_s``, ``rate`` and ``tcp`` (each a :class:`RingPrediction`'s fields)."""
        return asdict(self)


@dataclass(frozen=True)
class HierarchicalRow:
    """Two ranks per node, one launcher, one value of ``HOROVOD_HIERARCHICAL_ALLREDUCE``
    (:func:`_hierarchical`)."""

    launcher: str
    """Name in :data:`LAUNCHERS`."""
    counts: LinkCounts
    """Bytes over the link per allreduce of ``hier_bytes``."""
    time_s: float
    """Time of one allreduce of that size (s, median of the slowest rank)."""
    wall_s: float
    """Wall time of the launch (s)."""

    def as_dict(self) -> dict[str, Any]:
        """One flat row: ``launcher``, the counts' keys, ``time_s``, ``wall_s``."""
        return {"launcher": self.launcher, **self.counts.as_dict(), "time_s": self.time_s,
                "wall_s": self.wall_s}


@dataclass(frozen=True)
class LinkBlock:
    """One state of the link (unshaped, or shaped by ``tbf``): its raw TCP throughput and
    each launcher's sweep."""

    tcp: TcpThroughput
    """Raw TCP from nodeA to nodeB."""
    fits: dict[str, SweepFit]
    """Launcher name -> its allreduce sweep on this link."""

    def as_dict(self) -> dict[str, Any]:
        """``{"tcp": ..., <launcher>: <sweep>, ...}``."""
        return {"tcp": self.tcp.as_dict(),
                **{name: fit.as_dict() for name, fit in self.fits.items()}}


def predict_shaped(unshaped: SweepFit, shaped: SweepFit, rate_bit: float,
                   min_bytes: int = 1 * MIB) -> ShapedPrediction:
    """The alpha-beta model on the shaped link: ``alpha`` fitted on the unshaped link (tbf
    adds no latency), ``beta = 8 / rate``; also with ``beta`` from the shaped link's raw TCP
    (``shaped.tcp_Bps``). Relative errors per size against the measured shaped times, and
    their mean over the sizes >= ``min_bytes`` (where the model's bandwidth term matters)."""
    alpha = unshaped.alpha_s
    sizes, times = shaped.sizes_bytes, shaped.times_s

    def ring(beta: float) -> RingPrediction:
        pred = [predict_ring(shaped.ranks, s, alpha, beta) for s in sizes]
        err = [relative_error(p, t) for p, t in zip(pred, times, strict=True)]
        big = ([abs(e) for s, e in zip(sizes, err, strict=True) if s >= min_bytes]
               or [abs(e) for e in err])
        return RingPrediction(beta_s_per_byte=beta, predicted_s=pred, rel_error=err,
                              mean_abs_error_large=float(np.mean(big)))

    return ShapedPrediction(alpha_s=alpha, rate=ring(8.0 / rate_bit),
                            tcp=ring(1.0 / shaped.tcp_Bps))


@dataclass(frozen=True)
class LinkResult:
    """What :func:`bench_link` measured across two nodes; ``str()`` gives the tables
    ``bench link`` prints, :meth:`tables` their rows."""

    preset: PresetName
    """Name in :data:`PRESETS`."""
    rate_bit: float
    """Rate of the shaped link (bits/s)."""
    sizes_bytes: list[int]
    """Allreduce sizes of the sweeps (bytes)."""
    launchers: list[str]
    """Names in :data:`LAUNCHERS`, in the order measured."""
    ips: tuple[str, str]
    """Addresses of nodeA and nodeB."""
    prefix: str
    """Name prefix of everything the run built (:func:`~chexnet_utils.cluster.netns.leftovers`
    finds what is left of it)."""
    unshaped: LinkBlock
    """The veth as it is."""
    shaped: LinkBlock
    """The veth shaped by ``tbf`` to :attr:`rate_bit`."""
    qdisc: str
    """``tc qdisc show`` of nodeA's veth while shaped."""
    counts: dict[str, LinkCounts]
    """Launcher -> bytes over the (unshaped) link per allreduce, one rank per node."""
    hierarchical: list[HierarchicalRow] | None
    """Two ranks per node with ``HOROVOD_HIERARCHICAL_ALLREDUCE`` (None: not run)."""
    wall_s: float
    """Wall time of the whole benchmark (s), building and removing the nodes included."""

    @cached_property
    def predictions(self) -> dict[str, ShapedPrediction]:
        """Launcher -> the alpha-beta model on the shaped link (:func:`predict_shaped`)."""
        return {name: predict_shaped(self.unshaped.fits[name], self.shaped.fits[name],
                                     self.rate_bit) for name in self.launchers}

    def as_dict(self) -> dict[str, Any]:
        """The saved JSON: ``counts`` inside each launcher's unshaped sweep, ``prediction``
        inside its shaped one, ``hierarchical`` only when run."""
        unshaped, shaped = self.unshaped.as_dict(), self.shaped.as_dict()
        predictions = self.predictions
        for name in self.launchers:
            unshaped[name]["counts"] = self.counts[name].as_dict()
            shaped[name]["prediction"] = predictions[name].as_dict()
        out: dict[str, Any] = {"preset": self.preset, "rate_bit": self.rate_bit,
                               "sizes_bytes": self.sizes_bytes, "launchers": self.launchers,
                               "ips": list(self.ips), "prefix": self.prefix,
                               "unshaped": unshaped, "shaped": shaped, "qdisc": self.qdisc}
        if self.hierarchical is not None:
            out["hierarchical"] = [row.as_dict() for row in self.hierarchical]
        out["wall_s"] = self.wall_s
        return out

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        """The results as table rows, keyed by caption (for
        :func:`chexnet_utils.notebook.tables.table` in a notebook; ``str()`` prints them)."""
        gbit = 8 / 1e9
        rate = f"tbf {self.rate_bit / 1e9:g} Gbit/s"
        rows = []
        for link, block in (("unshaped", self.unshaped), (rate, self.shaped)):
            for launcher in self.launchers:
                r = block.fits[launcher]
                rows.append({"link": link, "launcher": launcher,
                             "raw TCP Gbit/s": block.tcp.bytes_per_s * gbit,
                             "busbw Gbit/s": r.busbw_large_Bps * gbit,
                             "busbw/TCP": r.busbw_fraction_of_tcp,
                             "alpha us": r.alpha_s * 1e6,
                             "1/beta Gbit/s": r.fit_bandwidth_Bps * gbit,
                             "link bytes/expected": self.counts[launcher].ratio_to_flat})
        tables = {f"two nodes over a veth ({self.ips[0]} <-> {self.ips[1]}), largest "
                  f"allreduce {format_bytes(self.sizes_bytes[-1])}": rows}
        predictions = self.predictions
        tables["alpha-beta model on the shaped link: alpha fitted unshaped, mean |relative "
               "error| over sizes >= 1 MiB"] = [
            {"launcher": launcher,
             "alpha us (unshaped)": predictions[launcher].alpha_s * 1e6,
             "error, beta = 8/rate": predictions[launcher].rate.mean_abs_error_large,
             "error, beta = 1/raw TCP": predictions[launcher].tcp.mean_abs_error_large}
            for launcher in self.launchers]
        if self.hierarchical:
            tables["2 ranks per node: bytes over the link per allreduce"] = [
                {"launcher": r.launcher,
                 "HOROVOD_HIERARCHICAL_ALLREDUCE": int(r.counts.hierarchical_env),
                 "size": format_bytes(r.counts.count_bytes),
                 "link tx / allreduce": format_bytes(r.counts.tx_per_allreduce),
                 "flat ring expects": format_bytes(r.counts.expected_flat),
                 "hierarchical expects": format_bytes(r.counts.expected_hierarchical),
                 "time ms": r.time_s * 1e3} for r in self.hierarchical]
        return tables

    def loopback_comparison(self, loopback: Mapping[str, tuple[float, float]]
                            ) -> list[dict[str, Any]]:
        """Table rows: the alpha-beta fits of one machine's loopback (``loopback``: name ->
        ``(alpha_s, beta_s_per_byte)``, e.g. notebook 05's section 6 fits) beside the same
        fits across the two nodes' link, unshaped and shaped.

        ``1/beta`` is the bandwidth the model sees; loopback and an unshaped veth are both
        limited by the CPUs copying, the shaped link by its rate."""
        gbit = 8 / 1e9

        def row(where: str, launcher: str, alpha: float, beta: float) -> dict[str, Any]:
            return {"where": where, "launcher": launcher, "alpha us": alpha * 1e6,
                    "1/beta Gbit/s": gbit / beta if beta > 0 else float("inf")}

        rows = [row("one machine (loopback, shared memory)", name, a, b)
                for name, (a, b) in loopback.items()]
        rate = f"two nodes, tbf {self.rate_bit / 1e9:g} Gbit/s"
        for block, where in ((self.unshaped, "two nodes, veth unshaped"), (self.shaped, rate)):
            rows += [row(where, name, *block.fits[name].alpha_beta) for name in self.launchers]
        return rows

    def __str__(self) -> str:
        """``preset <name>, <wall> s``, then each of :meth:`tables` under its caption, as
        markdown (what ``bench link`` prints)."""
        return f"preset {self.preset}, {self.wall_s:.0f} s" + "".join(
            f"\n\n{caption}\n{markdown_table(rows, floatfmt='.3g')}"
            for caption, rows in self.tables().items())
