"""CheXNet on N Horovod workers, the smallest complete script (Keras 3). Copy it.

    horovodrun -np 2 python scripts/train_horovod_minimal.py --epochs 1
    mpirun -np 2 python scripts/train_horovod_minimal.py --epochs 1
The six changes to a one-worker Keras script are marked CHANGE 1..6, numbered in the order
of Horovod's docs (4 comes first in the file: it lives in the model's train_step). On a GPU
it also trains as a GPU node should (GPU, below): mixed precision, batches prefetched to the
GPU, and XLA only where it can compile Horovod's allreduce.
"""
import argparse
import hashlib

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from chexnet_utils.config import scale
from chexnet_utils.data.tfrecords import list_shards
from chexnet_utils.input.pipelines import accelerator_device, new_approach, to_accelerator
from chexnet_utils.model.accelerator import describe, resolve_switches
from chexnet_utils.model.models import WeightedBCE, build_chexnet
from chexnet_utils.training import training_label_sums

S = scale()  # CHEXNET_SCALE: ci (default), workstation, gpu-node
p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--tfrecords", help="converted folder (default: this scale's, made if missing)")
p.add_argument("--arch", default=S.arch)
p.add_argument("--image-size", type=int, default=S.image_size)
p.add_argument("--batch-size", type=int, default=S.batch_size, help="per worker")
p.add_argument("--epochs", type=int, default=S.epochs)
p.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate on one worker")
p.add_argument("--out", default="build/runs/minimal", help="rank 0's checkpoint and log")
args = p.parse_args()

hvd.init()                                                           # CHANGE 1: start Horovod
gpus = tf.config.list_physical_devices("GPU")                        # CHANGE 2: one GPU each
if gpus:
    try:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
        tf.config.experimental.set_memory_growth(gpus[hvd.local_rank()], True)
    except RuntimeError:  # TensorFlow already started here (e.g. a notebook's engine): pinned
        pass
# GPU: mixed precision and the device feed on with a GPU (CHEXNET_MIXED_PRECISION,
# CHEXNET_DEVICE_FEED); XLA decided here, not by Keras' jit_compile="auto" (on with any GPU):
# XLA compiles Horovod's allreduce only on a GPU with HOROVOD_ENABLE_XLA_OPS=1 (Horovod
# docs/xla.rst), elsewhere the step fails to compile, so it stays off there.
switches = resolve_switches(distributed=True)
keras.config.set_dtype_policy(switches.policy)  # mixed_float16: float16 maths, float32 weights

if args.tfrecords is None:  # rank 0 converts the data once; the broadcast is the barrier
    from chexnet_utils.data.prepare import prepare_tfrecords
    # workers=1: in this process; a process pool spawns children that re-run this unguarded
    # script, hvd.init() included (MPI_Init fails in them). Big data sets: convert beforehand.
    made = (str(prepare_tfrecords(args.image_size, workers=1, progress=False))
            if hvd.rank() == 0 else None)
    args.tfrecords = hvd.broadcast_object(made, root_rank=0)
label_sums, n_train = training_label_sums(args.tfrecords)
train = new_approach(list_shards(args.tfrecords, "train"), args.batch_size, args.image_size,
                     training=True, num_workers=hvd.size(), worker_index=hvd.rank())
train = to_accelerator(train, accelerator_device(switches.device_feed))  # GPU: copied ahead
steps = max(1, n_train // (args.batch_size * hvd.size()))  # an epoch = the data set once


class HorovodModel(keras.Model):
    """Keras' fit with a train_step whose gradients are averaged over the workers."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred, training=True)
            # GPU: mixed precision's LossScaleOptimizer divides the gradients by the loss
            # scale, so scale the loss first, as Keras' own train_step does (x1 in float32)
            scaled = self.optimizer.scale_loss(loss)
        tape = hvd.DistributedGradientTape(tape)                     # CHANGE 4: average
        # Keras 3 variables wrap a tf.Variable (.value); Horovod needs the tf.Variable.
        grads = tape.gradient(scaled, [v.value for v in self.trainable_variables])
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
        return self.compute_metrics(x, y, y_pred)


keras.utils.set_random_seed(hvd.rank())  # different on purpose: CHANGE 5 must fix it
base = build_chexnet(args.arch, args.image_size)
model = HorovodModel(base.inputs, base.outputs)
# CHANGE 3: scale the learning rate linearly, lr * N, reached by a linear warm-up over the
# first epoch (Horovod's examples/tensorflow2/tensorflow2_keras_mnist.py: Adam(0.001 * size)
# with a warm-up; Goyal et al. 2017 sec. 2.2). sqrt(N) (Malladi et al. 2022) is an option.
lr = keras.optimizers.schedules.PolynomialDecay(  # power 1 from lr to lr * N: a linear ramp
    args.lr, steps, end_learning_rate=args.lr * hvd.size(), power=1.0)
model.compile(optimizer=keras.optimizers.Adam(lr),  # mixed: wrapped in a LossScaleOptimizer
              loss=WeightedBCE.from_label_sums(label_sums, n_train), jit_compile=switches.xla)
model.optimizer.build(model.trainable_variables)
hvd.broadcast_variables([v.value for v in model.variables + model.optimizer.variables],
                        root_rank=0)                                 # CHANGE 5

callbacks = []
if hvd.rank() == 0:                                                  # CHANGE 6: rank 0 writes
    callbacks += [keras.callbacks.ModelCheckpoint(f"{args.out}/last.keras"),
                  keras.callbacks.CSVLogger(f"{args.out}/log.csv")]
    tf.io.gfile.makedirs(args.out)
model.fit(train, epochs=args.epochs, steps_per_epoch=steps, callbacks=callbacks,
          verbose=2 if hvd.rank() == 0 else 0, shuffle=False)

# Proof, not hope: every rank must end with the same weights.
digest = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.trainable_weights))
digests = hvd.allgather_object(digest.hexdigest())
if hvd.rank() == 0:
    print(f"{hvd.size()} workers, {steps} steps/epoch of {args.batch_size} images each; "
          f"{describe(switches)}")
    print(f"weights {digests[0][:12]}; ranks identical: {len(set(digests)) == 1}")
