"""``python -m chexnet_utils bench <name>``: every benchmark command, found in one place.

A benchmark is one module ``chexnet_utils/bench/<name>.py`` (``-`` in the command is ``_``
in the file: ``bench gpu-node`` is ``bench/gpu_node.py``) that ends with a
``COMMAND = BenchCommand(...)``: its help line, its function, the options it exposes (an
:class:`~chexnet_utils.platform.options.Option` per parameter: type, default and choices come
from the function's signature) and how a parsed command line runs it. :func:`bench_commands`
finds them; :mod:`chexnet_utils.cli` builds ``bench``'s sub-commands from them, adds
``--json`` to each, prints the result (its table) and writes its JSON. Adding a benchmark
touches no other module (``docs/architecture.md``, "Where to add ...").
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chexnet_utils.platform.options import Option

__all__ = ["BenchCommand", "bench_commands", "full_size_tfrecords", "tfrecords_argument"]


@dataclass(frozen=True)
class BenchCommand:
    """One ``bench`` sub-command, declared at the end of its module."""

    help: str
    """The line ``python -m chexnet_utils bench --help`` shows."""
    function: Callable[..., Any]
    """The benchmark: its parameters give the options' types, defaults and choices."""
    options: Mapping[str, Option]
    """Parameter of :attr:`function` -> its flag and help."""
    run: Callable[[argparse.Namespace, Callable[[str], None]], Any]
    """``run(args, log)``: the result (printed, and written with ``--json``), or an int exit
    code when it cannot run here (a message on stderr first)."""
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    """Options that are not a parameter of :attr:`function` (added by hand)."""
    json_required: bool = False
    """``--json`` must be given (else optional)."""


def bench_commands() -> dict[str, BenchCommand]:
    """Command name -> its :class:`BenchCommand`: every module of this wing with a
    ``COMMAND``, named after the module, in alphabetical order."""
    package = importlib.import_module("chexnet_utils.bench")
    found: dict[str, BenchCommand] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        command = getattr(module, "COMMAND", None)
        if isinstance(command, BenchCommand):
            found[info.name.replace("_", "-")] = command
    return found


def tfrecords_argument(parser: argparse.ArgumentParser) -> None:
    """``--tfrecords`` with the default :func:`full_size_tfrecords` falls back to."""
    parser.add_argument("--tfrecords", type=Path, default=None,
                        help="converted folder (default: full-size shards of the scale's data "
                             "set, made if missing)")


def full_size_tfrecords(path: Path | None) -> Path:
    """``--tfrecords``, or the full-size shards of the scale's data set (made if missing)."""
    if path is not None:
        return path
    from chexnet_utils.data.prepare import prepare_tfrecords

    return prepare_tfrecords(image_size=None, progress=False)
