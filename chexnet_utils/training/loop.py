"""The training loop: one :func:`train` on converted TFRecords for the CLI, Horovod and the tests.

::

    from chexnet_utils.training import TrainConfig, train
    result = train(TrainConfig(tfrecords="build/tfrecords-128", out_dir="build/run-small",
                               arch="small", image_size=128, epochs=10))
    result.mean_auroc, result.img_per_s

What one call does
------------------
1. Reads the TFRecords manifest: image counts per split and the training label sums (for the
   class weights of the loss and the default ``steps_per_epoch``).
2. Builds the model (:func:`chexnet_utils.model.models.build_chexnet`), or with ``resume=True``
   loads the last checkpoint (weights, optimizer state, learning rate) and continues with the epoch
   after the last finished one.
3. Trains with ``model.fit`` on :func:`chexnet_utils.input.pipelines.new_approach` (or the old
   approach, ``pipeline="old"``) over the ``train`` shards: Adam, a class-weighted binary
   cross-entropy (:class:`~chexnet_utils.model.models.WeightedBCE`), ``ReduceLROnPlateau`` (factor
   0.1). Notebook 03 writes the same training out in its cells and checks, with op
   determinism, that it gives the same weights bit for bit. After every epoch the whole validation
   split is predicted and its exact per-class AUROC computed (rank-based,
   :func:`chexnet_utils.model.auroc.binary_auroc`); the best epoch by validation mean AUROC is
   kept.
4. Evaluates the best weights on the test split and writes ``metrics.json``.

Files in ``out_dir``::

    checkpoints/last.keras        model + optimizer after the last finished epoch (resume)
    checkpoints/state.json        epoch, best score, LR-plateau state, per-epoch history
    checkpoints/best.weights.h5   weights of the best epoch (build_chexnet(weights=...) loads it)
    log.csv                       one row per epoch (appended to on resume)
    tensorboard/                  TensorBoard logs (``tensorboard --logdir OUT/tensorboard``)
    metrics.json                  test AUROC per class and mean, img/s, timing, config, history

Throughput (``img_per_s``) counts training images over the wall time of the training epochs
only (validation, checkpoints and test evaluation excluded). When this call runs more than one
epoch, its first epoch is left out: it includes tracing the ``tf.function`` and filling the
input pipeline. With a single epoch that epoch is all there is, warm-up included.

Data parallelism with Horovod: ``distributed=True``
---------------------------------------------------
The same function trains on N Horovod workers (``mpirun -np N python -m chexnet_utils train
--horovod ...``, ``horovodrun``, or ipyparallel MPI engines driving :func:`train_on_engine`).
The six changes that turn a single-worker Keras script into a Horovod one, and where each is:

1. ``hvd.init()``: :func:`init_world`;
2. one GPU per process, pinned by local rank (on CPU: a thread budget): :func:`init_world` calls
   :func:`chexnet_utils.hardware.devices.pin_process`;
3. learning rate raised with the number of workers (:func:`scaled_learning_rate`: ``linear``
   by default, as Horovod's examples and docs do; ``sqrt`` as an option), reached gradually
   over ``warmup_epochs`` (the ``Warmup`` callback);
4. gradients averaged across workers before the optimizer step: :func:`gradient_averager`
   returns one ``hvd.allreduce`` per gradient (overlapping the backward pass), applied in
   the model's ``train_step`` (the four ways to do this on Keras 3, and the documented one
   that silently does not average, are in :mod:`chexnet_utils.training.horovod_keras`);
5. rank 0's model and optimizer variables broadcast to all before the first step:
   :func:`broadcast_initial_state`;
6. checkpoints, logs and ``metrics.json`` written by rank 0 only.

Besides: each worker reads its own shard files (``num_workers=size, worker_index=rank``),
``steps_per_epoch`` defaults to ``train images // (batch_size * size)``, the epoch's
training metrics are averaged across workers (``MetricAverage``), and so are the validation
metrics: every rank predicts the whole validation split with its own BatchNorm moving
statistics, which differ slightly between ranks, and the learning-rate plateau and the
best-epoch choice must be taken on identical numbers everywhere, or the ranks' learning
rates (and then their weights) drift apart. A ``RankAgreement`` callback
(:class:`chexnet_utils.training.callbacks.RankAgreement`) compares a digest of the
trainable weights across ranks after the first steps and at every epoch end and stops the
job with :class:`~chexnet_utils.training.horovod_keras.RanksDiverged` if they differ.
``metrics.json`` records every rank's final learning rate and weight hash (``ranks``).

Where the pieces live
---------------------
This module holds the configuration, the result and :func:`train` itself. The data-parallel
seams (changes 1-5) are in :mod:`chexnet_utils.training.dataparallel`, the callbacks in
:mod:`chexnet_utils.training.callbacks`, the files of ``out_dir`` in
:mod:`chexnet_utils.training.checkpoints`, the manifest and split prediction helpers in
:mod:`chexnet_utils.training.splits`; the wing's ``__init__`` re-exports the names callers use.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from chexnet_utils.config import Scale, scale
from chexnet_utils.data.labels import PATHOLOGIES
from chexnet_utils.input.pipelines import DEFAULT_SHUFFLE_BUFFER, Pipeline
from chexnet_utils.model.architectures import Architecture
from chexnet_utils.model.auroc import CHEXNET_PAPER_MEAN_AUROC, mean_auroc, per_class_auroc
from chexnet_utils.platform.checks import require_choices
from chexnet_utils.platform.lazy import lazy_module
from chexnet_utils.training.checkpoints import (
    BEST_NAME,
    CHECKPOINT_DIR,
    CSV_NAME,
    LAST_NAME,
    METRICS_NAME,
    STATE_FORMAT,
    TENSORBOARD_DIR,
    load_checkpoint,
    nan_if_none,
    read_state,
    write_json_atomic,
)
from chexnet_utils.training.dataparallel import (
    Allreduce,
    LrScaling,
    Recipe,
    init_world,
)
from chexnet_utils.training.horovod_keras import weights_sha256
from chexnet_utils.training.splits import (
    eval_dataset,
    loss_value,
    predict_split,
    split_counts,
    training_label_sums,
)

if TYPE_CHECKING:
    from chexnet_utils.model.accelerator import Switches
    from chexnet_utils.training.callbacks import EpochTimer

# Horovod, Keras, TensorFlow: imported on first use (chexnet_utils.platform.lazy)
hvd = lazy_module("horovod.tensorflow")
keras = lazy_module("keras")
tf = lazy_module("tensorflow")

PlateauMonitor = Literal["val_loss", "val_mean_auroc", "loss"]
"""What ``ReduceLROnPlateau`` watches."""


# --------------------------------------------------------------------------------------------
# Configuration and result
# --------------------------------------------------------------------------------------------

@dataclass
class TrainConfig:
    """Everything one training run needs. Defaults: the ``ci`` scale (``small`` at 128 px).

    The string options are ``Literal`` types, checked in one place
    (:func:`chexnet_utils.platform.checks.require_choices`) and offered by the CLI as its
    choices; the CLI's ``train`` options take their types and defaults from these fields."""

    tfrecords: Path | str
    """A folder converted by :func:`chexnet_utils.data.tfrecords.convert_dataset` (or
    :func:`chexnet_utils.data.prepare.prepare_tfrecords`). Pre-resized shards (``image_size`` at
    conversion) train much faster on a CPU than 1024 px ones: decoding a 1024 px PNG costs
    ~10 ms."""
    out_dir: Path | str
    """Checkpoints, logs and ``metrics.json`` go here (created)."""
    arch: Architecture = "small"
    """``densenet121`` (CheXNet), ``resnet50`` or ``small`` (see ``build_chexnet``)."""
    image_size: int = 128
    batch_size: int = 16
    """Per-worker batch size (CheXNet: 16)."""
    epochs: int = 10
    """Total epochs; on resume, training continues up to this number. (``small`` at 128 px
    on the 600-image CI data: test mean AUROC ~0.82 after 2 epochs, ~0.90 after 10.)"""
    learning_rate: float = Recipe.learning_rate
    """Adam's initial learning rate (CheXNet: 1e-3), per worker before ``scale_lr``."""
    pipeline: Pipeline = "new"
    """Training input: ``"new"`` or ``"old"`` (:mod:`chexnet_utils.input.pipelines`). Validation
    and test always use the new approach in evaluation mode."""
    seed: int = 0
    """Seeds Python, numpy and TensorFlow (``keras.utils.set_random_seed``), the shuffles and
    the flips. Runs are repeatable in distribution, not bit for bit: the new pipeline lets a
    fast image overtake a slow one (``deterministic=False``). With
    ``tf.config.experimental.enable_op_determinism()`` they are bit for bit (and ``tf.data``
    is slower: undo it with :func:`chexnet_utils.model.accelerator.disable_op_determinism`)."""
    resume: bool = False
    """Continue from ``out_dir/checkpoints`` if a checkpoint is there (else start afresh)."""
    steps_per_epoch: int | None = None
    """``None``: ``train images // (batch_size * world size)`` from the manifest."""
    validate: bool = True
    """Predict the val split after every epoch (val loss and AUROC, best checkpoint)."""
    evaluate_test: bool = True
    """Evaluate the best weights on the test split at the end."""
    weights: str | None = None
    """Initial weights file (``build_chexnet(weights=...)``): ImageNet ``*_notop.h5`` or a
    ``.weights.h5``. Ignored when resuming from a checkpoint."""
    distributed: bool = False
    """Train as one Horovod worker of many (``hvd.init()`` etc.; see the module docstring).
    Every process of the job calls :func:`train` with the same config."""
    scale_lr: bool = Recipe.scale_lr
    """Distributed: raise the learning rate with the number of workers (``lr_scaling``)."""
    lr_scaling: LrScaling = Recipe.lr_scaling
    """How, with ``scale_lr``: ``"linear"`` (``lr * N`` with warm-up: Horovod's examples and
    docs, Goyal et al. 2017) or ``"sqrt"`` (``lr * sqrt(N)``: Malladi et al. 2022, an
    option); see :func:`scaled_learning_rate`."""
    allreduce: Allreduce = Recipe.allreduce
    """Distributed: ``"per_tensor"`` (one allreduce per gradient, overlapping the backward
    pass) or ``"grouped"`` (one grouped allreduce after it); see :func:`gradient_averager`."""
    warmup_epochs: float = 1.0
    """Distributed with ``scale_lr``: epochs over which the learning rate rises linearly from
    the single-worker value to the scaled one (0: no warm-up)."""
    plateau_monitor: PlateauMonitor = "val_loss"
    """What ``ReduceLROnPlateau`` watches: ``val_loss`` (smoother on small val splits) or
    ``val_mean_auroc`` (watched for a rise). Without validation: the training ``loss``."""
    plateau_patience: int = 2
    plateau_factor: float = 0.1
    min_lr: float = 1e-6
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER
    antialias: bool = False
    """Antialiased resize in the pipelines (see ``pipelines.decode_resize``)."""
    tensorboard: bool = True
    profile_batch: int | tuple[int, int] = 0
    """TensorBoard profiler: ``0`` off, ``(first, last)`` traces those batches."""
    verbose: int = 2
    """``model.fit`` verbosity on rank 0 (2: one line per epoch; 0: silent)."""
    mixed_precision: bool | None = None
    """``mixed_float16`` with a float32 head; ``None``: on with a GPU, off on CPU (or
    ``CHEXNET_MIXED_PRECISION``). See :mod:`chexnet_utils.model.accelerator`."""
    xla: bool | None = None
    """``jit_compile``; ``None``: on with a GPU, off on CPU (or ``CHEXNET_XLA``). Distributed:
    only on a GPU with ``HOROVOD_ENABLE_XLA_OPS=1``, whatever is asked (XLA cannot compile
    Horovod's allreduce otherwise)."""
    device_feed: bool | None = None
    """New pipeline: batches prefetched to the device; ``None``: on with a GPU, off on CPU (or
    ``CHEXNET_DEVICE_FEED``; on without a GPU prefetches to ``/cpu:0``)."""

    def __post_init__(self) -> None:
        self.tfrecords = Path(self.tfrecords)
        self.out_dir = Path(self.out_dir)
        if self.weights is not None:
            self.weights = str(self.weights)
        if isinstance(self.profile_batch, list):
            self.profile_batch = tuple(self.profile_batch)

    @classmethod
    def from_scale(cls, tfrecords: Path | str, out_dir: Path | str, s: Scale | None = None,
                   **overrides: Any) -> TrainConfig:
        """One run of a scale preset (notebooks 04 and 08): ``s``'s (default:
        :func:`chexnet_utils.config.scale`) architecture, image size, batch size and epochs on
        ``tfrecords``, no TensorBoard, one log line per epoch, seed 0; ``overrides`` win. A
        notebook's next run changes a field or two (``dataclasses.replace``)."""
        s = s or scale()
        preset: dict[str, Any] = dict(arch=s.arch, image_size=s.image_size,
                                      batch_size=s.batch_size, epochs=s.epochs,
                                      tensorboard=False, verbose=2, seed=0)
        return cls(tfrecords=tfrecords, out_dir=out_dir, **{**preset, **overrides})

    def validate_values(self) -> None:
        """Raise ``ValueError`` for values that cannot work."""
        require_choices(self)  # arch, pipeline, lr_scaling, allreduce, plateau_monitor
        for name in ("image_size", "batch_size", "epochs"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.image_size < 32:
            raise ValueError(f"image_size must be >= 32, got {self.image_size}")
        if self.steps_per_epoch is not None and self.steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be >= 1, got {self.steps_per_epoch}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if not 0 < self.plateau_factor < 1:
            raise ValueError(f"plateau_factor must be in (0, 1), got {self.plateau_factor}")
        if self.warmup_epochs < 0:
            raise ValueError(f"warmup_epochs must be >= 0, got {self.warmup_epochs}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly copy (paths as strings)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["tfrecords"] = str(self.tfrecords)
        d["out_dir"] = str(self.out_dir)
        if isinstance(d["profile_batch"], tuple):
            d["profile_batch"] = list(d["profile_batch"])
        return d


@dataclass
class TrainResult:
    """What :func:`train` returns (rank 0 has the test figures; other ranks get NaN)."""

    mean_auroc: float
    """Test mean AUROC of the best weights over the classes present in the test split."""
    per_class_auroc: dict[str, float]
    """Test AUROC per pathology (NaN: the test split lacks positives or negatives)."""
    img_per_s: float
    """Training images/s over all workers (see the module docstring for what is timed)."""
    epochs: int
    """Epochs finished in total (including those before a resume)."""
    initial_epoch: int
    """Epochs already finished when this call started (0 unless resumed)."""
    best_epoch: int | None
    """1-based epoch whose weights were evaluated on the test split."""
    best_val_mean_auroc: float
    history: dict[str, list[float]]
    """Per-epoch logs of the whole run (all calls, across resumes): ``loss``, ``mean_auroc``
    (Keras' estimate on training batches), ``val_loss``, ``val_mean_auroc``,
    ``learning_rate``, ``epoch_s``."""
    timing: dict[str, Any]
    out_dir: Path
    metrics_path: Path | None
    model: Any = field(default=None, repr=False)
    """The trained model with the best weights loaded."""
    test_loss: float = math.nan
    rank: int = 0
    world_size: int = 1
    trained_checksum: str = ""
    """:func:`weights_sha256` of the trainable weights right after the last epoch (equal on
    every rank)."""


# --------------------------------------------------------------------------------------------
# train, in the order it runs: data, model, input, callbacks, fit, records, test, metrics
# --------------------------------------------------------------------------------------------

@dataclass
class _Splits:
    """The shards of one run and what the manifest says about them."""

    counts: dict[str, int]
    train_files: list[Path]
    val_files: list[Path]
    test_files: list[Path]
    label_sums: np.ndarray
    n_train: int
    steps: int
    """Optimizer steps per epoch (``steps_per_epoch``, or the train images over the global
    batch)."""


def _read_splits(cfg: TrainConfig, size: int) -> _Splits:
    """The manifest's counts and label sums and the shard files each split needs."""
    from chexnet_utils.data.tfrecords import list_shards

    tfr = Path(cfg.tfrecords)
    counts = split_counts(tfr)
    train_files = list_shards(tfr, "train")
    if not train_files:
        raise ValueError(f"{tfr}: no train shards")
    label_sums, n_train = training_label_sums(tfr)
    return _Splits(counts=counts, train_files=train_files,
                   val_files=list_shards(tfr, "val") if cfg.validate else [],
                   test_files=list_shards(tfr, "test") if cfg.evaluate_test else [],
                   label_sums=label_sums, n_train=n_train,
                   steps=cfg.steps_per_epoch or max(1, n_train // (cfg.batch_size * size)))


def _resume_state(cfg: TrainConfig, say: Callable[[str], None]) -> dict[str, Any] | None:
    """The last checkpoint's state when resuming and there is one; a checkpoint of another
    architecture or image size is refused."""
    ckpt_dir = Path(cfg.out_dir) / CHECKPOINT_DIR
    state: dict[str, Any] | None = read_state(ckpt_dir) if cfg.resume else None
    if cfg.resume and state is None:
        say(f"resume: no checkpoint in {ckpt_dir}, starting from scratch")
    if state is not None:
        for key in ("arch", "image_size"):
            if state.get(key) != getattr(cfg, key):
                raise ValueError(f"{ckpt_dir}: the checkpoint has {key}={state.get(key)!r}, "
                                 f"the config {getattr(cfg, key)!r}; use another out_dir or "
                                 "resume=False")
    return state


def _load_or_build(cfg: TrainConfig, state: dict[str, Any] | None, size: int,
                   switches: Switches, loss_fn: Any,
                   say: Callable[[str], None]) -> tuple[Any, dict[str, Any]]:
    """The model, compiled by the run's :class:`Recipe` (its gradient averager, its optimizer
    built so that its variables exist before the broadcast), and the run's state: from the
    last checkpoint (weights, optimizer state, learning rate) or fresh."""
    from chexnet_utils.model.accelerator import build_model, policy_scope
    from chexnet_utils.model.models import MeanAUROC

    if state is not None:
        with policy_scope(bool(state.get("mixed_precision", False))):  # as it was saved
            model, _ = load_checkpoint(Path(cfg.out_dir))
        say(f"resumed from {Path(cfg.out_dir) / CHECKPOINT_DIR / LAST_NAME}: {state['epoch']} "
            f"epoch(s) done, optimizer step {int(model.optimizer.iterations.numpy())}, "
            f"learning rate {float(np.asarray(model.optimizer.learning_rate)):.3g}")
        Recipe.of(cfg).attach(model)  # the loaded optimizer: its state, its learning rate
    else:
        model = build_model(cfg.arch, cfg.image_size, weights=cfg.weights,
                            mixed_precision=switches.mixed_precision)
        Recipe.of(cfg).compile(model, loss_fn, size, metrics=[MeanAUROC()],
                               jit_compile=switches.xla)
        state = {"format": STATE_FORMAT, "arch": cfg.arch, "image_size": cfg.image_size,
                 "epoch": 0, "best_epoch": None, "best_score": None, "history": [],
                 "mixed_precision": switches.mixed_precision}
    return model, state


def _training_input(cfg: TrainConfig, files: list[Path], rank: int, size: int,
                    initial_epoch: int, device_feed: bool) -> Any:
    """This worker's shards of the train split through the configured pipeline (the new one
    ending in the device feed when it is on)."""
    from chexnet_utils.input.pipelines import build_pipeline, training_feed

    ds = build_pipeline(cfg.pipeline, files, cfg.batch_size, cfg.image_size, training=True,
                        num_workers=size, worker_index=rank, seed=cfg.seed + initial_epoch,
                        shuffle_buffer=cfg.shuffle_buffer, antialias=cfg.antialias)
    return training_feed(cfg.pipeline, ds, device_feed)  # new: to the GPU ahead of time


def _callbacks(cfg: TrainConfig, splits: _Splits, state: dict[str, Any], loss_fn: Any,
               chief: bool, size: int, initial_epoch: int) -> tuple[list[Any], EpochTimer]:
    """The built-in callbacks in their order (see :mod:`chexnet_utils.training.callbacks`)
    and the epoch timer among them."""
    from chexnet_utils.training import callbacks as cb

    out = Path(cfg.out_dir)
    timer = cb.EpochTimer()
    cbs: list[Any] = [cb.Broadcast(cfg.distributed), timer]
    if cfg.distributed:
        # the ranks must hold the same weights before anything acts on this epoch
        cbs += [cb.RankAgreement(after_steps=2), cb.MetricAverage()]
        warmup_steps = int(round(cfg.warmup_epochs * splits.steps))
        if cfg.scale_lr and size > 1 and warmup_steps > 0:
            cbs.append(cb.Warmup(cfg.learning_rate, Recipe.of(cfg).worker_learning_rate(size),
                                 warmup_steps))  # up to the rate the optimizer was built at
    if splits.val_files:
        cbs.append(cb.Validation(eval_dataset(splits.val_files, cfg.batch_size,
                                              cfg.image_size, cfg.antialias),
                                 loss_fn, cfg.distributed))
    monitor = cfg.plateau_monitor if splits.val_files else "loss"
    plateau = cb.PlateauLR(monitor=monitor, mode="max" if monitor == "val_mean_auroc" else "min",
                           factor=cfg.plateau_factor, patience=cfg.plateau_patience,
                           min_lr=cfg.min_lr, verbose=1 if chief and cfg.verbose else 0,
                           initial_state=state.get("plateau"))
    cbs.append(plateau)
    if chief:
        (out / CHECKPOINT_DIR).mkdir(parents=True, exist_ok=True)
        cbs.append(keras.callbacks.CSVLogger(str(out / CSV_NAME), append=initial_epoch > 0))
        if cfg.tensorboard:
            cbs.append(keras.callbacks.TensorBoard(log_dir=str(out / TENSORBOARD_DIR),
                                                   profile_batch=cfg.profile_batch,
                                                   write_graph=False))
    cbs.append(cb.Checkpointer(out / CHECKPOINT_DIR, chief, state, plateau,
                               "val_mean_auroc" if splits.val_files else None))
    return cbs, timer


def _rank_records(model: Any, rank: int, distributed: bool) -> list[dict[str, Any]]:
    """Every rank's final learning rate and trainable :func:`weights_sha256`, by rank (this rank's
    alone without Horovod)."""
    ranks: list[dict[str, Any]] = [
        {"rank": rank, "lr": float(np.asarray(model.optimizer.learning_rate)),
         "trainable_sha256": weights_sha256(model.trainable_weights)}]
    if distributed:
        ranks = sorted(hvd.allgather_object(ranks[0], name="chexnet_rank_state"),
                       key=lambda r: r["rank"])
    return ranks


def _throughput(epoch_s: list[float], images_per_epoch: int) -> tuple[int, float]:
    """Timed epochs and training images/s over them: all epochs but the first (tracing,
    pipeline warm-up) when there is more than one."""
    timed = epoch_s[1:] if len(epoch_s) > 1 else epoch_s
    if not timed or sum(timed) <= 0:
        return len(timed), math.nan
    return len(timed), images_per_epoch * len(timed) / sum(timed)


def _evaluate_test(model: Any, cfg: TrainConfig, files: list[Path],
                   loss_fn: Any) -> tuple[dict[str, float], float, float]:
    """Per-class AUROC, mean AUROC and loss of ``model`` on the test ``files`` (NaN without
    them)."""
    if not files:
        return {name: math.nan for name in PATHOLOGIES}, math.nan, math.nan
    y_true, y_score = predict_split(model, eval_dataset(files, cfg.batch_size, cfg.image_size,
                                                        cfg.antialias))
    per_class = per_class_auroc(y_true, y_score)
    return per_class, mean_auroc(per_class), loss_value(loss_fn, y_true, y_score)


def _history_dict(history: list[dict[str, Any]]) -> dict[str, list[float]]:
    keys: list[str] = []
    for row in history:
        keys += [k for k in row if k != "epoch" and k not in keys]
    return {k: [nan_if_none(row.get(k)) for row in history] for k in keys}


def train(config: TrainConfig, callbacks: Sequence[Any] | None = None) -> TrainResult:
    """Train (or resume) CheXNet as ``config`` says; see the module docstring.

    ``callbacks`` are extra Keras callbacks, run after the built-in ones (validation, LR
    plateau, CSV, TensorBoard, checkpoint). Returns a :class:`TrainResult`; rank 0 also
    writes ``out_dir/metrics.json``. Raises ``FileNotFoundError`` for a missing TFRecords
    folder or weights file, ``ValueError`` for bad settings or a checkpoint of another arch.
    """
    from chexnet_utils.model.accelerator import describe, resolve_switches
    from chexnet_utils.model.models import WeightedBCE

    t_start = time.perf_counter()
    cfg = config
    cfg.validate_values()
    rank, size = init_world(cfg.distributed)
    switches = resolve_switches(cfg.mixed_precision, cfg.xla, cfg.device_feed,
                                distributed=cfg.distributed)
    chief = rank == 0
    say: Callable[[str], None] = (lambda msg: print(msg, flush=True)) \
        if chief and cfg.verbose else (lambda msg: None)

    splits = _read_splits(cfg, size)
    state = _resume_state(cfg, say)
    initial_epoch = int(state["epoch"]) if state else 0
    keras.utils.set_random_seed(cfg.seed + initial_epoch)
    loss_fn = WeightedBCE.from_label_sums(splits.label_sums, splits.n_train)
    model, state = _load_or_build(cfg, state, size, switches, loss_fn, say)
    train_ds = _training_input(cfg, splits.train_files, rank, size, initial_epoch,
                               switches.device_feed)
    cbs, timer = _callbacks(cfg, splits, state, loss_fn, chief, size, initial_epoch)

    say(f"training {cfg.arch} at {cfg.image_size} px on {splits.n_train} images "
        f"({len(splits.train_files)} shards, {cfg.pipeline} pipeline), batch {cfg.batch_size} "
        f"x {size} worker(s), {splits.steps} steps/epoch, "
        f"epochs {initial_epoch + 1}..{cfg.epochs}; {describe(switches)}")
    t_fit = time.perf_counter()
    if initial_epoch < cfg.epochs:
        model.fit(train_ds, epochs=cfg.epochs, initial_epoch=initial_epoch,
                  steps_per_epoch=splits.steps, callbacks=cbs + list(callbacks or []),
                  verbose=cfg.verbose if chief else 0, shuffle=False)  # the pipeline shuffles
    fit_s = time.perf_counter() - t_fit
    ranks = _rank_records(model, rank, cfg.distributed)  # before loading the best weights
    epoch_s = [s for _, s in timer.records]
    timed_epochs, img_per_s = _throughput(epoch_s, splits.steps * cfg.batch_size * size)

    best_path = Path(cfg.out_dir) / CHECKPOINT_DIR / BEST_NAME  # test: the best epoch (rank 0)
    t_test = time.perf_counter()
    if chief and best_path.is_file():
        model.load_weights(best_path)
    test_per_class, test_mean, test_loss = _evaluate_test(
        model, cfg, splits.test_files if chief else [], loss_fn)
    timing = {"total_s": time.perf_counter() - t_start, "fit_s": fit_s,
              "epoch_s": epoch_s, "timed_epochs": timed_epochs,
              "first_epoch_s": epoch_s[0] if epoch_s else None,
              "test_eval_s": time.perf_counter() - t_test}
    result = TrainResult(
        mean_auroc=test_mean, per_class_auroc=test_per_class, img_per_s=img_per_s,
        epochs=int(state.get("epoch", initial_epoch)), initial_epoch=initial_epoch,
        best_epoch=state.get("best_epoch"),
        best_val_mean_auroc=nan_if_none(state.get("best_score")),
        history=_history_dict(state.get("history", [])), timing=timing,
        out_dir=Path(cfg.out_dir), metrics_path=None, model=model, test_loss=test_loss,
        rank=rank, world_size=size,
        trained_checksum=next(r["trainable_sha256"] for r in ranks if r["rank"] == rank))
    if chief:
        result.metrics_path = _write_metrics(cfg, result, splits, ranks, switches)
        say(f"test mean AUROC {test_mean:.3f} over "
            f"{sum(math.isfinite(v) for v in test_per_class.values())} classes (best epoch "
            f"{result.best_epoch}); {img_per_s:.1f} img/s; wrote {result.metrics_path}")
    return result


def _write_metrics(cfg: TrainConfig, result: TrainResult, splits: _Splits,
                   ranks: list[dict[str, Any]], switches: Switches) -> Path:
    """Write ``out_dir/metrics.json`` (rank 0): the test figures, throughput, every rank's
    final state, the timing, config, history, checkpoints, versions and accelerator."""
    size = result.world_size
    ckpt_dir = Path(cfg.out_dir) / CHECKPOINT_DIR
    best_path = ckpt_dir / BEST_NAME
    metrics = {
        "mean_auroc": result.mean_auroc,
        "per_class_auroc": result.per_class_auroc,
        "n_classes_evaluated": int(sum(math.isfinite(v)
                                       for v in result.per_class_auroc.values())),
        "test_loss": result.test_loss,
        "paper_mean_auroc": CHEXNET_PAPER_MEAN_AUROC,
        "img_per_s": result.img_per_s,
        "img_per_s_per_worker": result.img_per_s / size,
        "img_per_s_note": "training images/s of all workers over the timed epochs (the "
                          "first epoch of a call with more than one is left out: tracing "
                          "and pipeline warm-up); validation and checkpoints excluded",
        "epochs": result.epochs,
        "initial_epoch": result.initial_epoch,
        "best_epoch": result.best_epoch,
        "best_val_mean_auroc": result.best_val_mean_auroc,
        "steps_per_epoch": splits.steps,
        "global_batch_size": cfg.batch_size * size,
        "world_size": size,
        "ranks": ranks,
        "ranks_identical": len({(r["lr"], r["trainable_sha256"]) for r in ranks}) == 1,
        "images": splits.counts,
        "timing": result.timing,
        "config": cfg.to_dict(),
        "history": result.history,
        "checkpoints": {"last": str(ckpt_dir / LAST_NAME),
                        "best": str(best_path) if best_path.is_file() else None},
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
        "accelerator": {"mixed_precision": switches.mixed_precision, "xla": switches.xla,
                        "device_feed": switches.device_feed, "why": switches.why},
    }
    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    path = Path(cfg.out_dir) / METRICS_NAME
    write_json_atomic(path, metrics)
    return path


def train_on_engine(config: TrainConfig | dict[str, Any]) -> dict[str, Any]:
    """Run :func:`train` as one Horovod worker and return a small, picklable summary.

    Meant for ipyparallel MPI engines (``cluster.run(train_on_engine, cfg)``): every engine
    trains with ``distributed=True``; rank 0 prints progress (the notebook shows only rank
    0's output) and writes the files. The summary has the rank, world size, images/s,
    test AUROC (rank 0), history and :func:`weights_sha256` of the trainable weights
    (``weights_checksum``), which is the same on every
    rank when gradients were averaged and the initial state broadcast correctly.
    """
    cfg = TrainConfig(**config) if isinstance(config, dict) else config
    cfg.distributed = True
    result = train(cfg)
    return {
        "rank": result.rank,
        "size": result.world_size,
        "img_per_s": result.img_per_s,
        "mean_auroc": result.mean_auroc,
        "per_class_auroc": result.per_class_auroc,
        "epochs": result.epochs,
        "initial_epoch": result.initial_epoch,
        "history": result.history,
        "timing": result.timing,
        "weights_checksum": result.trained_checksum,
        "pid": os.getpid(),
    }
