"""The shard plan: how many shards each split gets and which images go in each.

The default plan (``shard_mb=100``) and any explicit ``shard_mb=M`` compute each split's shard
count up front from an estimate of its size (source file sizes times the resize area ratio,
plus record overhead), then round it *up* to a multiple of :data:`SHARD_MULTIPLE` (8)
(:func:`planned_shard_count`); ``shard_size=N`` gives shards of exactly N images and a final
partial one. The plan never depends on the number of conversion or training workers.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "DEFAULT_SHARD_MB",
    "SHARD_MULTIPLE",
    "planned_shard_count",
    "shard_name",
    "shard_workers_note",
]

DEFAULT_SHARD_MB = 100.0
"""Shard target when neither ``shard_size`` nor ``shard_mb`` is given (TF's usual advice)."""
SHARD_MULTIPLE = 8
"""Size-based plans give a split of >= 8 images a multiple of 8 shards (at least 8), so 1, 2,
4 and 8 workers all get equal numbers of files; see :func:`planned_shard_count`."""
_MB = 1_000_000
RECORD_OVERHEAD = 16 + 200
"""Bytes a record adds to its image, roughly: TFRecord framing + the other Example fields."""


def shard_name(split: str, index: int, num_shards: int) -> str:
    """``{split}-{index:05d}-of-{num_shards:05d}.tfrecord``."""
    return f"{split}-{index:05d}-of-{num_shards:05d}.tfrecord"


@dataclass
class ShardItem:
    """One image as the shard plan sees it (source path, labels, sizes)."""

    name: str
    split: str
    path: str | None
    label: tuple[float, ...]
    patient_id: int
    size: int = 0
    width: int = 0
    height: int = 0


def plan_sha256(items: Sequence[ShardItem]) -> str:
    """Hash of what a shard should contain: names, labels, patient ids, source sizes."""
    h = hashlib.sha256()
    for it in items:
        bits = "".join("1" if v >= 0.5 else "0" for v in it.label)
        h.update(f"{it.name}\t{bits}\t{it.patient_id}\t{it.size}\n".encode("utf-8"))
    return h.hexdigest()


def planned_shard_count(n_images: int, estimated_bytes: float,
                        shard_mb: float = DEFAULT_SHARD_MB) -> int:
    """Shards of one split under a size-based plan (the default, or ``shard_mb``).

    * fewer than :data:`SHARD_MULTIPLE` (8) images: one shard per image (as many workers as
      possible can still each get a file);
    * otherwise ``ceil(estimated_bytes / shard_mb MB)`` rounded **up** to a multiple of 8, at
      least 8: every split can be sharded by file over 1, 2, 4 or 8 workers with equal
      numbers of files per worker, and big splits keep shards of at most ~``shard_mb``;
    * never more shards than images allow for a multiple of 8 (``8 * (n_images // 8)``), so a
      shard is never empty; only images bigger than ``shard_mb`` then push shards past it.

    Depends on the split alone, never on the number of conversion or training workers.
    """
    if n_images <= 0:
        return 0
    if n_images < SHARD_MULTIPLE:
        return n_images
    if not shard_mb > 0:
        raise ValueError(f"shard_mb must be > 0, got {shard_mb}")
    by_size = math.ceil(estimated_bytes / (shard_mb * _MB))
    groups = min(max(1, math.ceil(by_size / SHARD_MULTIPLE)), n_images // SHARD_MULTIPLE)
    return groups * SHARD_MULTIPLE


def estimate_bytes(items: Sequence[ShardItem], image_size: int | None) -> float:
    """Expected size of the split's shards: source bytes x resize area ratio + overhead."""
    total = 0.0
    for it in items:
        ratio = 1.0
        if image_size is not None and it.width and it.height:
            ratio = image_size * image_size / (it.width * it.height)
        total += it.size * ratio + RECORD_OVERHEAD
    return total


def images_per_shard(items: Sequence[ShardItem], shard_size: int | None, shard_mb: float,
                  image_size: int | None) -> list[int]:
    """How many images each shard of one split gets (contiguous blocks).

    ``shard_size``: exactly that many per shard, the last takes the remainder. Otherwise
    :func:`planned_shard_count` shards, the images spread evenly (earlier shards get the
    extra image).
    """
    n = len(items)
    if n == 0:
        return []
    if shard_size is not None:
        full, rest = divmod(n, shard_size)
        return [shard_size] * full + ([rest] if rest else [])
    k = planned_shard_count(n, estimate_bytes(items, image_size), shard_mb)
    q, r = divmod(n, k)
    return [q + 1] * r + [q] * (k - r)


def shard_workers_note(num_shards: int) -> str:
    """Which worker counts (of 1, 2, 4, ... 64) get equal numbers of ``num_shards`` files.

    ``8`` -> ``"divisible among 1, 2, 4, 8 workers"``; below 8 shards it adds the limit of
    file-level sharding (one file per worker at least).
    """
    if num_shards <= 0:
        return "no shards"
    even = [w for w in (1, 2, 4, 8, 16, 32, 64) if w <= num_shards and num_shards % w == 0]
    text = f"divisible among {', '.join(map(str, even))} worker{'s' if even[-1] > 1 else ''}"
    if even == [1]:
        text += " only"
    if num_shards < SHARD_MULTIPLE:
        text += (f"; file-level sharding over at most {num_shards} "
                 f"worker{'s' if num_shards > 1 else ''}")
    return text
