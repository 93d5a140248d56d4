"""Notebook 04, exercise 6: the whole one-worker -> Horovod conversion, under ``fit``, checked.

The learner's ``%%px`` cell defines, on every engine, notebook 03's one-worker program in four
names: ``setup_worker()`` (what runs before TensorFlow touches a device), ``make_dataset(files,
batch_size, image_size)`` (the training pipeline), ``CheXNet`` (a ``keras.Model`` with its
``train_step``) and ``train(files, n_images, out_dir, image_size, batch_size, epochs, lr, seed)``
(model, ``compile``, callbacks, ``fit``; returns the model). :func:`fit_conversion_trial` runs
those on every engine and observes each of Horovod's changes by what it does, never by reading
the code:

1. ``hvd.init()``: Horovod is shut down before ``setup_worker()`` and must be up after it.
2. pinning: ``setup_worker()`` runs while TensorFlow pretends to see one GPU per engine; the
   one made visible must be ``gpus[hvd.local_rank()]``.
3. sharding: the IDs of the records ``make_dataset`` yields for one epoch of steps; the ranks'
   must not overlap.
4. steps per epoch: ``fit``'s own count (``params["steps"]``) must be ``n_images // batch /
   N``.
5. learning rate: recorded at every step; it must end at ``lr x N`` (or ``x sqrt(N)``) and
   start lower (the warm-up).
6. averaging: after training, one eager ``train_step`` with SGD(1) on a different batch per
   rank: the update must be the *average* of the ranks' gradients (not the rank's own, not
   the sum), computed by the check with a plain tape and ``hvd.allgather``.
7. broadcast: before ``fit``'s first step the check builds the optimizer and shifts the
   optimizer state (step count, Adam's m and v) of ranks > 0, as a resume that read different
   files would; after the first step every rank must hold rank 0's weights *and* optimizer
   state.
8. metric averaging: every rank's epoch logs (``loss``) must be equal.
9. rank-0 files: each rank gets an ``out_dir`` of its own; only rank 0's may hold files.

The check listens with two callbacks, one before and one after the learner's (it wraps
``CheXNet.fit`` for the trial), so the learner's code carries nothing of the check's.
"""

from __future__ import annotations

import io
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chexnet_utils.notebook.exercises.verdict import verdict
from chexnet_utils.training.experiments import random_batch
from chexnet_utils.training.horovod_keras import weights_sha256

NAMES = ("setup_worker", "make_dataset", "CheXNet", "train")
N_FILES, PER_FILE, IMAGE_SIZE, BATCH_SIZE, EPOCHS = 4, 16, 32, 8, 2   # the trial's run
LR = 1e-3                                                              # its one-worker rate


# ---- the data: record IDs in the labels ------------------------------------------------------

def id_label(i: int, n_classes: int = 14) -> list[float]:
    """Record ``i``'s label: the bits of ``i + 1`` over the classes (never all zero)."""
    return [float(((i + 1) >> c) & 1) for c in range(n_classes)]


def label_id(label: Sequence[float]) -> int:
    """The record ID :func:`id_label` put into ``label``."""
    return sum(1 << c for c, v in enumerate(label) if v > 0.5) - 1


def write_trial_shards(out_dir: str | Path, n_files: int = N_FILES,
                       per_file: int = PER_FILE, size: int = IMAGE_SIZE
                       ) -> list[str]:
    """``n_files`` TFRecord shards in the course's format, ``per_file`` small grey PNGs each,
    record ``i``'s label holding ``i`` (:func:`id_label`). Returns the paths."""
    from PIL import Image

    from chexnet_utils.data.tfrecords.wire import frame_record, make_example

    rng = np.random.default_rng(5)
    out, paths = Path(out_dir), []
    out.mkdir(parents=True, exist_ok=True)
    for f in range(n_files):
        path = out / f"train-{f:05d}-of-{n_files:05d}.tfrecord"
        with open(path, "wb") as fh:
            for j in range(per_file):
                i = f * per_file + j
                buf = io.BytesIO()
                pixels = rng.integers(0, 256, (size, size), dtype=np.uint8)
                Image.fromarray(pixels).save(buf, "PNG")
                fh.write(frame_record(make_example(buf.getvalue(), "png", size, size,
                                                   id_label(i), f"ex6-{i:04d}.png", i)))
        paths.append(str(path))
    return paths


# ---- on every engine ---------------------------------------------------------------------------

def _fake_gpus(tf: Any, n: int) -> tuple[list[Any], dict[str, Any], Callable[[], None]]:
    """Make ``tf.config`` pretend there are ``n`` GPUs; record what is made visible. Returns
    the fake devices, the record and a function that undoes it."""
    gpus = [tf.config.PhysicalDevice(name=f"/physical_device:GPU:{i}", device_type="GPU")
            for i in range(n)]
    seen: dict[str, Any] = {"visible": None}

    def list_devices(device_type: str | None = None) -> list[Any]:
        return list(gpus) if device_type in ("GPU", "gpu") else real["list"](device_type)

    def set_visible(devices: Any, device_type: str | None = None) -> None:
        one = hasattr(devices, "device_type")          # a PhysicalDevice is a namedtuple
        seen["visible"] = [d.name for d in ([devices] if one else devices)]

    real = {"list": tf.config.list_physical_devices}
    targets = [(tf.config, "list_physical_devices", list_devices),
               (tf.config.experimental, "list_physical_devices", list_devices),
               (tf.config, "set_visible_devices", set_visible),
               (tf.config.experimental, "set_visible_devices", set_visible),
               (tf.config.experimental, "set_memory_growth", lambda *a, **k: None)]
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in targets]
    for mod, name, fn in targets:
        setattr(mod, name, fn)

    def undo() -> None:
        for mod, name, fn in saved:
            setattr(mod, name, fn)

    return gpus, seen, undo


def _probes(report: dict[str, Any]) -> tuple[Any, Any]:
    """The check's two callbacks: ``first`` (before the learner's: shifts the optimizer state
    of ranks > 0 at the start) and ``last`` (after them: records what the learner's did)."""
    import horovod.tensorflow as hvd
    import keras

    class First(keras.callbacks.Callback):
        def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
            opt = self.model.optimizer
            report["model"] = self.model
            if not opt.built:        # Keras builds Adam's m and v only at the first step
                opt.build(self.model.trainable_variables)
            if hvd.rank() > 0:       # the step count, Adam's m and v; not the learning rate
                for v in opt.variables:
                    if "learning_rate" not in v.name:
                        v.assign(v + (3 * hvd.rank() if "iteration" in v.name else 0.01))

    class Last(keras.callbacks.Callback):
        def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
            report["steps"] = self.params.get("steps")
            report["lrs"] = []
            report["begin"] = weights_sha256(self.model.trainable_weights)

        def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            report["lrs"].append(float(np.asarray(self.model.optimizer.learning_rate)))

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            if "step1" not in report:
                report["step1"] = (weights_sha256(self.model.trainable_weights),
                                   weights_sha256(self.model.optimizer.variables))

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            report.setdefault("epoch_loss", []).append(float((logs or {}).get("loss", np.nan)))

    return First(), Last()


def _with_probes(cls: Any, first: Any, last: Any) -> Callable[[], None]:
    """Wrap ``cls.fit`` so that every ``fit`` also runs ``first`` and ``last``; returns undo."""
    had = "fit" in vars(cls)
    original = cls.fit

    def fit(self: Any, *args: Any, callbacks: Sequence[Any] | None = None, **kwargs: Any) -> Any:
        return original(self, *args, callbacks=[first, *(callbacks or []), last], **kwargs)

    cls.fit = fit

    def undo() -> None:
        if had:
            cls.fit = original
        else:
            del cls.fit

    return undo


def _shard_ids(make_dataset: Any, files: Sequence[str], steps: int) -> list[int]:
    ds = make_dataset(list(files), BATCH_SIZE, IMAGE_SIZE)
    ids: list[int] = []
    for batch in ds.take(steps):
        ids += [label_id(row) for row in np.asarray(batch[1])]
    return ids


def _update_kind(model: Any, rank: int) -> dict[str, float]:
    """One eager ``train_step`` with SGD(1) on a batch of this rank's own: how far the update
    is from the ranks' average gradient, from their sum and from this rank's own gradient
    (relative errors; the smallest names what the step does)."""
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    x, y = (tf.constant(a) for a in random_batch(np.random.default_rng(100 + rank), 4,
                                                 IMAGE_SIZE))
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=True), training=True)
    grads = tape.gradient(loss, [v.value for v in variables])
    own = tf.concat([tf.reshape(g, [-1]) for g in grads], 0)
    every = tf.reshape(hvd.allgather(own[None, :], name="ex6_grads"), [hvd.size(), -1])
    sgd = keras.optimizers.SGD(learning_rate=1.0)
    sgd.build(variables)
    model.optimizer = sgd
    before = np.concatenate([np.ravel(v.numpy()) for v in variables])
    model.train_step((x, y))
    update = before - np.concatenate([np.ravel(v.numpy()) for v in variables])
    scale = float(np.linalg.norm(np.mean(every.numpy(), 0))) or 1.0
    return {kind: float(np.linalg.norm(update - ref)) / scale for kind, ref in
            (("average", np.mean(every.numpy(), 0)), ("sum", np.sum(every.numpy(), 0)),
             ("own", own.numpy()))}


def _error(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1] if text else ''}"[:300]


def fit_conversion_trial(names: dict[str, Any], files: Sequence[str], out_root: str
                         ) -> dict[str, Any]:
    """Run on every engine: the learner's program (``names``: :data:`NAMES` from the engine's
    namespace) observed as the module docstring says. Returns this rank's report for
    :func:`fit_conversion_problems`. Leaves Horovod initialised, as it found it."""
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from mpi4py import MPI

    report: dict[str, Any] = {"error": None, "n_images": len(files) * PER_FILE}
    hvd.shutdown()                                   # so that change 1 shows
    gpus, seen, undo_gpus = _fake_gpus(tf, max(2, MPI.COMM_WORLD.Get_size()))
    try:
        names["setup_worker"]()
    except Exception as e:  # the learner's code: report, do not crash the engine
        report["error"] = f"setup_worker: {_error(e)}"
    finally:
        undo_gpus()
    report["initialised"] = bool(hvd.is_initialized())
    if not report["initialised"]:
        hvd.init()
    rank, size = hvd.rank(), hvd.size()
    report.update(rank=rank, size=size, visible=seen["visible"],
                  want_visible=[gpus[hvd.local_rank() % len(gpus)].name])
    n_images = report["n_images"]
    out_dir = os.path.join(out_root, f"rank-{rank}")
    os.makedirs(out_dir, exist_ok=True)
    logger, level = tf.get_logger(), tf.get_logger().level
    logger.setLevel("ERROR")     # AutoGraph cannot read the source of a cell's function
    first, last = _probes(report)
    undo_fit = _with_probes(names["CheXNet"], first, last)
    try:
        if report["error"] is None:
            report["ids"] = _shard_ids(names["make_dataset"], files,
                                       n_images // BATCH_SIZE // size)
            names["train"](list(files), n_images, out_dir, image_size=IMAGE_SIZE,
                           batch_size=BATCH_SIZE, epochs=EPOCHS,
                           lr=LR, seed=rank)
            model = report.pop("model", None)
            if model is None:
                raise RuntimeError("train() did not call fit() on a CheXNet model")
            report["end"] = weights_sha256(model.trainable_weights)
            report["update"] = _update_kind(model, rank)
    except Exception as e:  # the learner's code: report, do not crash the engine
        report["error"] = _error(e)
    finally:
        undo_fit()
        logger.setLevel(level)
        report.pop("model", None)
    report["wrote"] = sorted(os.listdir(out_dir))
    return report


def engine_names() -> dict[str, Any]:
    """Run on an engine: the learner's :data:`NAMES` from its namespace (``KeyError`` names a
    missing one)."""
    from IPython import get_ipython

    ns = get_ipython().user_ns
    missing_names = [n for n in NAMES if n not in ns]
    if missing_names:
        raise KeyError(f"not defined on the engines: {', '.join(missing_names)} (run the "
                       "%%px cell of the exercise first)")
    return {n: ns[n] for n in NAMES}


def run_fit_conversion(names: dict[str, Any] | None, files: Sequence[str], out_root: str
                       ) -> dict[str, Any]:
    """Run on every engine: :func:`fit_conversion_trial` on ``names``, or on the engine's own
    definitions when ``names`` is ``None`` (the ``%%px`` route)."""
    return fit_conversion_trial(names or engine_names(), files, out_root)


# ---- on the client ----------------------------------------------------------------------------

HINTS = (
    ("not been initialized", "call hvd.init() first, in setup_worker() (change 1)"),
    ("object has no attribute 'ref'", "Horovod works on tf.Variables, not Keras variables: "
     "ask the tape for the gradients of [v.value for v in self.trainable_variables] and "
     "broadcast [v.value for v in ...]; Horovod's own Keras callbacks fail this way on "
     "Keras 3: use those of section 2.3"),
    ("keras.backend", "Horovod 0.28.1's Keras callbacks use Keras 2's backend; on Keras 3 "
     "use those of section 2.3"),
)


def _update_problems(ranks: Sequence[dict[str, Any]]) -> list[str]:
    """Averaging, then broadcast (a rank whose gradients are not averaged drifts whatever it
    started from, so the broadcast is judged only once the averaging is right)."""
    out: list[str] = []
    kinds = [min(r["update"], key=r["update"].get) for r in ranks]
    errs = [min(r["update"].values()) for r in ranks]
    if set(kinds) == {"sum"} and max(errs) < 1e-3:
        out.append("averaging: the update is the SUM of the ranks' gradients, N times too "
                   "large; average them (hvd.DistributedGradientTape's default, op=hvd.Average).")
    elif set(kinds) != {"average"} or max(errs) > 1e-3:
        out.append("averaging: each rank's update is its own gradient; wrap the tape in "
                   "train_step: tape = hvd.DistributedGradientTape(tape) (change 4).")
    elif len({r["step1"][0] for r in ranks}) > 1 and len({r["begin"] for r in ranks}) > 1:
        out.append("broadcast: the ranks trained from different weights; broadcast rank 0's "
                   "model and optimizer variables when training begins (change 5).")
    elif len({r["step1"][0] for r in ranks}) > 1 or len({r["step1"][1] for r in ranks}) > 1:
        out.append("broadcast: the weights agree but the optimizer state (iterations, Adam's "
                   "m and v) does not; broadcast model.optimizer.variables too (change 5).")
    return out


def fit_conversion_problems(ranks: Sequence[dict[str, Any]]) -> list[str]:
    """Every fault of the conversion the ranks' reports show (empty: none), each naming the
    change to make."""
    out: list[str] = []
    size, base = len(ranks), LR
    for r in ranks:
        if r.get("error"):
            hint = next((h for key, h in HINTS if key in r["error"]), "")
            return [f"rank {r['rank']} failed: {r['error']}"
                    + (f". Hint: {hint}." if hint else "")]
    if not all(r["initialised"] for r in ranks):
        out.append("setup_worker() did not initialise Horovod: hvd.init() (change 1).")
    if any(r["visible"] != r["want_visible"] for r in ranks):
        got = {r["rank"]: r["visible"] for r in ranks}
        out.append(f"pinning: on a node with a GPU per engine the ranks made {got} visible; "
                   "each must see only gpus[hvd.local_rank()] "
                   "(tf.config.set_visible_devices, change 2).")
    ids = [set(r["ids"]) for r in ranks]
    if any(a & b for i, a in enumerate(ids) for b in ids[i + 1:]):
        out.append("sharding: the ranks read the same records in one epoch; shard the file "
                   "names first: ds.shard(hvd.size(), hvd.rank()) right after "
                   "from_tensor_slices(files).")
    n_images = int(ranks[0]["n_images"])
    want_steps = n_images // BATCH_SIZE // size
    if any(r["steps"] != want_steps for r in ranks):
        out.append(f"steps per epoch: fit ran {ranks[0]['steps']} per epoch; with {size} "
                   f"workers an epoch is n_images // batch_size // hvd.size() = {want_steps}.")
    lrs = ranks[0]["lrs"]
    ratio = lrs[-1] / base if lrs else 1.0
    if not any(math.isclose(ratio, k, rel_tol=1e-3) for k in (size, math.sqrt(size))):
        out.append(f"learning rate: it ended at {ratio:.3g} x the one-worker rate; scale it "
                   "by hvd.size() (change 3), and let the warm-up reach it within the first "
                   "epoch (the check trains two short ones).")
    elif lrs[0] >= lrs[-1] * 0.999:
        out.append("warm-up: the first step already used the scaled rate; start at the "
                   "one-worker rate and ramp up to it over the first epoch (Goyal et al. "
                   "2017 warm up ImageNet over 5 epochs; the check's run has 2 short ones).")
    out += _update_problems(ranks)
    losses = [tuple(round(v, 6) for v in r.get("epoch_loss", [])) for r in ranks]
    if len(set(losses)) > 1:
        out.append("metrics: each rank logged the loss of its own shard; average the epoch's "
                   "logs over the ranks before the logger and checkpoint read them.")
    writers = [r["rank"] for r in ranks if r["wrote"]]
    if not writers:
        out.append("files: rank 0 wrote no checkpoint or log into the out_dir it was given.")
    elif writers != [0]:
        out.append(f"files: ranks {writers} wrote checkpoints or logs; rank 0 only (change 6).")
    return out


def check_fit_conversion(cluster: Any, names: dict[str, Any] | None = None,
                         timeout: float = 300) -> bool:
    """04 exercise 6: your ``%%px`` conversion of notebook 03's training (``setup_worker``,
    ``make_dataset``, ``CheXNet``, ``train`` on the engines of ``cluster``, an
    :class:`~chexnet_utils.cluster.distributed.MPICluster`), run under ``fit`` on every engine
    and judged by what it does; ``names`` passes the four by value instead (tests)."""
    with tempfile.TemporaryDirectory(prefix="chexnet-ex6-") as tmp:   # >= 2 files per rank
        files = write_trial_shards(Path(tmp) / "shards", max(N_FILES, 2 * int(cluster.n)))
        out_root = str(Path(tmp) / "out")
        ranks = cluster.run(run_fit_conversion, names, files, out_root, timeout=timeout)
    problems = fit_conversion_problems(ranks)
    return verdict(not problems,
                   f"{len(ranks)} ranks: Horovod up, one GPU each, disjoint shards, "
                   f"{ranks[0].get('steps')} steps per epoch, the rate warmed up to x N, "
                   "the gradients averaged, rank 0's state broadcast, the logs averaged, "
                   "files from rank 0 only.",
                   " | ".join(problems))
