"""A custom loop under ``MirroredStrategy`` must give each replica its own rows (fast tier).

``strategy.run(step, args=(x, y))`` with plain tensors hands every replica the same batch: the replicas'
clipped sums add up and one record moves each update by 2 C on 2 replicas, while the step is accounted at C
(16 steps: 68.62 holds where 25.93 was printed). The DP step refuses it at its trace; a distributed dataset,
which gives each replica its own rows, trains. Every custom loop's statement lists, under
``asserted_by_user``, that each example is in at most one row of one replica's batch. Logical CPU devices
must be set before TensorFlow starts, so the cases run in a fresh process (about 15 s).
"""

from __future__ import annotations

import json
import os

import dp_accounting
from _fresh_process import run_script

HERE = os.path.abspath(__file__)


def test_one_batch_given_to_every_replica_is_refused_and_distributed_batches_train():
    r = run_script(HERE)
    truth = dp_accounting.rdp.RdpAccountant().compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(0.5), 16)).get_epsilon(1e-5)   # sensitivity 2 C at sigma 1
    assert truth > 60.0 > r["epsilon_if_counted_at_C"]
    assert "every replica of the tf.distribute strategy clips the same batch" in r["same_batch"]
    assert r["same_batch_steps"] == 0
    assert "every replica of the tf.distribute strategy clips the same batch" in r["same_batch_eager"]
    assert r["same_batch_eager_steps"] == 0
    assert r["distributed_steps"] == 8
    assert any("in one replica's batch only" in a for a in r["asserted_by_user"])


def _main():
    import tensorflow as tf

    tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                               [tf.config.LogicalDeviceConfiguration()] * 2)
    import numpy as np

    import tfdpbnn

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.integers(0, 3, 64)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    result = {}

    def compiled():
        with strategy.scope():
            model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
            opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=64, batch_size=8, delta=1e-5)
            model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model, opt

    model, opt = compiled()
    opt.begin_training(model, x, y, batch_size=8)

    @tf.function
    def same_batch(xb, yb):
        strategy.run(lambda a, b: opt.dp_train_step(model, (a, b)), args=(xb, yb))

    try:
        same_batch(tf.constant(x[:8]), tf.constant(y[:8]))
        result["same_batch"] = "accepted"
    except ValueError as err:
        result["same_batch"] = str(err)
    result["same_batch_steps"] = int(opt.steps)
    try:  # the replicas run eagerly (no tf.function): the same tensor object reaches both
        strategy.run(lambda a, b: opt.dp_train_step(model, (a, b)), args=(tf.constant(x[:8]),
                                                                          tf.constant(y[:8])))
        result["same_batch_eager"] = "accepted"
    except ValueError as err:
        result["same_batch_eager"] = str(err)
    result["same_batch_eager_steps"] = int(opt.steps)
    result["epsilon_if_counted_at_C"] = float(opt.epsilon_after(16))

    model, opt = compiled()
    data = tfdpbnn.data.assert_sampling(tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64).batch(8),
                                        "shuffle", num_examples=64)
    opt.begin_training(model, data)
    distributed = strategy.experimental_distribute_dataset(data)

    @tf.function
    def own_rows(batch):
        strategy.run(lambda a, b: opt.dp_train_step(model, (a, b)), args=batch)

    for batch in distributed:
        own_rows(batch)
    result["distributed_steps"] = int(opt.steps)
    result["asserted_by_user"] = opt.privacy_statement()["asserted_by_user"]
    print(json.dumps(result))


if __name__ == "__main__":
    _main()
