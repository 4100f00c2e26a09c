"""State the DP step does not update: refused before the first step, or asserted public by name.

Each leak is shown first as a user would hit it (a statistic of the model that tells neighbouring data sets
apart exactly, with no noise), then refused by DP training, naming the layer and the variable.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from _small_runs import DELTA, LOSS, D, N, custom_loop_step, gaussians_epsilon, small_data

import tfdpbnn
from tfdpbnn.preprocessing.checks import declared_state


class MeanShift(tf.keras.layers.Layer):
    """Subtracts a non-trainable mean that ``fit_mean`` sets from data (an adapt-like method)."""

    def build(self, input_shape):
        self.mu = self.add_weight(name="mu", shape=input_shape[-1:], initializer="zeros", trainable=False)

    def fit_mean(self, x):
        self.mu.assign(np.mean(x, axis=0))

    def call(self, inputs):
        return inputs - self.mu


class Counter(tf.keras.layers.Layer):
    """Counts the examples it sees in training, in ``call()``."""

    def build(self, input_shape):
        self.count = self.add_weight(name="count", shape=(), initializer="zeros", trainable=False)

    def call(self, inputs, training=None):
        if training:
            self.count.assign_add(tf.cast(tf.shape(inputs)[0], tf.float32))
        return inputs


class RunningMean(tf.keras.layers.Layer):
    """A running mean of its inputs updated in ``call()`` (in a tf.function, as fit traces it)."""

    def build(self, input_shape):
        self.mean = self.add_weight(name="running_mean", shape=input_shape[-1:], initializer="zeros",
                                    trainable=False)

    def call(self, inputs, training=None):
        if training:
            self.mean.assign(0.9 * self.mean + 0.1 * tf.reduce_mean(inputs, axis=0))
        return inputs


def _model(layer, optimizer=True):
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), layer, tf.keras.layers.Dropout(0.2),
                                 tf.keras.layers.Dense(3)])
    opt = (tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA) if optimizer
           else tf.keras.optimizers.SGD(0.1))
    model.compile(optimizer=opt, loss=LOSS)
    return model, opt


def _neighbours():
    x, y = small_data()
    return (x, y), (x[:-1], y[:-1])


def test_state_set_from_the_data_mean_differs_between_neighbours_and_is_refused():
    (x, y), (x2, _) = _neighbours()
    a, b = MeanShift(), MeanShift()
    _model(a, optimizer=False), _model(b, optimizer=False)
    a.fit_mean(x)
    b.fit_mean(x2)
    assert np.max(np.abs(a.mu.numpy() - b.mu.numpy())) > 1e-3   # the leak: mu tells them apart
    model, opt = _model(a)
    for train in (lambda: model.fit(x, y, batch_size=8, epochs=1, verbose=0),
                  lambda: model.train_on_batch(x[:8], y[:8]),
                  lambda: opt.begin_training(model, x, y, batch_size=8)):
        with pytest.raises(ValueError, match=r"variable '(mean_shift.*/)?mu(:0)?' of layer 'mean_shift.*"
                                             r"assert_public_preprocessing"):
            train()
    assert opt.steps == 0


def test_state_asserted_public_trains_and_is_listed():
    x, y = small_data()
    layer = MeanShift()
    model, opt = _model(layer)
    layer.fit_mean(x)
    tfdpbnn.preprocessing.assert_public_preprocessing(layer, reason="means of the public census tables")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert opt.steps == N // 8
    asserted = opt.privacy_statement()["asserted_by_user"]
    assert any("public census tables" in entry for entry in asserted), asserted
    layer.fit_mean(x[:-1])                                   # changed after the assertion: refused again
    with pytest.raises(ValueError, match="variable '(mean_shift.*/)?mu(:0)?'"):   # Keras 3 names it 'mu'
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)


@pytest.mark.parametrize("layer_type", [Counter, RunningMean])
def test_variable_updated_in_call_differs_between_neighbours_and_is_refused(layer_type):
    (x, y), (x2, y2) = _neighbours()
    values = []
    for xs, ys in ((x, y), (x2, y2)):                          # the leak, with a non-private optimizer
        layer = layer_type()
        model, _ = _model(layer, optimizer=False)
        model.fit(xs, ys, batch_size=len(xs), epochs=1, verbose=0, shuffle=False)
        values.append(layer.non_trainable_weights[0].numpy())
    assert np.max(np.abs(values[0] - values[1])) > 1e-3
    layer = layer_type()
    model, opt = _model(layer)
    name = layer.non_trainable_weights[0].name
    with pytest.raises(ValueError, match=rf"changed the variable\(s\) '{name}' of layer '{layer.name}'"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert opt.steps == 0
    np.testing.assert_array_equal(layer.non_trainable_weights[0].numpy(), 0.0)   # the check's pass undone


def test_data_independent_keras_state_keeps_working():
    x, y = small_data()
    frozen_bn = tf.keras.layers.BatchNormalization(trainable=False)   # default statistics: nothing learned
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), frozen_bn, tf.keras.layers.Dropout(0.3),
                                 tf.keras.layers.GaussianNoise(0.1), tf.keras.layers.Dense(3)])
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert opt.steps == N // 8
    frozen_bn.moving_mean.assign(np.mean(x, axis=0))               # statistics of the private data
    with pytest.raises(ValueError, match="moving_mean"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)


def test_frozen_weights_are_not_state_and_assertion_needs_state():
    dense = tf.keras.layers.Dense(3)
    model, _ = _model(dense)
    dense.trainable = False
    assert declared_state(dense) == []
    with pytest.raises(ValueError, match="layer_or_model: 'dense.*non-trainable state"):
        tfdpbnn.preprocessing.assert_public_preprocessing(dense, reason="public")


def _contrastive(y_pred):
    """Each example's loss is its similarity to the batch's mean output: it depends on every example."""
    return -tf.reduce_sum(y_pred * tf.reduce_mean(y_pred, axis=0, keepdims=True), axis=1)


def test_contrastive_loss_has_sensitivity_above_the_clip_bound():
    """The leak: at sigma 0, adding one example (an outlier) moves the clipped sum by more than C."""
    x, _ = small_data()
    x = np.concatenate([x[:15], -50.0 * np.ones((1, D), np.float32)])
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3)])
    mechanism = tfdpbnn.DPMechanism(l2_norm_clip=1.0, noise_multiplier=0.0, expected_batch_size=1)

    def clipped_sum(batch):
        with tf.GradientTape() as tape:
            loss = _contrastive(model(batch, training=True))
        return mechanism.clip_losses(loss, model.trainable_variables, tape).clipped_sum

    big, small = clipped_sum(x[:16]), clipped_sum(x[:15])
    change = np.sqrt(sum(float(tf.reduce_sum(tf.square(a - b))) for a, b in zip(big, small, strict=True)))
    assert change > 2.0   # C = 1: per-example clipping does not bound this loss's sensitivity


class _OwnStep(tf.keras.Model):
    """A ``train_step`` override handing its own per-example loss to the DP optimizer."""

    def __init__(self, way, coupled):
        super().__init__(name="own_step")   # Keras 3 refuses its default name (a leading "_")
        self.dense = tf.keras.layers.Dense(3)
        self.way, self.coupled = way, coupled

    def call(self, x, training=None):
        return self.dense(x)

    def train_step(self, data):
        x, y = data
        variables = self.trainable_variables
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = (_contrastive(y_pred) if self.coupled
                    else tf.keras.losses.sparse_categorical_crossentropy(y, y_pred, from_logits=True))
        if self.way == "minimize":
            self.optimizer.minimize(loss, variables, tape=tape)
        else:
            released = self.optimizer.mechanism.privatize_losses(loss, variables, tape)
            self.optimizer.apply_gradients(zip(released.gradients, variables, strict=True))
        return {"step": tf.cast(self.optimizer.iterations, tf.float32)}   # Keras 3 needs an output


@pytest.mark.parametrize("way", ["minimize", "privatize_losses"])
def test_train_step_override_loss_is_checked_for_independence(way):
    x, y = small_data()
    for coupled in (True, False):
        tf.keras.utils.set_random_seed(0)
        model = _OwnStep(way, coupled)
        opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
        model.compile(optimizer=opt, loss=LOSS)
        if coupled:
            with pytest.raises(ValueError, match="depends on other examples of the batch"):
                model.fit(x, y, batch_size=8, epochs=1, verbose=0)
            assert opt.steps == 0
        else:
            model.fit(x, y, batch_size=8, epochs=1, verbose=0)
            assert opt.steps == N // 8


class _CountingStep(tf.keras.Model):
    """A ``train_step`` override that counts the examples it sees in a variable of a layer of its own."""

    def __init__(self):
        super().__init__(name="counting_step")   # Keras 3 refuses its default name (a leading "_")
        self.dense = tf.keras.layers.Dense(3)
        self.tally = Counter()
        self.tally.build((None, D))

    def call(self, x, training=None):
        return self.dense(x)

    def train_step(self, data):
        self.tally.count.assign_add(tf.cast(tf.shape(data[0])[0], tf.float32))
        return self.optimizer.dp_train_step(self, data)


def test_train_step_override_updating_a_variable_is_refused():
    x, y = small_data()
    model = _CountingStep()
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA),
                  loss=LOSS)
    with pytest.raises(ValueError, match=r"_CountingStep.train_step.*changed the variable"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert float(model.tally.count.numpy()) == pytest.approx(0.0, abs=1e-6)   # the probe's update undone


class _CountAfterUpdate(tf.keras.Model):
    """A ``train_step`` override that counts the examples AFTER its DP call (the probe stops before it)."""

    def __init__(self):
        super().__init__(name="count_after_update")   # Keras 3 refuses its default name (a leading "_")
        self.dense = tf.keras.layers.Dense(3)
        self.tally = Counter()
        self.tally.build((None, D))

    def call(self, x, training=None):
        return self.dense(x)

    def train_step(self, data):
        logs = self.optimizer.dp_train_step(self, data)
        self.tally.count.assign_add(tf.cast(tf.shape(data[0])[0], tf.float32))
        return logs


def test_variable_updated_after_the_dp_call_is_refused_after_the_first_step():
    x, y = small_data()
    model = _CountAfterUpdate()
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    with pytest.raises(ValueError, match=r"found before batch 1.*'count[_0-9]*(:0)?' of layer "
                                         r"'counter[_0-9]*'"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert opt.steps == 1                                                   # refused after one step
    assert float(model.tally.count.numpy()) == pytest.approx(0.0, abs=1e-6)  # and set back
    assert opt.privacy_statement()["guarantee"] is False  # the first step's update reached the variable


def test_a_variable_snapshot_sees_every_bit_and_restores_it():
    """A snapshot's comparison is exact: a sign of zero, one ulp, a NaN's payload; unchanged ones stay."""
    from tfdpbnn.optimizers.state_checks import VariableSnapshot

    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(3),
                                 tf.keras.layers.BatchNormalization()])
    bias = model.layers[0].bias
    start = [v.numpy().copy() for v in model.weights]
    nan = np.frombuffer(np.uint32(0x7FC00001).tobytes(), np.float32)[0]  # a NaN with a payload
    for value in (np.float32(-0.0), np.nextafter(np.float32(0), np.float32(1)), nan):
        snapshot = VariableSnapshot(model)
        assert snapshot.changed() == []
        bias.assign(np.where(np.arange(3) == 1, value, bias.numpy()).astype(np.float32))
        assert snapshot.changed() == [bias]
        snapshot.restore()
        assert snapshot.changed() == []
        assert all(np.array_equal(v.numpy().view(np.uint32), s.view(np.uint32))
                   for v, s in zip(model.weights, start, strict=True))


def _unbuilt(nested: bool):
    """A model not built until its first call: Dense layers with no Input, or a frozen built body in one."""
    tf.keras.utils.set_random_seed(0)
    if not nested:
        return tf.keras.Sequential([tf.keras.layers.Dense(4, activation="relu"), tf.keras.layers.Dense(3)])
    body = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(4, activation="relu")])
    body.trainable = False
    return tf.keras.Sequential([body, tf.keras.layers.Dense(3)])


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("entry", ["fit", "train_on_batch", "custom_loop"])
def test_a_model_built_by_its_first_call_trains_and_its_steps_are_counted(entry, nested):
    """The Keras habit of Dense layers with no Input (and a frozen body inside a Sequential, the transfer
    learning idiom) gives a model whose weights tf-keras cannot list until its first call, so the checks of
    a run's start raised Keras's "Weights ... have not yet been created". Each way in trains it now, and
    counts its releases: fit's pass of shuffled batches as one Gaussian release per example (dp-accounting),
    8 train_on_batch calls or custom-loop steps as 8; a frozen body stays as it was."""
    x, y = small_data()
    model = _unbuilt(nested)
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, learning_rate=0.1, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    assert nested or not model.built  # Keras 3 builds a Sequential whose first layer is built
    if entry == "fit":
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        expected = gaussians_epsilon(1.0, 1)
    elif entry == "train_on_batch":
        for _ in range(8):
            model.train_on_batch(x[:8], y[:8])
        expected = gaussians_epsilon(1.0, 8)
    else:
        step = custom_loop_step(model, x, y)
        for i in range(0, N, 8):
            step(x[i:i + 8], y[i:i + 8])
        expected = gaussians_epsilon(1.0, 8)  # the loop's own batches: each step may touch every record
    if nested:
        for after, before in zip(model.layers[0].get_weights(), _unbuilt(True).layers[0].get_weights(),
                                 strict=True):
            np.testing.assert_array_equal(after, before)
    statement = opt.privacy_statement()
    assert statement["guarantee"] is True and opt.steps == 8
    assert opt.epsilon() == pytest.approx(expected, rel=1e-2)


def test_a_snapshot_finds_every_write_and_reads_unchanged_variables_only_once(monkeypatch):
    """``VariableSnapshot.changed`` skips the byte comparison of a variable read in the buffer it holds
    (TensorFlow writes no buffer a read holds): a frozen body costs a read per variable before each batch,
    not a pass over its bytes (121 ms over 24 batches for a 5.6M-weight frozen body, 5.5 ms with it).
    Every kind of write still gives a new buffer and is found; the same value written again is not a change.
    """
    from tfdpbnn.optimizers import state_checks

    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(6), tf.keras.layers.Dense(3)])
    kernel, bias = model.layers[0].kernel, model.layers[0].bias
    compared = []
    original = state_checks.same_value
    monkeypatch.setattr(state_checks, "same_value", lambda a, b: compared.append(1) or original(a, b))
    snapshot = state_checks.VariableSnapshot(model)
    assert snapshot.changed() == [] and compared == []  # nothing written: no byte compared
    kernel.assign(kernel)  # the same value, the same buffer
    assert snapshot.changed() == []
    one = np.zeros(kernel.shape, np.float32)
    one[0, 0] = 1.0
    writes = {
        "assign": lambda: kernel.assign(kernel + one),
        "assign_add": lambda: kernel.assign_add(one),
        "scatter_nd_update": lambda: tfdpbnn._private_api.tf_variables([kernel])[0].scatter_nd_update(
            [[1, 1]], [5.0]),
        "traced": tf.function(lambda: kernel.assign(kernel * 2.0 + one)),
        "xla": tf.function(lambda: kernel.assign_add(one), jit_compile=True),
        "raw": lambda: tf.raw_ops.AssignVariableOp(resource=kernel.handle, value=kernel + one),
        "set_weights": lambda: model.layers[0].set_weights([kernel.numpy() + one, bias.numpy()]),
    }
    for name, write in writes.items():
        write()
        assert [v.name for v in snapshot.changed()] == [kernel.name], name
        snapshot.restore()
        assert snapshot.changed() == [], name
    # The snapshot's value written again in a new buffer: equal bytes, and held from then on (on a new model:
    # after a sparse write, TensorFlow copies every read of the kernel, which is then compared byte by byte).
    fresh = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(6)])
    snapshot = state_checks.VariableSnapshot(fresh)
    fresh.layers[0].kernel.assign(np.array(fresh.layers[0].kernel.numpy()))
    compared.clear()
    assert snapshot.changed() == [] and len(compared) == 1
    assert snapshot.changed() == [] and len(compared) == 1
