"""Command line: ``python -m chexnet_utils <command> ...``.

Commands
--------
``synth``      write a synthetic data set in the NIH ChestX-ray14 layout
``envcheck``   print versions and Horovod build capabilities; fail unless MPI and Gloo work
``data``       make sure the data set for ``CHEXNET_SCALE`` exists (generate the stand-in)
``tutorial``   execute notebooks headless and print the results table
``book``       the executed notebooks as a static site (Sphinx + MyST-NB), checked offline
``nbclean``    strip notebook outputs except checked cells (``--execute`` refreshes them)
``whoami``     (under mpirun) init Horovod, pin this process, print its rank as JSON
``tfrecords``  convert a data set in the NIH layout to sharded TFRecords (resumable)
``verify``     check converted TFRecords against their manifest (and the source data);
               exit 1 when anything does not match
``bench``      measurements: ``bench pipelines`` times the old vs the new tf.data input
               pipeline on converted TFRecords and writes the numbers as JSON;
               ``bench service`` a one-core trainer decoding locally vs fed by a tf.data
               service worker on another core (predicted vs measured speed-up);
               ``bench gpu-node`` trains CheXNet on 1..N GPUs (images/s, speed-up,
               efficiency beside published reference points; exit 3 without a GPU);
               ``bench link`` Horovod across two network namespaces (root; exit 3
               otherwise)
``train``      train CheXNet (or the small CPU model) on converted TFRecords; writes
               checkpoints, logs and metrics.json, prints the test mean AUROC (its options
               take their types, defaults and choices from ``TrainConfig``)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from chexnet_utils.platform.options import (
    Option,
    add_config_options,
)
from chexnet_utils.training import TrainConfig

Handler = Callable[[argparse.Namespace], int]


TRAIN_OPTIONS: dict[str, Option] = {
    "tfrecords": Option("--tfrecords", "converted folder", "DIR"),
    "arch": Option("--arch", "densenet121 (CheXNet), resnet50, or small (a CPU-sized CNN)"),
    "epochs": Option("--epochs", "total epochs (a resumed run continues up to N)", "N"),
    "out_dir": Option("--out", "output folder: checkpoints/, log.csv, tensorboard/, "
                               "metrics.json", "DIR"),
    "image_size": Option("--image-size", "model input side; CheXNet: 224", "PX"),
    "batch_size": Option("--batch-size", "per worker; CheXNet: 16", "N"),
    "learning_rate": Option("--lr", "Adam learning rate", "LR"),
    "pipeline": Option("--pipeline", "training input pipeline"),
    "resume": Option("--resume", "continue from the last checkpoint in --out (if there is one)"),
    "steps_per_epoch": Option("--steps-per-epoch", "default: train images // batch size", "N"),
    "seed": Option("--seed", "seeds Python, numpy, TensorFlow and the shuffles"),
    "weights": Option("--weights", "initial weights: ImageNet '*_notop.h5' of keras-"
                                   "applications (copied from a machine with internet) or a "
                                   "'.weights.h5' file", "FILE"),
    "distributed": Option("--horovod", "one Horovod worker of many: run under mpirun -np N "
                                       "/ horovodrun -np N"),
}
"""The ``train`` command's options: a :class:`~chexnet_utils.training.TrainConfig` field ->
its flag and help. Type, default and choices come from the field (see
:func:`add_config_options`); ``--quiet`` (``verbose=0``) is the one option added by hand."""

TRAIN_REQUIRED = ("arch", "epochs")
"""Fields the command asks for although ``TrainConfig`` has defaults: a training run says
what it trains and for how long."""


def _cmd_synth(args: argparse.Namespace) -> int:
    from chexnet_utils.data.nih import NIHDataset
    from chexnet_utils.data.synthetic import generate_dataset

    out = generate_dataset(args.out, n=args.n, size=args.size, seed=args.seed,
                           workers=args.workers, overwrite=args.overwrite)
    ds = NIHDataset.load(out)
    print(f"wrote {len(ds.records)} images ({args.size}x{args.size}) to {out}")
    return 0


def _cmd_envcheck(args: argparse.Namespace) -> int:
    from chexnet_utils.hardware.envcheck import environment_report, require_capabilities

    report = environment_report()
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        for key, value in report.items():
            print(f"{key:>22}: {value}")
    if args.require:
        require_capabilities(report, args.require.split(","))
    return 0


def _cmd_data(args: argparse.Namespace) -> int:
    from chexnet_utils.data.prepare import prepare_data

    ds = prepare_data()
    print(f"data set: {ds.root} ({len(ds.records)} images, "
          f"{len(ds.train_val_names)} train/val, {len(ds.test_names)} test)")
    return 0


def _cmd_tutorial(args: argparse.Namespace) -> int:
    from chexnet_utils.notebook.tutorial import run_tutorial

    runs = run_tutorial(args.notebooks, args.out)
    failed = [r.notebook.name for r in runs if r.error]
    if failed:
        print(f"error: {len(failed)} notebook(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _cmd_book(args: argparse.Namespace) -> int:
    from chexnet_utils.notebook.book import build_book

    results_json = args.results or args.out / "results.json"
    build_book(args.executed, args.out, results_json=results_json if results_json.exists()
               else None, repo_url=args.repo_url)
    return 0


def _cmd_whoami(args: argparse.Namespace) -> int:
    from chexnet_utils.cluster.distributed import rank_info

    print(json.dumps(rank_info()), flush=True)
    return 0


def _cmd_nbclean(args: argparse.Namespace) -> int:
    from chexnet_utils.notebook.clean import clean_all

    clean_all(args.notebooks, execute=args.execute)
    return 0


def _cmd_tfrecords(args: argparse.Namespace) -> int:
    from chexnet_utils.data.tfrecords import SKIPPED_TXT, convert_dataset

    result = convert_dataset(
        args.data_dir, args.out, image_size=args.image_size, encoding=args.encoding,
        shard_size=args.shard_size, shard_mb=args.shard_mb, workers=args.workers,
        on_error=args.on_error, val_fraction=args.val_fraction, seed=args.seed,
        progress=not args.no_progress, overwrite=args.overwrite,
        jpeg_quality=args.jpeg_quality)
    print(result.summary())
    for s in result.skipped[:20]:
        print(f"  skipped {s['name']} ({s['split']}): {s['reason']}")
    if len(result.skipped) > 20:
        print(f"  ... {len(result.skipped) - 20} more in {args.out / SKIPPED_TXT}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from chexnet_utils.data.tfrecords import verify

    report = verify(args.tfrecords, data_dir=args.data_dir, decode_images=args.decode)
    print(report)
    return 0 if report.ok else 1


def _progress(msg: str) -> None:
    """A benchmark's progress line (``log=``): on stderr, so stdout keeps only the table."""
    print(f"... {msg}", file=sys.stderr, flush=True)


def _write_json(path: Path | None, result: object) -> None:
    """Write a command's ``--json`` result (atomically, strict JSON; a dataclass result as
    its ``as_dict()``), if asked to."""
    if path is not None:
        from chexnet_utils.platform.atomic import write_json_atomic

        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, result)
        print(f"wrote {path}")


def _cmd_train(args: argparse.Namespace) -> int:
    from chexnet_utils.training import train

    cfg = TrainConfig(**{name: getattr(args, name) for name in TRAIN_OPTIONS},
                      verbose=0 if args.quiet else 2)
    result = train(cfg)
    if result.rank != 0:
        return 0  # under Horovod only rank 0 reports
    print(f"mean AUROC {result.mean_auroc:.4f} (test, best epoch {result.best_epoch} of "
          f"{result.epochs}); {result.img_per_s:.1f} img/s; metrics: {result.metrics_path}")
    return 0


def _add_book_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``book``: the executed notebooks as a static site."""
    p = sub.add_parser("book", help="the executed notebooks as a static site")
    p.add_argument("--executed", type=Path, default=Path("build/executed"),
                   help="executed notebooks (make tutorial's, or make test's)")
    p.add_argument("--out", type=Path, default=Path("build"), help="-> <out>/book")
    p.add_argument("--results", type=Path, default=None,
                   help="results.json for the table (default: <out>/results.json)")
    p.add_argument("--repo-url", default=None, help="a repository button on every page")
    p.set_defaults(handler=_cmd_book)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command."""
    parser = argparse.ArgumentParser(prog="python -m chexnet_utils", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    _add_data_commands(sub)
    _add_book_command(sub)
    _add_bench_commands(sub)
    _add_train_command(sub)
    return parser


def _add_data_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The data and tooling commands: synth, envcheck, data, tutorial, nbclean, whoami,
    tfrecords, verify."""
    p = sub.add_parser("synth", help="write a synthetic NIH-format data set")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--n", type=int, default=600, help="number of images (default 600)")
    p.add_argument("--size", type=int, default=1024, help="image side in px (default 1024)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the contents of a non-empty --out")
    p.set_defaults(handler=_cmd_synth)

    p = sub.add_parser("envcheck", help="versions and Horovod build capabilities")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--require", default="",
                   help="comma list of capabilities that must be present, "
                        "e.g. tensorflow,mpi,gloo")
    p.set_defaults(handler=_cmd_envcheck)

    p = sub.add_parser("data", help="make sure the data set for CHEXNET_SCALE exists")
    p.set_defaults(handler=_cmd_data)

    p = sub.add_parser("tutorial", help="execute notebooks headless, print the results")
    p.add_argument("--out", type=Path, default=Path("build"), help="output folder")
    p.add_argument("notebooks", type=Path, nargs="+")
    p.set_defaults(handler=_cmd_tutorial)

    p = sub.add_parser("nbclean", help="strip outputs except nbval-checked cells")
    p.add_argument("--execute", action="store_true", help="run the notebook first")
    p.add_argument("notebooks", type=Path, nargs="+")
    p.set_defaults(handler=_cmd_nbclean)

    p = sub.add_parser("whoami", help="under mpirun: Horovod rank, local rank, placement")
    p.set_defaults(handler=_cmd_whoami)

    p = sub.add_parser("tfrecords", help="convert an NIH-layout data set to sharded TFRecords")
    p.add_argument("--data-dir", type=Path, required=True,
                   help="folder with Data_Entry_2017.csv, the split lists and the images")
    p.add_argument("--out", type=Path, required=True, help="output folder (resumed if present)")
    p.add_argument("--image-size", type=int, default=None, metavar="PX",
                   help="resize to PX x PX at conversion time (default: keep the source size)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--shard-size", type=int, default=None, metavar="N",
                      help="exactly N images per shard (the last shard takes the remainder); "
                           "no rounding, you choose the count")
    size.add_argument("--shard-mb", type=float, default=None, metavar="MB",
                      help="shards of at most about MB each (default 100), their number per "
                           "split rounded up to a multiple of 8 and at least 8 (one per image "
                           "below 8 images), so file-level sharding over 1, 2, 4 or 8 "
                           "workers is even; the counts are printed at the end")
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--on-error", choices=("fail", "skip"), default="fail",
                   help="bad image: stop (fail, default) or leave it out and list it in "
                        "skipped.json (skip)")
    p.add_argument("--encoding", choices=("png", "jpeg"), default="png",
                   help="stored encoding (default png; 8-bit grey PNGs are stored unchanged "
                        "when not resized)")
    p.add_argument("--jpeg-quality", type=int, default=95, help="JPEG quality (default 95)")
    p.add_argument("--val-fraction", type=float, default=0.1,
                   help="share of the train_val patients held out for validation (default 0.1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the patient split")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a conversion with different parameters in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=_cmd_tfrecords)

    p = sub.add_parser("verify", help="check TFRecords against their manifest (exit 1 on "
                                      "any problem)")
    p.add_argument("--tfrecords", type=Path, required=True, help="converted folder")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="also check that every source image is stored once with its label")
    p.add_argument("--decode", action="store_true", help="also decode every stored image")
    p.set_defaults(handler=_cmd_verify)


def _add_bench_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``bench <name>``: one sub-command per module of the bench wing that declares a
    ``COMMAND`` (:mod:`chexnet_utils.bench.registry`), each with ``--json``."""
    from chexnet_utils.bench.registry import bench_commands

    commands = bench_commands()
    p = sub.add_parser("bench", help=f"measurements: bench {' | '.join(commands)}")
    bench = p.add_subparsers(dest="bench_command", required=True)
    for name, command in commands.items():
        b = bench.add_parser(name, help=command.help)
        if command.add_arguments is not None:
            command.add_arguments(b)
        add_config_options(b, command.function, command.options)
        b.add_argument("--json", type=Path, required=command.json_required, default=None,
                       help="write the results here")
        b.set_defaults(handler=_cmd_bench, bench_run=command.run)


def _cmd_bench(args: argparse.Namespace) -> int:
    """Run ``bench <name>`` (its ``COMMAND.run``, put on ``args`` by the parser): print its
    result (the table) and write its ``--json``; an int from the command is its exit code (it
    cannot run here, and said why)."""
    result = args.bench_run(args, _progress)
    if isinstance(result, int):
        return result
    print(result)
    _write_json(args.json, result)
    return 0


def _add_train_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``train``: its options from :data:`TRAIN_OPTIONS` and ``TrainConfig``, and ``--quiet``."""
    p = sub.add_parser("train", help="train CheXNet on converted TFRecords, write metrics.json")
    add_config_options(p, TrainConfig, TRAIN_OPTIONS, required=TRAIN_REQUIRED)
    p.add_argument("--quiet", action="store_true", help="no per-epoch progress lines")
    p.set_defaults(handler=_cmd_train)


def _check_outputs(args: argparse.Namespace) -> None:
    """Prove that a command's output folders can be written before work that writes late
    (a benchmark's ``--json``, the first epoch of ``train``, the first notebook of
    ``tutorial``; ``tfrecords`` checks its own before the scan)."""
    from chexnet_utils.platform.atomic import require_writable_dir

    json_path = getattr(args, "json", None)
    if isinstance(json_path, Path):
        require_writable_dir(json_path.parent)
    if args.command == "train":
        require_writable_dir(args.out_dir)  # --out, TrainConfig.out_dir
    if args.command in ("tutorial", "book"):
        require_writable_dir(args.out)


def error_line(e: BaseException) -> str:
    """What is printed for an error: ``<file>: <reason>`` for an operating-system error
    about a file (no ``[Errno N]``), the message otherwise."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    return str(e) or type(e).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    from chexnet_utils.platform.processes import command_lifetime, exit_status, interruption

    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    # SIGTERM cleans up like Ctrl-C; nothing the command started outlives it, not even
    # after a SIGKILL (chexnet_utils.platform.processes). `whoami` and `envcheck` start nothing.
    with command_lifetime(watchdog=args.command not in ("whoami", "envcheck")):
        try:
            _check_outputs(args)
            return handler(args)
        except (ValueError, OSError, RuntimeError) as e:  # bad input, a read-only or full disk
            print(f"error: {error_line(e)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as e:
            print(f"\ninterrupted by {interruption(e)}: stopped its workers; finished work is "
                  "kept (run the same command again to resume where that applies)",
                  file=sys.stderr, flush=True)
            return exit_status(e)
