"""The converter: an NIH ChestX-ray14-style folder -> sharded TFRecords, resumable and
deterministic (:func:`convert_dataset`).

It scans the source images (sizes for the plan; with ``on_error="skip"`` a full validation),
plans the shards (:mod:`chexnet_utils.data.tfrecords.plan`), keeps the shards an interrupted run
already finished, writes the rest (one task per shard, in worker processes that never import
TensorFlow) and finalizes ``manifest.json``. See :mod:`chexnet_utils.data.tfrecords` for the
decisions behind it.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from chexnet_utils.data.labels import NUM_CLASSES, PATHOLOGIES
from chexnet_utils.data.nih import NIHDataset
from chexnet_utils.data.tfrecords.images import (
    PNG_COMPRESS_LEVEL,
    check_pixels,
    describe_error,
    limit_decoding,
    open_checked,
    prepare_image,
    to_grey8,
)
from chexnet_utils.data.tfrecords.plan import (
    DEFAULT_SHARD_MB,
    SHARD_MULTIPLE,
    ShardItem,
    images_per_shard,
    plan_sha256,
    shard_name,
    shard_workers_note,
)
from chexnet_utils.data.tfrecords.verify import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    SKIPPED_JSON,
    SKIPPED_TXT,
    SPLITS,
    ConversionError,
    file_sha256,
    load_manifest,
    names_sha256,
)
from chexnet_utils.data.tfrecords.wire import CRC32C_IMPLEMENTATION, frame_record, make_example
from chexnet_utils.hardware.devices import usable_cores
from chexnet_utils.platform.atomic import (
    atomic_path,
    fsync_dir,
    require_writable_dir,
    write_json_atomic,
    write_text_atomic,
)
from chexnet_utils.platform.processes import worker_init

__all__ = ["ConversionResult", "convert_dataset"]

_OUR_SHARD_RE = re.compile(r"^(train|val|test)-\d{5}-of-\d{5}\.tfrecord$")
_TMP_MARK = ".tmp-"


# --------------------------------------------------------------------------------------------
# Scanning (worker side)
# --------------------------------------------------------------------------------------------


def _scan_one(path: str | None, full: bool) -> dict[str, Any]:
    """Size and dimensions of one source image; ``full`` also decodes it completely."""
    if path is None:
        return {"ok": False, "reason": "missing: no such file under the data folder "
                                         "(images/ or images_NNN/images/)"}
    try:
        size = os.path.getsize(path)
        if full:
            with open(path, "rb") as f:
                data = f.read()
            im = open_checked(data)
            to_grey8(im)
            width, height = im.size
        else:
            with Image.open(path) as im:
                width, height = im.size
            check_pixels(width, height)
    except FileNotFoundError:
        return {"ok": False, "reason": "missing: file disappeared"}
    except Exception as e:  # noqa: BLE001 - every decoder failure is a property of the file
        return {"ok": False, "reason": describe_error(e)}
    return {"ok": True, "size": size, "width": width, "height": height}


def _scan_chunk(args: tuple[list[str | None], bool]) -> list[dict[str, Any]]:
    paths, full = args
    return [_scan_one(p, full) for p in paths]


# --------------------------------------------------------------------------------------------
# Writing one shard (worker side)
# --------------------------------------------------------------------------------------------

_PROGRESS: Any = None  # multiprocessing queue in worker processes, set by _init_worker


def _init_worker(queue: Any, parent: int | None = None) -> None:
    global _PROGRESS
    # default SIGTERM, and die with the parent (chexnet_utils.platform.processes)
    worker_init(parent)
    limit_decoding()     # no decompression bombs: huge images are errors, not warnings
    _PROGRESS = queue


def _write_shard(task: dict[str, Any], progress: Callable[[int], None] | None = None
                 ) -> dict[str, Any]:
    """Convert the images of one shard and write it atomically; returns its manifest entry.

    ``task['items']`` is a list of ``(name, path, label14, patient_id, source_size)``.
    """
    t0 = time.perf_counter()
    out_dir = Path(task["out_dir"])
    final = out_dir / task["file"]
    digest = hashlib.sha256()
    label_sums = np.zeros(NUM_CLASSES, dtype=np.int64)
    passthrough = 0
    nbytes = 0
    report = progress
    if report is None and _PROGRESS is not None:
        queue, file = _PROGRESS, task["file"]

        def report(n: int) -> None:
            queue.put((file, n))
    with atomic_path(final, prefix=f"{task['file']}{_TMP_MARK}", fsync=False) as tmp_path, \
            open(tmp_path, "wb") as f:
        for name, path, label, patient_id, source_size in task["items"]:
            try:
                with open(path, "rb") as src:
                    data = src.read()
            except OSError as e:
                raise ConversionError(path, f"cannot read: {e}") from None
            if task["validated"] and len(data) != source_size:
                raise ConversionError(path, "file changed since it was validated")
            try:
                stored, height, width, passed = prepare_image(
                    data, task["image_size"], task["encoding"], task["jpeg_quality"],
                    validated=task["validated"])
            except Exception as e:  # noqa: BLE001 - a decoder failure names the file
                raise ConversionError(path, describe_error(e)) from None
            passthrough += passed
            example = make_example(stored, task["encoding"], height, width, label, name,
                                   patient_id)
            chunk = frame_record(example)
            digest.update(chunk)
            f.write(chunk)
            nbytes += len(chunk)
            label_sums += np.asarray(label) >= 0.5
            if report is not None:
                report(1)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(out_dir)
    return {
        "file": task["file"],
        "sha256": digest.hexdigest(),
        "bytes": nbytes,
        "count": len(task["items"]),
        "label_sums": [int(x) for x in label_sums],
        "passthrough": passthrough,
        "seconds": round(time.perf_counter() - t0, 3),
    }


# --------------------------------------------------------------------------------------------
# Manifest and result
# --------------------------------------------------------------------------------------------

def _write_json_atomic(path: Path, obj: Any) -> None:
    # indented for people, label sums on one line; a temporary name _remove_ours knows
    write_json_atomic(path, obj, prefix=f"{path.name}{_TMP_MARK}", indent=1,
                      inline_number_lists=True)


def _write_text_atomic(path: Path, text: str) -> None:
    # temporary names that _remove_ours recognises and cleans after a crash
    write_text_atomic(path, text, prefix=f"{path.name}{_TMP_MARK}")


@dataclass
class ConversionResult:
    """What :func:`convert_dataset` did. ``manifest`` is the final ``manifest.json``."""

    out_dir: Path
    manifest: dict[str, Any]
    counts: dict[str, int]
    """Images stored per split."""
    shards: dict[str, list[Path]]
    skipped: list[dict[str, str]]
    written_shards: int
    """Shards written by this run (the rest were kept from an interrupted run)."""
    reused_shards: int
    images_written: int
    elapsed_s: float
    images_per_s: float
    """``images_written`` / wall time of the whole call (scan included)."""

    @property
    def num_images(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> str:
        """First line: totals and timing; then one line per split with its shard count and
        the worker counts that file-level sharding can split it between evenly, e.g.
        ``  train 414 images in 8 shard(s) (divisible among 1, 2, 4, 8 workers)``."""
        parts = ", ".join(f"{s} {self.counts[s]}" for s in SPLITS)
        text = (f"{self.num_images} images ({parts}) in {self.out_dir}; wrote "
                f"{self.written_shards} shard(s), kept {self.reused_shards}, "
                f"{self.images_written} images in {self.elapsed_s:.1f} s "
                f"({self.images_per_s:.1f} images/s)")
        if self.skipped:
            text += f"; skipped {len(self.skipped)} image(s), see {SKIPPED_TXT}"
        width = len(str(max(self.counts.values(), default=0)))
        for s in SPLITS:
            k = len(self.shards[s])
            text += (f"\n  {s:<5} {self.counts[s]:>{width}} images in {k} shard(s)"
                     f" ({shard_workers_note(k)})")
        return text


def _remove_ours(out_dir: Path, keep: set[str] | None = None, tmp_only: bool = False) -> None:
    """Delete files this module writes (never anything else) from ``out_dir``."""
    for p in out_dir.iterdir():
        if not p.is_file():
            continue
        name = p.name
        base = name.split(_TMP_MARK)[0] if _TMP_MARK in name else None
        ours_tmp = base is not None and (
            _OUR_SHARD_RE.match(base) or base in (MANIFEST_NAME, SKIPPED_JSON, SKIPPED_TXT))
        if ours_tmp:
            p.unlink()
            continue
        if tmp_only:
            continue
        if _OUR_SHARD_RE.match(name) or name in (MANIFEST_NAME, SKIPPED_JSON, SKIPPED_TXT):
            if keep is None or name not in keep:
                p.unlink()


def _param_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    keys = sorted(set(old) | set(new))
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


def _progress_bar(progress: bool, total: int, desc: str) -> Any:
    """A tqdm bar over ``total`` images (silent unless ``progress``)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="img", disable=not progress, dynamic_ncols=True)


# --------------------------------------------------------------------------------------------
# Conversion driver
# --------------------------------------------------------------------------------------------


def _check_args(encoding: str, on_error: str, shard_size: int | None, shard_mb: float | None,
                image_size: int | None, jpeg_quality: int) -> None:
    """``ValueError`` for arguments :func:`convert_dataset` cannot work with."""
    if encoding not in ("png", "jpeg"):
        raise ValueError(f"encoding must be 'png' or 'jpeg', got {encoding!r}")
    if on_error not in ("fail", "skip"):
        raise ValueError(f"on_error must be 'fail' or 'skip', got {on_error!r}")
    if shard_size is not None and shard_mb is not None:
        raise ValueError("give shard_size or shard_mb, not both")
    if shard_size is not None and shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    if shard_mb is not None and not shard_mb > 0:
        raise ValueError(f"shard_mb must be > 0, got {shard_mb}")
    if image_size is not None and image_size < 1:
        raise ValueError(f"image_size must be >= 1, got {image_size}")
    if not 1 <= jpeg_quality <= 100:
        raise ValueError(f"jpeg_quality must be in 1..100, got {jpeg_quality}")


def _earlier_conversion(out: Path, params: dict[str, Any], overwrite: bool
                        ) -> dict[str, Any] | None:
    """An earlier conversion in ``out``: its manifest to resume from, a refusal, or a wipe."""
    old: dict[str, Any] | None = None
    if (out / MANIFEST_NAME).exists():
        try:
            old = load_manifest(out)
        except ConversionError:
            if not overwrite:
                raise
        if old is not None and not overwrite:
            old_params = old.get("params", {})
            diff = _param_diff(old_params if isinstance(old_params, dict) else {}, params)
            if diff:
                hint = ""
                if (params["shard_multiple"] is not None and isinstance(old_params, dict)
                        and "shard_multiple" not in old_params
                        and old_params.get("shard_size") is None):
                    hint = (" (it was made by an older version whose size-based shard plan did"
                            " not round shard counts to a multiple of "
                            f"{SHARD_MULTIPLE}, which file-level sharding over several "
                            "workers needs)")
                raise ConversionError(out, "holds a conversion with different parameters ("
                                      + "; ".join(diff) + ")" + hint + "; pass overwrite=True"
                                      " (--overwrite) to replace it, or choose another folder")
    elif not overwrite and any(_OUR_SHARD_RE.match(p.name) for p in out.iterdir()):
        raise ConversionError(out, "contains .tfrecord shards but no manifest.json; pass "
                              "overwrite=True (--overwrite) to replace them")
    if overwrite:
        _remove_ours(out)
        old = None
    _remove_ours(out, tmp_only=True)  # stray *.tmp-* from a killed run
    return old


def _scan(items: list[ShardItem], executor: Any, bar: Any, on_error: str, data_dir: Path | str,
          out: Path) -> tuple[list[ShardItem], list[dict[str, str]]]:
    """Sizes for planning (with ``on_error="skip"`` a full validation); writes the skipped
    lists. Returns the good items and the skipped ones."""
    full = on_error == "skip"
    step = 16 if full else 256
    chunks = [([it.path for it in items[i:i + step]], full)
              for i in range(0, len(items), step)]
    results = executor.map(_scan_chunk, chunks) if executor else map(_scan_chunk, chunks)
    scans: list[dict[str, Any]] = []
    for chunk_result in results:
        scans.extend(chunk_result)
        bar.update(len(chunk_result))
    skipped: list[dict[str, str]] = []
    good: list[ShardItem] = []
    for it, sc in zip(items, scans, strict=True):
        if sc["ok"]:
            it.size, it.width, it.height = sc["size"], sc["width"], sc["height"]
            good.append(it)
        elif on_error == "fail":
            where = it.path or f"{Path(data_dir) / it.name} (listed in the CSV)"
            raise ConversionError(where, sc["reason"])
        else:
            skipped.append({"name": it.name, "split": it.split,
                            "path": it.path or "", "reason": sc["reason"]})

    skipped_doc = {"on_error": on_error, "count": len(skipped), "skipped": skipped}
    _write_json_atomic(out / SKIPPED_JSON, skipped_doc)
    _write_text_atomic(out / SKIPPED_TXT, "".join(
        f"{s['name']}\t{s['split']}\t{s['reason']}\t{s['path']}\n" for s in skipped))
    return good, skipped


def _plan(good: list[ShardItem], skipped: list[dict[str, str]], out: Path, image_size: int | None,
          encoding: str, jpeg_quality: int, validated: bool, shard_size: int | None,
          shard_mb: float | None
          ) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]], dict[str, Any]]:
    """Contiguous blocks per split, independent of the worker count: the manifest's shard
    entries, one write task per shard file, and the per-split summary."""
    shards: list[dict[str, Any]] = []
    tasks: dict[str, dict[str, Any]] = {}
    split_info: dict[str, Any] = {}
    for part in SPLITS:
        part_items = [it for it in good if it.split == part]
        counts = images_per_shard(part_items, shard_size, shard_mb or DEFAULT_SHARD_MB, image_size)
        sums = np.zeros(NUM_CLASSES, np.int64)
        start = 0
        for i, count in enumerate(counts):
            block = part_items[start:start + count]
            start += count
            lsum = np.sum([np.asarray(it.label) >= 0.5 for it in block], axis=0)
            sums += lsum
            file = shard_name(part, i, len(counts))
            shards.append({
                "file": file, "split": part, "index": i, "num_shards": len(counts),
                "count": count, "label_sums": [int(x) for x in lsum],
                "names_sha256": names_sha256(it.name for it in block),
                "plan_sha256": plan_sha256(block),
                "first_name": block[0].name, "last_name": block[-1].name,
                "done": False, "sha256": None, "bytes": None,
            })
            tasks[file] = {
                "out_dir": str(out), "file": file, "image_size": image_size,
                "encoding": encoding, "jpeg_quality": jpeg_quality, "validated": validated,
                "items": [(it.name, it.path, it.label, it.patient_id, it.size) for it in block],
            }
        split_info[part] = {"images": len(part_items), "shards": len(counts),
                            "label_sums": [int(x) for x in sums],
                            "skipped": sum(1 for s in skipped if s["split"] == part)}
    return shards, tasks, split_info


def _reuse(out: Path, old: dict[str, Any] | None, shards: list[dict[str, Any]],
           tasks: dict[str, dict[str, Any]]) -> tuple[int, int]:
    """Keep what an interrupted run already finished (marks those shards done and drops their
    tasks); removes shard files of another plan. Returns (shards kept, images in them)."""
    old_done = {s["file"]: s for s in (old or {}).get("shards", []) if s.get("done")}
    reused = 0
    reused_images = 0
    for s in shards:
        prev = old_done.get(s["file"])
        path = out / s["file"]
        if (prev and prev.get("plan_sha256") == s["plan_sha256"]
                and prev.get("count") == s["count"] and path.is_file()
                and path.stat().st_size == prev.get("bytes")
                and file_sha256(path) == prev.get("sha256")):
            s.update(done=True, sha256=prev["sha256"], bytes=prev["bytes"])
            tasks.pop(s["file"])
            reused += 1
            reused_images += s["count"]
    # Shard files of another plan (e.g. more images than last time) would mix into
    # list_shards(): remove them. Only names this module writes are touched.
    _remove_ours(out, keep={s["file"] for s in shards}
                 | {MANIFEST_NAME, SKIPPED_JSON, SKIPPED_TXT})
    return reused, reused_images


def _write(tasks: dict[str, dict[str, Any]], executor: Any, queue: Any, bar: Any,
           finish: Callable[[dict[str, Any]], None]) -> None:
    """Write the shards of ``tasks`` (one task per shard), calling ``finish`` with each
    manifest entry as its shard is done. With an executor, a failed shard cancels the
    pending ones (running ones finish and are kept) and its error is raised at the end."""
    if executor is None:
        for task in tasks.values():
            finish(_write_shard(task, progress=bar.update))
        return
    assert queue is not None
    reported: dict[str, int] = {}
    expected = {f: len(t["items"]) for f, t in tasks.items()}
    pending = {executor.submit(_write_shard, t): t["file"] for t in tasks.values()}
    error: BaseException | None = None

    def drain() -> None:
        while True:
            try:
                file, n = queue.get_nowait()
            except Exception:  # noqa: BLE001 - queue.Empty
                return
            add = min(n, expected[file] - reported.get(file, 0))
            if add > 0:
                reported[file] = reported.get(file, 0) + add
                bar.update(add)

    while pending:
        done, _ = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
        drain()
        for fut in done:
            file = pending.pop(fut)
            try:
                entry = fut.result()
            except BaseException as e:  # noqa: BLE001 - re-raised below
                if error is None:
                    error = e
                    for other in pending:
                        other.cancel()  # running shards finish and are kept
                continue
            finish(entry)
            missing = entry["count"] - reported.get(file, 0)
            if missing > 0:  # progress messages still in flight
                reported[file] = entry["count"]
                bar.update(missing)
        pending = {f: n for f, n in pending.items() if not f.cancelled()}
    drain()
    if error is not None:
        raise error

def _params(data_dir: Path | str, image_size: int | None, encoding: str, jpeg_quality: int,
            shard_size: int | None, shard_mb: float | None, val_fraction: float,
            seed: int) -> dict[str, Any]:
    """The parameters the manifest records: a resumed run must have the same."""
    return {
        "data_dir": str(Path(data_dir).resolve()),
        "image_size": image_size,
        "encoding": encoding,
        "jpeg_quality": jpeg_quality if encoding == "jpeg" else None,
        "shard_size": shard_size,
        "shard_mb": (None if shard_size is not None
                     else float(shard_mb)),  # type: ignore[arg-type]  # set if shard_size is None
        # The size-based plan's rounding (see planned_shard_count). Absent (None) in manifests
        # of older versions, whose size-based plans did not round: such a folder is refused
        # by _earlier_conversion with a hint, rather than silently re-planned and rewritten.
        "shard_multiple": None if shard_size is not None else SHARD_MULTIPLE,
        "val_fraction": val_fraction,
        "seed": seed,
        "png_compress_level": PNG_COMPRESS_LEVEL,
    }


def _items(ds: NIHDataset, val_fraction: float, seed: int) -> list[ShardItem]:
    """Every image of the split (train, val, test in order), with its path (``None`` when
    the file is missing), labels and patient."""
    items: list[ShardItem] = []
    for part, records in ds.split(val_fraction=val_fraction, seed=seed).parts().items():
        for r in records:
            p = ds.image_paths.get(r.image_index)
            items.append(ShardItem(r.image_index, part, None if p is None else str(p),
                                   tuple(float(x) for x in r.labels), r.patient_id))
    return items


def _start_workers(workers: int) -> tuple[Any, Any]:
    """``(executor, progress queue)`` of ``workers`` spawned processes, or ``(None, None)``
    for one worker (everything runs in this process)."""
    if workers <= 1:
        return None, None
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context("spawn")  # no fork of a parent that may hold TF threads
    queue = ctx.Queue()
    try:
        executor = ProcessPoolExecutor(max_workers=workers, mp_context=ctx,
                                       initializer=_init_worker, initargs=(queue, os.getpid()))
    except BaseException:
        _close_queue(queue)
        raise
    return executor, queue


def _terminate_workers(executor: Any) -> None:
    """Stop the worker processes now rather than after their running shards (on Ctrl-C);
    finished shards stay in the manifest."""
    if executor is not None:
        for proc in list((getattr(executor, "_processes", None) or {}).values()):
            proc.terminate()


def _close_queue(queue: Any) -> None:
    """Close the progress queue and wait for its feeder thread."""
    if queue is not None:
        queue.close()
        queue.join_thread()


def _clean_up(out: Path, bar: Any, executor: Any, queue: Any) -> None:
    """Whatever happened: close the bar, shut the workers down, close the queue and remove
    this run's temporary files."""
    bar.close()
    if executor is not None:
        executor.shutdown(wait=True, cancel_futures=True)
    _close_queue(queue)
    try:
        _remove_ours(out, tmp_only=True)
    except OSError:
        pass


def _start_manifest(out: Path, params: dict[str, Any], on_error: str, good: list[ShardItem],
                    skipped: list[dict[str, str]], split_info: dict[str, Any],
                    shards: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest of the plan, not yet complete (reused shards already ``done``), written
    before any shard so that an interrupted run can resume."""
    manifest: dict[str, Any] = {
        "format": FORMAT, "version": FORMAT_VERSION, "params": params,
        "on_error": on_error, "classes": list(PATHOLOGIES),
        "crc32c": CRC32C_IMPLEMENTATION, "complete": False,
        "num_images": len(good), "num_skipped": len(skipped), "splits": split_info,
        "shards": shards,
    }
    _write_json_atomic(out / MANIFEST_NAME, manifest)
    return manifest


def _record_shard(out: Path, manifest: dict[str, Any], by_file: dict[str, dict[str, Any]],
                  entry: dict[str, Any]) -> None:
    """A shard is written: check it against the plan, mark it done in ``manifest`` (whose
    shard entries ``by_file`` indexes) and rewrite the manifest."""
    s = by_file[entry["file"]]
    if entry["count"] != s["count"] or entry["label_sums"] != s["label_sums"]:
        raise ConversionError(out / entry["file"], "written shard does not match plan")
    s.update(done=True, sha256=entry["sha256"], bytes=entry["bytes"])
    _write_json_atomic(out / MANIFEST_NAME, manifest)


def _write_all(out: Path, manifest: dict[str, Any], tasks: dict[str, dict[str, Any]],
               executor: Any, queue: Any, bar: Any, reused_images: int) -> tuple[int, float]:
    """Write the shards still to do (:func:`_write`), the bar counting on from the reused
    images, each finished shard recorded in the manifest (:func:`_record_shard`). Returns
    (images written, seconds)."""
    bar.set_description("converting")
    bar.reset(total=manifest["num_images"])
    bar.update(reused_images)
    t0 = time.perf_counter()
    written_images = sum(len(t["items"]) for t in tasks.values())
    by_file = {s["file"]: s for s in manifest["shards"]}
    _write(tasks, executor, queue, bar, partial(_record_shard, out, manifest, by_file))
    return written_images, time.perf_counter() - t0


def _finalize(out: Path, manifest: dict[str, Any], *, elapsed: float, convert_s: float,
              written_images: int, written_shards: int, reused: int, workers: int) -> None:
    """Mark the manifest complete, add the run's statistics and write it."""
    manifest["complete"] = True
    manifest["stats"] = {
        "elapsed_s": round(elapsed, 3), "convert_s": round(convert_s, 3),
        "images_written": written_images, "shards_written": written_shards,
        "shards_reused": reused, "workers": workers,
        "images_per_s": round(written_images / elapsed, 2) if elapsed > 0 else None,
    }
    _write_json_atomic(out / MANIFEST_NAME, manifest)


def convert_dataset(
    data_dir: Path | str,
    out_dir: Path | str,
    image_size: int | None = None,
    encoding: str = "png",
    shard_size: int | None = None,
    shard_mb: float | None = None,
    workers: int | None = None,
    on_error: str = "fail",
    val_fraction: float = 0.1,
    seed: int = 0,
    progress: bool = True,
    overwrite: bool = False,
    jpeg_quality: int = 95,
) -> ConversionResult:
    """Convert ``data_dir`` (NIH layout) to sharded TFRecords in ``out_dir``.

    Splits with ``NIHDataset.load(data_dir).split(val_fraction, seed)`` (official test list
    as test). Shards per split:

    * default (neither given) or ``shard_mb=M`` (default 100): shards of at most about M MB,
      and a shard count that is a multiple of 8, at least 8, so every split can be sharded by
      file over 1, 2, 4 or 8 workers evenly; a split of fewer than 8 images gets one shard
      per image (:func:`planned_shard_count`). ``M`` is an upper bound: the rounding only
      ever adds shards.
    * ``shard_size=N``: exactly N images per shard, the last takes the remainder; no
      rounding (use it to choose the count yourself, e.g. fewer, bigger shards).

    ``ConversionResult.summary()`` prints the count per split and the worker counts it
    divides. ``workers`` processes convert one shard per task (default: the cores this
    process may use; 1 converts in this process); the shard plan never depends on it. See
    :mod:`chexnet_utils.data.tfrecords` for the error policy, determinism and resuming. Steps:
    :func:`_earlier_conversion` (resume, refuse or wipe), :func:`_items`, :func:`_scan`,
    :func:`_plan`, :func:`_reuse`, :func:`_start_manifest`, :func:`_write_all`,
    :func:`_finalize`. Raises :class:`ConversionError` (bad image under
    ``on_error="fail"``, conflicting earlier conversion, including one made with an older
    version's shard plan), :class:`chexnet_utils.data.nih.DataFormatError` (bad CSV or split
    list; both read before anything else) or ``OSError`` naming ``out_dir`` when nothing can
    be written there (tried before the scan).
    """
    t_start = time.perf_counter()
    _check_args(encoding, on_error, shard_size, shard_mb, image_size, jpeg_quality)
    if shard_size is None and shard_mb is None:
        shard_mb = DEFAULT_SHARD_MB
    workers = max(1, int(workers or usable_cores()))
    ds = NIHDataset.load(data_dir)
    items = _items(ds, val_fraction, seed)
    out = require_writable_dir(out_dir)  # before the scan, which may take hours
    params = _params(data_dir, image_size, encoding, jpeg_quality, shard_size, shard_mb,
                     val_fraction, seed)
    old = _earlier_conversion(out, params, overwrite)

    full = on_error == "skip"
    bar = _progress_bar(progress, len(items), "validating" if full else "scanning")
    executor = queue = None
    try:
        executor, queue = _start_workers(workers)
        good, skipped = _scan(items, executor, bar, on_error, data_dir, out)
        shards, tasks, split_info = _plan(good, skipped, out, image_size, encoding,
                                          jpeg_quality, full, shard_size, shard_mb)
        reused, reused_images = _reuse(out, old, shards, tasks)
        manifest = _start_manifest(out, params, on_error, good, skipped, split_info, shards)
        written_images, convert_s = _write_all(out, manifest, tasks, executor, queue, bar,
                                               reused_images)
        elapsed = time.perf_counter() - t_start
        _finalize(out, manifest, elapsed=elapsed, convert_s=convert_s,
                  written_images=written_images, written_shards=len(tasks), reused=reused,
                  workers=workers)
    except KeyboardInterrupt:
        _terminate_workers(executor)
        raise
    finally:
        _clean_up(out, bar, executor, queue)

    return ConversionResult(
        out_dir=out, manifest=manifest,
        counts={p: split_info[p]["images"] for p in SPLITS},
        shards={p: [out / s["file"] for s in shards if s["split"] == p] for p in SPLITS},
        skipped=skipped, written_shards=len(tasks), reused_shards=reused,
        images_written=written_images, elapsed_s=elapsed,
        images_per_s=written_images / elapsed if elapsed > 0 else 0.0,
    )
