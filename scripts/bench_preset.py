"""Benchmark: does a shorter ci preset still show a notebook's effects? (``make bench-preset``)

The ci preset (``chexnet_utils.config.SCALES["ci"]``) sets how many batches, steps and
repeats the notebooks time under nbval; fewer make ``make test`` faster and each figure
noisier. This runs a whole notebook top to bottom (``tutorial.execute_notebook``: a fresh
kernel; the executed copies in ``<work dir>/bench-preset/A`` and ``B``) alternately
under two settings of the preset's environment overrides (A, B, B, A, ...; e.g.
``CHEXNET_BENCH_BATCHES=8`` against ``=5``), reads the headline figures the notebook recorded
(``results.json``) after each run, and prints, per figure, every run's value under each
setting with their median and spread (max / min), and each setting's wall time. An effect
"still shows" when B's runs land where A's do and B's spread is no wider than A's.

    python scripts/bench_preset.py --notebook 02_input_pipeline_old_vs_new \\
        --a CHEXNET_BENCH_BATCHES=8 --b CHEXNET_BENCH_BATCHES=5 --repeats 2 \\
        --keys new_over_old new_over_ceiling idle_fraction_old idle_fraction_new
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from chexnet_utils import config
from chexnet_utils.notebook import results
from chexnet_utils.notebook.tutorial import execute_notebook
from chexnet_utils.platform.processes import command_lifetime, exit_status, interruption


def run_notebook(path: Path, env: dict[str, str], out_dir: Path, timeout: int) -> float:
    """:func:`chexnet_utils.notebook.tutorial.execute_notebook` (a fresh kernel, the executed copy
    in ``out_dir``) with ``env`` added to the kernel's environment; the wall seconds it took.
    A failed cell stops the benchmark: its figures would not be the notebook's."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        run = execute_notebook(path, out_dir, timeout=timeout)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if run.error:
        raise SystemExit(f"{path.name} with {env} failed: {run.error} (see {run.executed})")
    return run.seconds


def parse_env(pairs: list[str]) -> dict[str, str]:
    """``["NAME=value", ...]`` -> ``{"NAME": "value"}``; only the preset's overrides."""
    env = dict(p.split("=", 1) for p in pairs)
    unknown = sorted(set(env) - set(config.OVERRIDES))
    if unknown:
        raise SystemExit(f"not a preset override: {unknown} (config.OVERRIDES: "
                         f"{sorted(config.OVERRIDES)})")
    return env


def summary(values: list[float]) -> str:
    if not values:
        return "no values"
    lo, hi = min(values), max(values)
    spread = f"{hi / lo:.2f}" if lo > 0 else "n/a"
    return (f"{' '.join(f'{v:.3g}' for v in values)}  median {statistics.median(values):.3g}, "
            f"max/min {spread}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--notebook", required=True, help="name in notebooks/, without .ipynb")
    ap.add_argument("--a", nargs="+", required=True, help="setting A: NAME=value ...")
    ap.add_argument("--b", nargs="+", required=True, help="setting B: NAME=value ...")
    ap.add_argument("--keys", nargs="+", required=True, help="headline figures to compare")
    ap.add_argument("--record", help="the notebook's results.json key (default: --notebook)")
    ap.add_argument("--repeats", type=int, default=2, help="runs per setting")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per cell")
    ap.add_argument("--json", type=Path, help="write every run's figures here")
    args = ap.parse_args(argv)
    # as every command of the package: SIGTERM cleans up like Ctrl-C (the notebook's kernel
    # is shut down) and nothing it started outlives it
    with command_lifetime():
        try:
            return compare(args)
        except KeyboardInterrupt as e:
            print(f"\ninterrupted by {interruption(e)}", file=sys.stderr, flush=True)
            return exit_status(e)


def compare(args: argparse.Namespace) -> int:
    """Run the notebook under both settings, alternating; print and write the figures."""
    path = config.repo_root() / "notebooks" / f"{args.notebook}.ipynb"
    if not path.exists():
        raise SystemExit(f"no notebook {path}")
    record = args.record or args.notebook
    settings = {"A": parse_env(args.a), "B": parse_env(args.b)}
    runs: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    order = [s for r in range(args.repeats) for s in (("A", "B") if r % 2 == 0 else ("B", "A"))]
    for i, name in enumerate(order, 1):
        wall = run_notebook(path, settings[name], config.work_dir() / "bench-preset" / name,
                            args.timeout)
        headline = results.load(results.results_path()).get(record, {})
        runs[name].append({"wall_s": wall, **{k: headline.get(k) for k in args.keys}})
        print(f"[{i}/{len(order)}] {name} {settings[name]}: {wall:.1f} s", flush=True)
    print(f"\n{args.notebook}, {args.repeats} runs per setting, alternating")
    for name in ("A", "B"):
        print(f"  {name}: {settings[name]}")
    for key in ["wall_s", *args.keys]:
        print(f"{key}:")
        for name in ("A", "B"):
            values = [r[key] for r in runs[name] if isinstance(r[key], (int, float))]
            print(f"  {name}: {summary(values)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"notebook": args.notebook, "settings": settings,
                                         "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
