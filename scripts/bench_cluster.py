"""Benchmark: how long an ``MPICluster`` takes to start and to stop, this project's settings
against ipyparallel's and Open MPI's defaults, side by side in one run (``make bench-cluster``).

* **defaults**: the controller pings every 3000 ms (ipyparallel 9.2 ``HeartMonitor.period``),
  and ``stop()`` leaves the engines to ``mpiexec``, which sends SIGCONT, waits 1 s, SIGTERM,
  waits 1 s, SIGKILL (:data:`chexnet_utils.platform.processes.MPIEXEC_KILL_SEQUENCE`).
* **project**: :data:`chexnet_utils.cluster.distributed.HEARTBEAT_MS` and the engines SIGTERMed
  first (``MPICluster._terminate_local_engines``).

The two alternate (A, B, B, A, ...) so that a noisy machine hits both alike; the medians and
their ratio are printed, and written as JSON with ``--json``. Every cluster also runs one
task on all its engines, so a start counts only once the engines really answer. With
``--busy`` each cluster is stopped while its engines sleep in a task (a busy engine ignores
SIGTERM: stopping it must not take longer than ``mpiexec``'s own 2 s).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from chexnet_utils.cluster.distributed import MPICluster


class DefaultsCluster(MPICluster):
    """An ``MPICluster`` with ipyparallel's heartbeat and ``mpiexec``'s own kill sequence."""

    def ipyparallel_config(self, cfg: object, extra_env: Any = None) -> dict[str, object]:
        settings = super().ipyparallel_config(cfg, extra_env)
        settings.pop("controller_args", None)
        return settings

    def _terminate_local_engines(self, timeout: float = 3.0) -> list[Any]:
        return []


def lifecycle(kind: type[MPICluster], n: int, busy: bool = False) -> tuple[float, float]:
    """Start a cluster of ``n`` engines, run a task on all of them, stop it (with ``busy``,
    while every engine sleeps in a second task): (start s, stop s)."""
    cluster = kind(n=n)
    with cluster:
        assert sorted(cluster.run(os.getpid)) == sorted(cluster.engine_pids)
        if busy:
            cluster.view.apply_async(time.sleep, 60)
            time.sleep(1.0)  # the task has reached the engines
    return cluster.start_seconds or 0.0, cluster.stop_seconds or 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="lifecycles of each kind")
    p.add_argument("--busy", action="store_true", help="stop while the engines run a task")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    kinds = {"defaults": DefaultsCluster, "project": MPICluster}
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    for r in range(args.repeats):
        for name in (list(kinds) if r % 2 == 0 else list(kinds)[::-1]):
            runs[name].append(lifecycle(kinds[name], args.engines, args.busy))
            start, stop = runs[name][-1]
            print(f"{name:>8}: start {start:5.2f} s, stop {stop:5.2f} s", flush=True)
    med = {k: {"start_s": statistics.median(s for s, _ in v),
               "stop_s": statistics.median(t for _, t in v)} for k, v in runs.items()}
    for _k, m in med.items():
        m["lifecycle_s"] = m["start_s"] + m["stop_s"]
    ratio = med["defaults"]["lifecycle_s"] / med["project"]["lifecycle_s"]
    print(f"medians of {args.repeats}, {args.engines} {'busy ' if args.busy else ''}engines: "
          "defaults start "
          f"{med['defaults']['start_s']:.2f} s + stop {med['defaults']['stop_s']:.2f} s; project "
          f"start {med['project']['start_s']:.2f} s + stop {med['project']['stop_s']:.2f} s; "
          f"defaults / project = {ratio:.2f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"engines": args.engines, "repeats": args.repeats,
                                         "busy": args.busy,
                                         "runs": runs, "median": med, "ratio": ratio},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
