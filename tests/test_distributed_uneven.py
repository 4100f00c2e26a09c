"""DP ``fit`` under ``MirroredStrategy`` when the replicas' parts of a batch differ in size (fast tier).

A global batch of 5 examples on 2 replicas is split 3 + 2, as Poisson batches split unevenly at most steps.
Keras 3 builds a distributed model from the first batch (``tfdpbnn._adapters.keras3.build_from_one_replica``
keeps that build from summing the unequal parts). Noiseless steps (sigma = 0) must then give the weights of
the same steps on one device: the replicas' clipped sums of 3 and 2 examples add up to the clipped sum of
the batch, divided by the global batch size. Logical CPU devices must be set before TensorFlow starts, so
the case runs in a fresh process (about 10 s).
"""

from __future__ import annotations

import json
import os

import numpy as np
from _fresh_process import run_script

HERE = os.path.abspath(__file__)


def test_uneven_replica_parts_train_as_one_device():
    r = run_script(HERE)
    assert r["one_device"]["steps"] == r["mirrored"]["steps"] == 3
    assert r["one_device"]["examples"] == r["mirrored"]["examples"] == 15
    np.testing.assert_allclose(np.asarray(r["mirrored"]["kernel"]), np.asarray(r["one_device"]["kernel"]),
                               atol=1e-6)
    # the steps moved the weights (the comparison is not between two untrained models)
    assert np.max(np.abs(np.asarray(r["one_device"]["kernel"]))) > 1e-3


def _train(tf, strategy):
    import tfdpbnn
    from tfdpbnn.record import attributes

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(15, 6)).astype("float32"), rng.normal(size=(15, 3)).astype("float32")
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((6,)),
                                     tf.keras.layers.Dense(3, kernel_initializer="zeros")])
        opt = tfdpbnn.DPSGDOptimizer(1.0, 0.0, learning_rate=1.0, num_examples=15, batch_size=5, delta=1e-5)
        model.compile(opt, loss=tf.keras.losses.MeanSquaredError())
    model.fit(x, y, batch_size=5, shuffle=False, epochs=1, verbose=0)
    steps, examples, _ = attributes.ledger_state(opt).open_counters()
    return {"steps": int(steps), "examples": int(examples), "kernel": model.get_weights()[0].tolist()}


def _main():
    import tensorflow as tf

    tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                               [tf.config.LogicalDeviceConfiguration()] * 2)
    one = _train(tf, tf.distribute.get_strategy())
    mirrored = _train(tf, tf.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice()))
    print(json.dumps({"one_device": one, "mirrored": mirrored}))


if __name__ == "__main__":
    _main()
