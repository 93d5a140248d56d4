"""Writing a synthetic ChestX-ray14 to disk in NIH's folder layout, resumably.

:func:`generate_dataset` samples the rows (:mod:`.patients`), renders every image
(:mod:`.render`) in worker processes and writes ``images_NNN/images/*.png``, then
``Data_Entry_2017.csv``, the split lists and the ``SYNTHETIC.json`` marker.
:func:`ensure_dataset` does so only when the folder does not already hold that exact data set;
:func:`read_marker` reads the marker. The marker protects a real NIH download from being
overwritten and lets an interrupted run resume.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from chexnet_utils.data import nih
from chexnet_utils.data.synthetic.patients import rng_stream, sample_records, split_by_patient
from chexnet_utils.data.synthetic.render import encode_png, render_image
from chexnet_utils.hardware.devices import usable_cores
from chexnet_utils.platform.atomic import atomic_path, write_text_atomic
from chexnet_utils.platform.checks import require_at_least
from chexnet_utils.platform.processes import worker_init

GENERATOR_VERSION = 1
"""Bumped whenever the output for a given (n, size, seed) changes."""

MARKER_NAME = "SYNTHETIC.json"
_GENERATOR_ID = "chexnet_utils.synthetic"
"""The ``generator`` of ``SYNTHETIC.json``: a name of the data format, not a module path (it
stays when modules move)."""
_GENERATOR_IDS = (_GENERATOR_ID, "chexnet_utils.data.synthetic")
"""Accepted when reading: the second was written for a while after the module moved into the
data wing (2026-12-04 to 12-05); a data set marked either way is this generator's."""

_NAME_RE = re.compile(r"\d{8}_\d{3}\.png")


def _image_rng(seed: int, index: int) -> np.random.Generator:
    return rng_stream(seed, 0, index)


def _patient_rng(seed: int, patient_id: int) -> np.random.Generator:
    return rng_stream(seed, 1, patient_id)


def _folder(index: int, per_folder: int) -> str:
    return f"images_{index // per_folder + 1:03d}"


def _render_task(task: tuple[int, int, int, str, str, int, str, int]) -> tuple[int, int]:
    """Worker (module level, so it pickles under 'spawn'): render and write one image."""
    seed, index, patient_id, finding_labels, view, size, path, level = task
    img = render_image(finding_labels, size, _image_rng(seed, index),
                       patient_rng=_patient_rng(seed, patient_id), view=view)
    return index, encode_png(img, path, compress_level=level)


def read_marker(out_dir: Path | str) -> dict[str, Any] | None:
    """The parsed ``SYNTHETIC.json`` of a synthetic data set, or None if absent or unreadable."""
    path = Path(out_dir) / MARKER_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("generator") not in _GENERATOR_IDS:
        return None
    return data


def _marker(n: int, size: int, seed: int, per_folder: int, complete: bool,
            extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "generator": _GENERATOR_ID,
        "version": GENERATOR_VERSION,
        "n": n,
        "size": size,
        "seed": seed,
        "per_folder": per_folder,
        "complete": complete,
        "note": "Synthetic stand-in for NIH ChestX-ray14 written by chexnet_utils.data.synthetic; "
                "not real patient data.",
        **(extra or {}),
    }


def _same_params(marker: dict[str, Any] | None, n: int, size: int, seed: int,
                 per_folder: int) -> bool:
    if not marker:
        return False
    return all(marker.get(k) == v for k, v in (
        ("version", GENERATOR_VERSION), ("n", n), ("size", size), ("seed", seed),
        ("per_folder", per_folder)))


def _linked_folders(root: Path) -> list[Path]:
    """Image folders of the layout under ``root`` that are symbolic links (``images/``,
    ``images_NNN/``, ``images_NNN/images/``): this module never writes or deletes through
    one (it may lead into a real NIH download)."""
    tops = [root / "images", *root.glob("images_[0-9][0-9][0-9]")]
    subs = [t / "images" for t in tops[1:] if not t.is_symlink()]
    return [d for d in tops + subs if d.is_symlink()]


def _layout_files(root: Path) -> list[Path]:
    """Files of the NIH layout this module writes (and may replace) under ``root``; folders
    reached through a symbolic link are left out."""
    files: list[Path] = []
    for name in (nih.CSV_NAME, nih.TRAIN_VAL_LIST, nih.TEST_LIST):
        if (root / name).is_file() and not (root / name).is_symlink():
            files.append(root / name)
    for d in [root / "images", *(p / "images" for p in root.glob("images_[0-9][0-9][0-9]")),
              *root.glob("images_[0-9][0-9][0-9]")]:
        if d.is_dir() and not d.is_symlink() and not (d.parent != root
                                                       and d.parent.is_symlink()):
            files.extend(p for p in d.iterdir() if p.is_file() and not p.is_symlink() and (
                _NAME_RE.fullmatch(p.name) or (p.name.startswith(".") and
                                               p.name.endswith(".tmp"))))
    return files


def _claim_folder(root: Path, n: int, size: int, per_folder: int,
                  overwrite: bool) -> dict[str, Any] | None:
    """Check the arguments and that ``root`` may be written (missing, empty, a previous
    synthetic data set, or ``overwrite``; no image folder a symbolic link); create it.
    Returns its previous ``SYNTHETIC.json``, if any."""
    require_at_least(1, n=n)
    require_at_least(16, size=size)
    require_at_least(1, per_folder=per_folder)
    if (n - 1) // per_folder + 1 > 999:
        raise ValueError(f"{n} images at {per_folder} per folder need more than 999 "
                         "images_NNN folders; raise per_folder")
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"{root} exists and is not a directory")
    marker = read_marker(root) if root.is_dir() else None
    visible = root.is_dir() and any(not p.name.startswith(".") for p in root.iterdir())
    if visible and marker is None and not overwrite:
        raise FileExistsError(
            f"{root} is not empty and has no {MARKER_NAME}, so it is not a previous synthetic "
            "data set (it may be the real NIH download). Choose an empty or new directory, or "
            "pass overwrite=True to replace its NIH-layout files.")
    root.mkdir(parents=True, exist_ok=True)
    linked = _linked_folders(root)
    if linked:
        raise FileExistsError(f"{linked[0]} is a symbolic link: the synthetic writer does not "
                              "write or delete through one (it may lead into a real data set); "
                              "remove the link or choose another directory")
    return marker


def _clear_stale_files(root: Path, targets: dict[str, Path], keep_existing: bool) -> None:
    """Delete the NIH-layout files of ``root`` (but the images kept for a resume), the image
    folders left empty, and create those ``targets`` go into."""
    for f in _layout_files(root):
        if keep_existing and targets.get(f.name) == f:
            continue
        f.unlink(missing_ok=True)
    for d in sorted(root.glob("images_[0-9][0-9][0-9]/images")) + sorted(
            root.glob("images_[0-9][0-9][0-9]")) + [root / "images"]:
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
    for folder in {p.parent for p in targets.values()}:
        folder.mkdir(parents=True, exist_ok=True)


def _render_all(tasks: list[tuple[Any, ...]], workers: int, desc: str, progress: bool,
                mp_context: str | None) -> None:
    """Render ``tasks`` in this process (``workers == 1``) or a pool, with a progress bar."""
    bar = tqdm(total=len(tasks), desc=desc, unit="img", disable=not progress)
    try:
        if workers == 1:
            for t in tasks:
                _render_task(t)
                bar.update(1)
        else:
            chunk = max(1, min(32, len(tasks) // (workers * 8)))
            with multiprocessing.get_context(mp_context).Pool(
                    workers, initializer=worker_init, initargs=(os.getpid(),)) as pool:
                for _ in pool.imap_unordered(_render_task, tasks, chunksize=chunk):
                    bar.update(1)
    finally:
        bar.close()


def generate_dataset(
    out_dir: Path | str,
    n: int = 600,
    size: int = 1024,
    seed: int = 0,
    workers: int | None = None,
    per_folder: int = 10_000,
    progress: bool = True,
    overwrite: bool = False,
    *,
    resume: bool = False,
    compress_level: int = 3,
    mp_context: str | None = None,
) -> Path:
    """Write a synthetic ChestX-ray14 of ``n`` images of ``size`` px into ``out_dir``.

    The layout is NIH's (see the module docstring); :meth:`nih.NIHDataset.load` reads it.
    Images are rendered by ``workers`` processes (default: the cores this process may use,
    :func:`~chexnet_utils.hardware.devices.usable_cores`; 1 renders in this process) with a tqdm
    progress bar; the output is byte-identical whatever ``workers``.

    ``out_dir`` may be missing, empty (hidden files such as ``.gitkeep`` do not count), or a
    previous output of this function (it has a ``SYNTHETIC.json``): then its images, CSV and
    lists are replaced. Any other non-empty
    directory raises :class:`FileExistsError` unless ``overwrite=True``, which deletes the
    NIH-layout files there (``Data_Entry_2017.csv``, the two lists and ``NNNNNNNN_NNN.png``
    under ``images/`` and ``images_NNN/images/``) and leaves other files alone. An image
    folder that is a symbolic link raises :class:`FileExistsError` before anything is
    written: nothing is written or deleted through a link.

    ``resume=True`` keeps the PNGs of an interrupted run with the same parameters (they are
    written atomically, so every PNG present is complete). The CSV, the split lists and the
    final ``SYNTHETIC.json`` (``"complete": true``) are written after all images.
    ``compress_level`` is zlib's (3: ~40 ms and ~400 KB per 1024 px image).
    ``mp_context`` picks the multiprocessing start method ("spawn", "fork", "forkserver";
    default: the platform's); the worker is a module-level function, so all of them work.
    Returns ``out_dir`` as a :class:`~pathlib.Path`.
    """
    root = Path(out_dir)
    marker = _claim_folder(root, n, size, per_folder, overwrite)
    records = sample_records(n, seed, size)
    train_val, test = split_by_patient(records, seed)
    keep_existing = resume and _same_params(marker, n, size, seed, per_folder)
    targets = {r.image_index: root / _folder(i, per_folder) / "images" / r.image_index
               for i, r in enumerate(records)}

    # Mark the directory as ours before touching anything else, then clear stale files.
    write_text_atomic(root / MARKER_NAME,
                       json.dumps(_marker(n, size, seed, per_folder, False), indent=2) + "\n")
    _clear_stale_files(root, targets, keep_existing)

    tasks = [(seed, i, r.patient_id, r.finding_labels, r.view_position, size,
              str(targets[r.image_index]), compress_level)
             for i, r in enumerate(records)
             if not (keep_existing and targets[r.image_index].is_file())]
    workers = usable_cores() if workers is None else max(1, int(workers))
    _render_all(tasks, min(workers, max(1, len(tasks))), f"synthetic {size}px", progress,
                mp_context)

    png_bytes = sum(p.stat().st_size for p in targets.values())
    with atomic_path(root / nih.CSV_NAME) as tmp:
        nih.write_data_entry(tmp, records)
    nih.write_split_list(root / nih.TRAIN_VAL_LIST, train_val)
    nih.write_split_list(root / nih.TEST_LIST, test)
    extra = {"images": n, "patients": len({r.patient_id for r in records}),
             "train_val": len(train_val), "test": len(test), "png_bytes": png_bytes}
    write_text_atomic(root / MARKER_NAME,
                       json.dumps(_marker(n, size, seed, per_folder, True, extra), indent=2)
                       + "\n")
    return root


def ensure_dataset(out_dir: Path | str, n: int = 600, size: int = 1024, seed: int = 0,
                   workers: int | None = None, per_folder: int = 10_000,
                   progress: bool = True) -> Path:
    """Return ``out_dir``, generating it first unless it already holds this exact data set.

    The parameters are :func:`generate_dataset`'s (same names, same defaults), passed on to it.

    "This exact data set" means a complete ``SYNTHETIC.json`` with the same ``n``, ``size``,
    ``seed``, ``per_folder`` and generator version, and the CSV and lists present. An
    interrupted run with the same parameters is resumed; a different synthetic data set is
    replaced; a non-synthetic, non-empty directory raises :class:`FileExistsError`.
    """
    root = Path(out_dir)
    marker = read_marker(root)
    if (_same_params(marker, n, size, seed, per_folder) and marker is not None
            and marker.get("complete") is True
            and all((root / f).is_file() for f in (nih.CSV_NAME, nih.TRAIN_VAL_LIST,
                                                     nih.TEST_LIST))):
        return root
    return generate_dataset(root, n=n, size=size, seed=seed, workers=workers,
                            per_folder=per_folder, progress=progress, resume=True)
