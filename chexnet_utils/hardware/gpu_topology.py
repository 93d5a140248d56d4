"""Bind each GPU's process to the cores of that GPU's own socket, from ``nvidia-smi topo -m``.

Why it matters
--------------
On a two-socket node every GPU hangs off the PCIe lanes of **one** CPU socket. The process
that feeds a GPU decodes images into host memory and copies each batch to the GPU over PCIe.
If that process runs on the *other* socket, its memory is allocated there (Linux puts pages
on the NUMA node of the core that first touches them), and every batch crosses the link
between the sockets (QPI/UPI, ``SYS`` in the topology matrix) before it reaches the GPU's
PCIe root, competing with the other socket's traffic; the decoding threads also lose their
caches whenever the scheduler moves them. Keeping rank *i* on the cores of GPU *i*'s socket
keeps its memory, its copies and its threads local. That is what the Dell articles found
fastest on the PowerEdge C4140 (``mpirun --map-by socket``).

A trap: ``--map-by socket`` places ranks **round-robin** over the sockets (rank 0 on socket 0,
rank 1 on socket 1, rank 2 on socket 0, ...), while Horovod pins rank *i* to GPU *i* by local
rank. That is right only if the GPUs alternate between the sockets too. On a DGX-1, GPUs 0-3
sit on socket 0 and 4-7 on socket 1, so round-robin puts GPU 1's process on the wrong
socket; there ``--map-by ppr:4:socket`` (4 processes per socket, filled in order) is right.
:func:`binding_plan` reads the topology and picks the mapping that matches, or gives each
rank its explicit core list when no ``mpirun`` mapping fits.

``nvidia-smi topo -m`` prints, per GPU, its links to the other devices and its ``CPU
Affinity`` (the cores local to it, Linux CPU numbers including hyper-threads, e.g.
``0-19,40-59``) and ``NUMA Affinity`` (its NUMA node). The mapping assumes one NUMA node per
socket (check with ``lscpu``); with several per socket (sub-NUMA clustering, AMD EPYC NPS2/4)
use ``unit="numa"``.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from chexnet_utils.hardware.devices import run_nvidia_smi, usable_cpus

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class GpuAffinity:
    """One GPU row of ``nvidia-smi topo -m``."""

    gpu: int
    cpus: tuple[int, ...]
    """Linux CPU numbers local to this GPU (``CPU Affinity``)."""
    numa: int | None
    """``NUMA Affinity`` (``None`` when the column is missing or ``N/A``)."""


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """``"0-3,8,10-11"`` -> ``(0, 1, 2, 3, 8, 10, 11)`` (sorted, no repeats)."""
    cpus: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"not a CPU list: {text!r}")
        cpus.update(range(int(lo), int(hi) + 1) if sep else (int(lo),))
    return tuple(sorted(cpus))


def _cells(line: str, tabbed: bool) -> list[str]:
    return [c.strip() for c in (line.split("\t") if tabbed else re.split(r" {2,}", line))]


def parse_topology(text: str) -> list[GpuAffinity]:
    """The GPU rows of ``nvidia-smi topo -m`` output (NIC rows and the legend are skipped).

    Columns are found by their header names (``CPU Affinity``, ``NUMA Affinity``), so newer
    drivers' extra columns (``GPU NUMA ID``) do not matter. Raises ``ValueError`` when the
    text has no ``CPU Affinity`` header.
    """
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    header_at = next((i for i, line in enumerate(lines) if "CPU Affinity" in line), None)
    if header_at is None:
        raise ValueError("no 'CPU Affinity' column: is this `nvidia-smi topo -m` output?")
    header = lines[header_at]
    tabbed = "\t" in header
    columns = _cells(header, tabbed)
    if not tabbed and columns and columns[0].startswith("GPU"):
        columns = ["", *columns]  # the empty corner cell vanished with the tabs
    cpu_col = columns.index("CPU Affinity")
    numa_col = columns.index("NUMA Affinity") if "NUMA Affinity" in columns else None
    found: list[GpuAffinity] = []
    for line in lines[header_at + 1:]:
        cells = _cells(line, tabbed)
        m = re.fullmatch(r"GPU(\d+)", cells[0]) if cells else None
        if not m:
            if not line.strip() or line.lstrip().startswith("Legend"):
                if found:
                    break
            continue
        numa = None
        if numa_col is not None and numa_col < len(cells) and cells[numa_col].isdigit():
            numa = int(cells[numa_col])
        found.append(GpuAffinity(int(m.group(1)), parse_cpu_list(cells[cpu_col]), numa))
    return found


def read_topology(run: Callable[..., subprocess.CompletedProcess[str]] | None = None
                  ) -> str | None:
    """The text of ``nvidia-smi topo -m`` on this machine, or ``None`` (no ``nvidia-smi`` or
    it failed: no GPU). ``run`` replaces :func:`subprocess.run` (tests)."""
    text = run_nvidia_smi(["topo", "-m"], run)
    return text if text is not None and "CPU Affinity" in text else None


@dataclass(frozen=True)
class BindingPlan:
    """Where each local rank should run (rank *i* drives the *i*-th visible GPU)."""

    mpirun_args: tuple[str, ...]
    """For ``mpirun`` / ``MPICluster(mpi_args=...)``. When no mapping fits:
    ``--bind-to none``, and :attr:`self_bind` is set."""
    self_bind: bool
    """Each rank must bind itself: :func:`bind_this_process` with its :attr:`rank_cpus`."""
    rank_gpus: tuple[int, ...]
    """Physical GPU index (``nvidia-smi`` numbering) of each local rank."""
    rank_cpus: tuple[tuple[int, ...], ...]
    """The cores local to each rank's GPU (explicit ranges from ``CPU Affinity``)."""
    rank_domains: tuple[int | None, ...]
    """Each rank's NUMA node (``None``: unknown)."""
    explanation: str


def _ranges(cpus: Sequence[int]) -> str:
    out: list[str] = []
    for c in sorted(cpus):
        if out and c == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)


def binding_plan(affinities: Sequence[GpuAffinity], n_ranks: int,
                 visible: Sequence[int] | None = None, unit: str = "socket") -> BindingPlan:
    """The ``mpirun`` mapping that puts local rank *i* on the socket of its GPU.

    ``visible``: physical indices of the GPUs the ranks use, in CUDA order (what
    ``CUDA_VISIBLE_DEVICES`` selected; default ``0..n_ranks-1``). ``unit``: ``"socket"``
    (one NUMA node per socket) or ``"numa"``.

    * GPUs grouped by NUMA node in rank order, the same number ``k`` on each node, the
      nodes numbered from 0: ``--map-by ppr:k:<unit> --bind-to <unit>`` (a DGX-1: ``ppr:4``;
      a one-socket node: ``ppr:n``);
    * GPUs alternating over ``s`` nodes (GPU *i* on node ``i % s``): ``--map-by <unit>
      --bind-to <unit>`` (round-robin, the articles' ``--map-by socket``);
    * anything else (e.g. only the GPUs of socket 1, or unknown NUMA nodes): ``--bind-to
      none``, and each rank binds itself to :attr:`BindingPlan.rank_cpus` with
      :func:`bind_this_process`.

    Each rank is bound to its whole socket, not to one core: its input pipeline needs
    many threads, and the ``k`` ranks of a socket share its cores.
    """
    if unit not in ("socket", "numa"):
        raise ValueError(f"unit must be 'socket' or 'numa', got {unit!r}")
    by_gpu = {a.gpu: a for a in affinities}
    gpus = list(visible) if visible is not None else list(range(n_ranks))
    if n_ranks < 1 or len(gpus) < n_ranks:
        raise ValueError(f"{n_ranks} rank(s) but {len(gpus)} visible GPU(s)")
    gpus = gpus[:n_ranks]
    missing = [g for g in gpus if g not in by_gpu]
    if missing:
        raise ValueError(f"GPU(s) {missing} not in the topology (it lists {sorted(by_gpu)})")
    rows = [by_gpu[g] for g in gpus]
    domains = tuple(r.numa for r in rows)
    cpus = tuple(r.cpus for r in rows)
    lines = [f"rank {i} -> GPU {g}: NUMA node {d if d is not None else '?'}, cores "
             f"{_ranges(c)}" for i, (g, d, c) in enumerate(zip(gpus, domains, cpus, strict=True))]

    args: tuple[str, ...] = ("--bind-to", "none")
    how = ("no mpirun mapping matches this GPU order (or the NUMA nodes are unknown): bind "
           "each rank to its GPU's cores explicitly (bind_this_process)")
    if None not in domains:
        nodes = sorted(set(domains))  # type: ignore[type-var]  # no None: checked just above
        k = domains.count(domains[0])
        blocks = [domains[i:i + k] for i in range(0, n_ranks, k)]
        if (nodes == list(range(len(nodes)))
                and all(len(set(b)) == 1 for b in blocks)  # the last block may be short
                and [b[0] for b in blocks] == nodes):
            args = ("--map-by", f"ppr:{k}:{unit}", "--bind-to", unit)
            how = (f"GPUs in blocks of {k} per {unit}, in rank order: {k} process(es) per "
                   f"{unit}, filled in order, each free to use its {unit}'s cores")
        elif len(nodes) > 1 and nodes == list(range(len(nodes))) \
                and all(d == i % len(nodes) for i, d in enumerate(domains)):
            args = ("--map-by", unit, "--bind-to", unit)
            how = (f"GPUs alternate over {len(nodes)} {unit}s: round-robin mapping by "
                   f"{unit} (mpirun --map-by {unit}) sends rank i to GPU i's {unit}")
    return BindingPlan(args, args == ("--bind-to", "none"), tuple(gpus), cpus, domains,
                       "\n".join([how, *lines]))


def bind_this_process(cpus: Sequence[int]) -> tuple[int, ...]:
    """Restrict this process (and the threads it starts afterwards) to ``cpus`` that exist
    here; returns the cores it may now use. For ranks whose ``mpirun`` mapping cannot be
    expressed (:attr:`BindingPlan.rank_cpus`). Call it before TensorFlow starts its threads."""
    allowed = set(cpus) & set(range(os.cpu_count() or 1))
    if not allowed:
        raise ValueError(f"none of the cores {_ranges(cpus)} exists on this machine")
    os.sched_setaffinity(0, allowed)
    return usable_cpus()


EXAMPLE_DGX1_TOPOLOGY = (
    # Illustrative: the layout of a DGX-1-like node (2 sockets x 20 cores with
    # hyper-threading, 8 V100 in two NVLink quads, 4 InfiniBand NICs), written for teaching,
    # not captured from a particular machine.
    "\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tmlx5_0\tmlx5_1\tmlx5_2\tmlx5_3"
    "\tCPU Affinity\tNUMA Affinity\n"
    "GPU0\t X \tNV1\tNV1\tNV2\tNV2\tSYS\tSYS\tSYS\tPIX\tSYS\tPHB\tSYS\t0-19,40-59\t0\n"
    "GPU1\tNV1\t X \tNV2\tNV1\tSYS\tNV2\tSYS\tSYS\tPIX\tSYS\tPHB\tSYS\t0-19,40-59\t0\n"
    "GPU2\tNV1\tNV2\t X \tNV2\tSYS\tSYS\tNV1\tSYS\tPHB\tSYS\tPIX\tSYS\t0-19,40-59\t0\n"
    "GPU3\tNV2\tNV1\tNV2\t X \tSYS\tSYS\tSYS\tNV1\tPHB\tSYS\tPIX\tSYS\t0-19,40-59\t0\n"
    "GPU4\tNV2\tSYS\tSYS\tSYS\t X \tNV1\tNV1\tNV2\tSYS\tPIX\tSYS\tPHB\t20-39,60-79\t1\n"
    "GPU5\tSYS\tNV2\tSYS\tSYS\tNV1\t X \tNV2\tNV1\tSYS\tPIX\tSYS\tPHB\t20-39,60-79\t1\n"
    "GPU6\tSYS\tSYS\tNV1\tSYS\tNV1\tNV2\t X \tNV2\tSYS\tPHB\tSYS\tPIX\t20-39,60-79\t1\n"
    "GPU7\tSYS\tSYS\tSYS\tNV1\tNV2\tNV1\tNV2\t X \tSYS\tPHB\tSYS\tPIX\t20-39,60-79\t1\n"
    "mlx5_0\tPIX\tPIX\tPHB\tPHB\tSYS\tSYS\tSYS\tSYS\t X \tSYS\tPHB\tSYS\n"
    "mlx5_1\tSYS\tSYS\tSYS\tSYS\tPIX\tPIX\tPHB\tPHB\tSYS\t X \tSYS\tPHB\n"
    "mlx5_2\tPHB\tPHB\tPIX\tPIX\tSYS\tSYS\tSYS\tSYS\tPHB\tSYS\t X \tSYS\n"
    "mlx5_3\tSYS\tSYS\tSYS\tSYS\tPHB\tPHB\tPIX\tPIX\tSYS\tPHB\tSYS\t X \n"
    "\n"
    "Legend:\n"
    "\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes "
    "(e.g., QPI/UPI)\n"
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
    "  PIX  = Connection traversing at most a single PCIe bridge\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
)
"""``nvidia-smi topo -m`` of an illustrative DGX-1-like node (see the comment inside)."""
