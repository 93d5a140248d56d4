"""Conversion throughput: :func:`bench_conversion` times :func:`convert_dataset` with 1 and N
worker processes side by side (``python -m chexnet_utils bench conversion``) and returns a
:class:`ConversionThroughput` (``print(result)``: the table; ``result.as_dict()``: its JSON)."""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from chexnet_utils.bench.registry import BenchCommand
from chexnet_utils.data.tfrecords.convert import convert_dataset
from chexnet_utils.hardware.devices import usable_cores
from chexnet_utils.platform.lazy import lazy_module
from chexnet_utils.platform.options import Option, default_of, option_values, shown_default
from chexnet_utils.platform.timing import mean_std, ratio

# TensorFlow: imported on first use (chexnet_utils.platform.lazy)
tf = lazy_module("tensorflow")

__all__ = ["COMMAND", "OPTIONS", "ConversionRuns", "ConversionThroughput", "bench_conversion",
           "decode_ms", "image_sizes"]


@dataclass(frozen=True)
class ConversionRuns:
    """The conversions of one image size: images/s of every run, per worker count."""

    img_per_s: dict[int, list[float]]
    """Worker count -> images/s of each repeat (whole call), in the order the counts were
    given (:func:`bench_conversion`'s default: 1, then one per core)."""

    @property
    def mean_img_per_s(self) -> dict[int, float]:
        """Worker count -> mean images/s over the repeats."""
        return {w: mean_std(v)[0] for w, v in self.img_per_s.items()}

    @property
    def speedup(self) -> float:
        """Mean images/s with the last worker count given over the first (N workers over 1
        with the default counts)."""
        means = list(self.mean_img_per_s.values())
        return ratio(means[-1], means[0])

    def as_dict(self) -> dict[str, Any]:
        """The JSON layout: ``img_per_s``, ``mean_img_per_s``, ``speedup``."""
        return {"img_per_s": self.img_per_s, "mean_img_per_s": self.mean_img_per_s,
                "speedup": self.speedup}


@dataclass(frozen=True)
class ConversionThroughput:
    """What :func:`bench_conversion` measured; ``print(result)`` shows the table."""

    cores: int | None
    """Cores this process could use."""
    workers: list[int]
    """The worker counts, in the order given."""
    repeats: int
    """Conversions per worker count and image size."""
    shard_size: int | None
    """Records per shard (``None``: the converter's default)."""
    data_dir: str
    """The data set converted."""
    n_images: int
    """Images in one conversion (0 when nothing ran)."""
    runs: dict[str, ConversionRuns] = field(default_factory=dict)
    """Image size (``"original"``: the stored bytes kept, or the side in px as text) -> its
    runs."""

    def as_dict(self) -> dict[str, Any]:
        """The ``--json`` layout (as before the dataclass): the fields, each size's runs with
        their means and speed-up."""
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "runs"},
                "runs": {key: run.as_dict() for key, run in self.runs.items()}}

    def __str__(self) -> str:
        """The table ``bench conversion`` prints: mean images/s per worker count and the
        speed-up, one line per image size."""
        lines = [f"conversion of {self.n_images or '?'} images, {self.cores} cores, "
                 f"{self.repeats} repeats (images/s, whole call):"]
        for key, run in self.runs.items():
            cells = "  ".join(f"{w} worker(s): {m:7.1f}" for w, m in run.mean_img_per_s.items())
            lines.append(f"  image size {key:>8}:  {cells}   speed-up {run.speedup:.2f}x")
        return "\n".join(lines)


def bench_conversion(data_dir: Path | str, work_dir: Path | str,
                     image_sizes: Sequence[int | None] = (None, 320),
                     workers: Sequence[int] | None = None, repeats: int = 2,
                     shard_size: int | None = 32, progress: bool = True) -> ConversionThroughput:
    """Conversion throughput for each worker count and image size, measured side by side.

    For every ``image_size`` (``None`` = store the original bytes) the data set is converted
    ``repeats`` times with each worker count, alternating the order (1, N, N, 1, ...) so slow
    phases of a noisy machine hit both equally; every run writes into a fresh folder under
    ``work_dir`` (removed afterwards). The whole call is timed (scan, pool start-up and
    writing), since that is what a user waits for. Returns a :class:`ConversionThroughput`:
    per image size (``runs["original"]``, ``runs["320"]``) the images/s of every run per
    worker count, their means and ``speedup`` = mean(N workers) / mean(1 worker).
    """
    cores = usable_cores()
    counts = list(workers) if workers else sorted({1, int(cores or 1)})
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, ConversionRuns] = {}
    n_images = 0
    for size in image_sizes:
        key = f"{size or 'original'}"
        rates: dict[int, list[float]] = {w: [] for w in counts}
        for r in range(repeats):
            for w in (counts if r % 2 == 0 else counts[::-1]):
                tmp = Path(tempfile.mkdtemp(prefix=f"conv-{key}-w{w}-", dir=work_dir))
                try:
                    res = convert_dataset(data_dir, tmp, image_size=size, shard_size=shard_size,
                                          workers=w, progress=progress)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                rates[w].append(res.images_per_s)
                n_images = res.num_images
        runs[key] = ConversionRuns(rates)
    return ConversionThroughput(cores=cores, workers=counts, repeats=repeats,
                                shard_size=shard_size, data_dir=str(data_dir),
                                n_images=n_images, runs=runs)


def decode_ms(tfrecords_dir: Path | str, image_size: int, n: int = 40,
              split: str = "train") -> float:
    """Mean milliseconds to decode one stored image and resize it to ``image_size``.

    Reads the first ``n`` records of ``split`` in ``tfrecords_dir`` into memory, decodes one
    untimed (warm-up), then times :func:`~chexnet_utils.data.tfrecords.decode_image` over all of
    them on this thread: the CPU cost per image that a training pipeline pays every epoch.
    Comparing a full-size and a resized conversion shows what resizing at conversion saves.
    Raises ``ValueError`` when ``n`` < 1 or the split has no record.
    """
    from chexnet_utils.data.tfrecords.images import decode_image
    from chexnet_utils.data.tfrecords.verify import list_shards
    from chexnet_utils.data.tfrecords.wire import parse_example

    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    files = [str(p) for p in list_shards(tfrecords_dir, split)]
    blobs = [parse_example(r)["image_bytes"] for r in tf.data.TFRecordDataset(files).take(n)]
    if not blobs:
        raise ValueError(f"no {split} record in {tfrecords_dir}")
    decode_image(blobs[0], image_size)  # warm-up: first call traces and allocates
    t0 = time.perf_counter()
    for b in blobs:
        decode_image(b, image_size)
    return (time.perf_counter() - t0) / len(blobs) * 1e3


OPTIONS: dict[str, Option] = {
    "data_dir": Option("--data-dir", "NIH-layout folder", "DIR"),
    "workers": Option("--workers", "comma list of worker counts (default: 1 and all cores)",
                      "LIST"),
    "repeats": Option("--repeats", "runs per setting", "N"),
    "shard_size": Option("--shard-size", "images per shard", "N"),
}
"""``bench conversion``'s options: a parameter of :func:`bench_conversion` -> its flag and
help; ``--image-sizes`` and ``--no-progress`` by hand."""


def image_sizes(text: str) -> list[int | None]:
    """``--image-sizes``: a comma list of sides in px, ``original`` (or ``none``, ``0``) for
    the stored bytes kept."""
    return [None if v in ("original", "none", "0") else int(v) for v in text.split(",") if v]


def _arguments(parser: argparse.ArgumentParser) -> None:
    sizes = shown_default(["original" if s is None else s
                           for s in default_of(COMMAND.function, "image_sizes")])
    parser.add_argument("--image-sizes", type=image_sizes, default=sizes, metavar="LIST",
                        help=f"comma list; 'original' stores the source bytes (default {sizes})")
    parser.add_argument("--no-progress", action="store_true")


def _run(args: argparse.Namespace, log: Callable[[str], None]) -> ConversionThroughput:
    from chexnet_utils.config import work_dir

    return bench_conversion(work_dir=work_dir(), image_sizes=args.image_sizes,
                            progress=not args.no_progress, **option_values(args, OPTIONS))


COMMAND = BenchCommand("TFRecord conversion images/s, 1 vs all workers", bench_conversion,
                       OPTIONS, _run, _arguments)
