"""Horovod's documented Keras recipe, as its docs show it, on Keras 2 (``tf-keras``).

    mpirun -np 2 python scripts/horovod_keras2_canonical.py
    horovodrun -np 2 python scripts/horovod_keras2_canonical.py

``hvd.DistributedOptimizer`` averages gradients by overriding the optimizer's gradient
computation (``_compute_gradients``), which Keras 2's ``train_step`` reaches through
``optimizer.minimize``. Keras 3 (the ``keras`` that TensorFlow >= 2.16
installs) computes gradients with a tape and never calls it, so there the same recipe runs
without an error and does not average (``chexnet_utils.training.horovod_keras``, notebook 04). This
script selects Keras 2 before TensorFlow is imported and ends by comparing the ranks' weights:
``ranks identical: True``.
"""
import argparse
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras = tf-keras (Keras 2); set before TF loads
import hashlib  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

# Horovod 0.28.1 imports `keras.backend` by name, which is Keras 3 when both are installed:
# make that name mean Keras 2 in this process.
sys.modules["keras"] = keras
import horovod.tensorflow.keras as hvd  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", default="build/runs/keras2-canonical", help="rank 0's checkpoints")
args = parser.parse_args()

hvd.init()                                                            # 1. initialise
gpus = tf.config.list_physical_devices("GPU")                         # 2. one GPU per process
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")

rng = np.random.default_rng(1000 + hvd.rank())  # each worker its own data
x = rng.random((64, 32, 32, 3), dtype=np.float32)
y = (rng.random((64, 14)) < 0.3).astype(np.float32)
tf.random.set_seed(hvd.rank())  # different initial weights: the broadcast must fix that
model = keras.Sequential([
    keras.layers.Conv2D(16, 3, strides=2, activation="relu", input_shape=(32, 32, 3)),
    keras.layers.BatchNormalization(),
    keras.layers.Conv2D(32, 3, activation="relu"),
    keras.layers.GlobalAveragePooling2D(),
    keras.layers.Dense(14, activation="sigmoid")])
opt = keras.optimizers.legacy.SGD(0.01 * hvd.size(), momentum=0.9)     # 3. scale the LR (SGD)
opt = hvd.DistributedOptimizer(opt)                                   # 4. wrap the optimizer
model.compile(optimizer=opt, loss="binary_crossentropy")
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),       # 5. broadcast from 0
             hvd.callbacks.MetricAverageCallback(),
             hvd.callbacks.LearningRateWarmupCallback(0.01 * hvd.size(), warmup_epochs=1,
                                                      steps_per_epoch=8)]
if hvd.rank() == 0:                                                   # 6. rank 0 writes
    os.makedirs(args.out, exist_ok=True)
    callbacks.append(keras.callbacks.ModelCheckpoint(os.path.join(args.out, "epoch-{epoch}.h5")))
model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False, callbacks=callbacks)

h = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.trainable_weights))
import horovod.tensorflow as hvd_tf  # noqa: E402

digests = hvd_tf.allgather_object(h.hexdigest())
if hvd.rank() == 0:
    print(f"keras {keras.__version__}, {hvd.size()} workers; ranks identical: "
          f"{len(set(digests)) == 1}")
