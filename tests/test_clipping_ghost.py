"""The ghost engine equals the jacobian reference: norms, clip factors, clipped sums, regularizer gradients.

Stochastic layers draw their noise from ``tf.random.normal`` / ``tf.nn.dropout``; the fixture replaces them
by stateless versions with a fixed seed, so both engines run the same forward pass (same noise).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tfdpbnn.layers as L
from tfdpbnn.clipping import (
    ClippingRule,
    UnsupportedModelError,
    clip_factors,
    clipped_gradients,
    register_rule,
    unregister_rule,
)

RTOL = 2e-4


@pytest.fixture(autouse=True)
def fixed_noise(monkeypatch):
    def normal(shape, mean=0.0, stddev=1.0, dtype=tf.float32, seed=None, name=None):
        return mean + stddev * tf.random.stateless_normal(shape, seed=[3, 7], dtype=dtype)

    def dropout(x, rate, noise_shape=None, seed=None, name=None):
        return tf.nn.experimental.stateless_dropout(x, rate=rate, seed=[5, 9])

    monkeypatch.setattr(tf.random, "normal", normal)
    monkeypatch.setattr(tf.nn, "dropout", dropout)


def xent(y, y_pred, sample_weight):
    loss = tf.keras.losses.sparse_categorical_crossentropy(y, y_pred, from_logits=True)
    return loss if sample_weight is None else loss * sample_weight


def run(model, x, y, clip, method, sample_weight=None, var_list=None, graph=True):
    def fn():
        r = clipped_gradients(model, x, y, sample_weight, xent, clip, var_list=var_list, method=method)
        return (r.clipped_sum, r.regularization_grads, r.per_example_loss, r.per_example_norms,
                r.regularization_loss)

    return tf.function(fn, autograph=False)() if graph else fn()


def assert_same(model, x, y, sample_weight=None, var_list=None, graph=True):
    """Ghost == jacobian with a clip bound that clips about half the examples."""
    ref = run(model, x, y, 1e6, "jacobian", sample_weight, var_list, graph)
    clip = float(np.median(ref[3].numpy()))
    assert clip > 0
    ref = run(model, x, y, clip, "jacobian", sample_weight, var_list, graph)
    got = run(model, x, y, clip, "ghost", sample_weight, var_list, graph)
    np.testing.assert_allclose(got[2], ref[2], rtol=1e-5, atol=1e-6)          # same forward pass
    np.testing.assert_allclose(got[3], ref[3], rtol=RTOL)                     # norms
    np.testing.assert_allclose(clip_factors(got[3], clip), clip_factors(ref[3], clip), rtol=RTOL)
    assert 0 < int(np.sum(ref[3].numpy() > clip)) < len(ref[3])
    for g, r in zip(got[0], ref[0], strict=True):                             # clipped sums
        scale = max(float(np.max(np.abs(r))), 1e-6)
        np.testing.assert_allclose(g / scale, np.asarray(r) / scale, atol=RTOL)
    for g, r in zip(got[1], ref[1], strict=True):                             # KL / regularizer gradients
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got[4], ref[4], rtol=1e-6)
    return ref[3]


rng = np.random.default_rng(0)
B = 8
Y = rng.integers(0, 3, B)


def vec(*shape):
    return rng.normal(size=(B, *shape)).astype("float32")


def test_dense_layernorm_mlp_and_sample_weight():
    model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(5, activation="tanh"),
                                 tf.keras.layers.LayerNormalization(), tf.keras.layers.Dense(3)])
    assert_same(model, vec(6), Y)
    assert_same(model, vec(6), Y, sample_weight=rng.uniform(0.5, 2.0, B).astype("float32"), graph=False)


@pytest.mark.parametrize("units", [2, 40])   # ghost (Gram) norm when T(D+K) < DK, materialized otherwise
def test_dense_on_sequences(units):
    model = tf.keras.Sequential([tf.keras.Input((4, 30)), tf.keras.layers.Dense(units, activation="relu"),
                                 tf.keras.layers.LayerNormalization(axis=[1, 2]), tf.keras.layers.Flatten(),
                                 tf.keras.layers.Dense(3)])
    assert_same(model, vec(4, 30), Y)


def test_heteroscedastic_head_uses_the_dense_rule():
    from tfdpbnn.uncertainty import HeteroscedasticHead

    model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(5, activation="tanh"),
                                 HeteroscedasticHead(units=2)])      # 4 outputs: mean and log-variance
    assert_same(model, vec(6), Y)


def test_conv2d_strides_padding_dilation_and_pooling():
    model = tf.keras.Sequential([
        tf.keras.Input((9, 9, 2)),
        tf.keras.layers.Conv2D(4, 3, strides=2, padding="same", activation="relu"),
        tf.keras.layers.Conv2D(3, 2, dilation_rate=2, use_bias=False),
        tf.keras.layers.MaxPool2D(), tf.keras.layers.Flatten(), tf.keras.layers.Dense(3)])
    assert_same(model, vec(9, 9, 2), Y)


def test_embedding_with_repeated_ids():
    ids = rng.integers(0, 5, (B, 7)).astype("int32")
    model = tf.keras.Sequential([tf.keras.Input((7,), dtype="int32"), tf.keras.layers.Embedding(5, 4),
                                 tf.keras.layers.Flatten(), tf.keras.layers.Dense(3)])
    assert_same(model, ids, Y)


def test_variational_bbp_dropout_stack_with_kl():
    model = tf.keras.Sequential([
        tf.keras.Input((6,)),
        L.DenseVariational(7, num_examples=100, activation="relu",
                           log_sigma2_initializer=tf.keras.initializers.RandomUniform(-3.0, -1.0)),
        L.MCDropout(0.3),
        L.DenseBayesByBackprop(5, num_examples=100, activation="tanh",
                               kernel_rho_initializer=tf.keras.initializers.RandomUniform(-3.0, -1.0)),
        L.MCDropout(0.2, gaussian=True),
        L.DenseBayesByBackprop(3, num_examples=100, use_bias=False),
    ])
    assert_same(model, vec(6), Y)
    assert model.losses  # the KL terms were compared above (regularization grads and loss)


def test_noisy_conv_public_bn_cnn():
    public = rng.normal(size=(5, 8, 8, 2)).astype("float32")
    model = tf.keras.Sequential([
        tf.keras.Input((8, 8, 2)),
        L.PublicBatchNormalization(public_batch=public, gamma_initializer="random_uniform"),
        L.NoisyConv2D(3, 3, noise_stddev=0.1, activation="relu"),
        L.Conv2DVariational(4, 2, num_examples=50, strides=2, padding="same",
                            log_sigma2_initializer=tf.keras.initializers.RandomUniform(-3.0, -1.0)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.LayerNormalization(),
        L.NoisyDense(3, noise_stddev=0.1),
    ])
    assert_same(model, vec(8, 8, 2), Y)


def test_functional_and_subclassed_models():
    inp = tf.keras.Input((6,))
    h = L.DenseVariational(5, num_examples=10, activation="relu")(inp)
    skip = tf.keras.layers.Dense(5)(inp)
    out = tf.keras.layers.Dense(3)(tf.keras.layers.Add()([h, skip]))
    assert_same(tf.keras.Model(inp, out), vec(6), Y)

    class Net(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.a = L.NoisyDense(5, noise_stddev=0.05, activation="relu")
            self.b = tf.keras.layers.LayerNormalization()
            self.c = L.DenseBayesByBackprop(3, num_examples=10)

        def call(self, x, training=None):
            return self.c(self.b(self.a(x)), training=training)

    net = Net()
    net(vec(6))
    assert_same(net, vec(6), Y)


def test_var_list_subset():
    model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(5, activation="relu"),
                                 L.DenseVariational(3, num_examples=10)])
    assert_same(model, vec(6), Y, var_list=[model.layers[0].kernel, model.layers[1].log_sigma2])


class Scale(tf.keras.layers.Layer):
    """y = x * scale (a user layer for the registry example)."""

    def build(self, input_shape):
        self.scale = self.add_weight(name="scale", shape=(input_shape[-1],), initializer="ones")

    def call(self, inputs):
        return inputs * self.scale


class ScaleRule(ClippingRule):
    def variables(self, layer):
        return [layer.scale]

    def forward(self, layer, call, inputs, *args, **kwargs):
        outputs = call(inputs, *args, **kwargs)
        return outputs, [outputs], inputs

    def squared_norms(self, layer, context, grads):
        return [tf.reduce_sum(tf.square(context * grads[0]), axis=1)]

    def clipped_sums(self, layer, context, grads, factors):
        return [tf.reduce_sum(factors[:, None] * context * grads[0], axis=0)]


def scale_model():
    return tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(4, activation="tanh"),
                                Scale(name="my_scale"), tf.keras.layers.Dense(3)])


def test_user_registered_rule():
    register_rule(Scale, ScaleRule())
    try:
        model = scale_model()
        with warnings.catch_warnings():
            warnings.simplefilter("error")   # "auto" must take the fast path: no fallback warning
            run(model, vec(6), Y, 1.0, "auto")
        assert_same(model, vec(6), Y)
    finally:
        unregister_rule(Scale)


def test_fallback_warns_once_naming_layer_and_ghost_raises():
    model = scale_model()
    x = vec(6)
    with pytest.warns(UserWarning, match="my_scale") as record:
        auto = run(model, x, Y, 0.5, "auto")
        run(model, x, Y, 0.5, "auto")
    assert len([w for w in record if "my_scale" in str(w.message)]) == 1
    ref = run(model, x, Y, 0.5, "jacobian")
    for a, r in zip(auto[0], ref[0], strict=True):
        np.testing.assert_allclose(a, r, rtol=1e-6)
    with pytest.raises(ValueError, match="my_scale"):
        run(model, x, Y, 0.5, "ghost")


def test_shared_layer_and_inference_branch_fall_back():
    dense = tf.keras.layers.Dense(6, activation="tanh")
    inp = tf.keras.Input((6,))
    out = tf.keras.layers.Dense(3)(dense(dense(inp)))
    with pytest.raises(UnsupportedModelError, match="more than once"):
        run(tf.keras.Model(inp, out), vec(6), Y, 0.5, "ghost")

    model = tf.keras.Sequential([tf.keras.Input((6,)), L.DenseVariational(3, num_examples=10, name="vd")])
    with pytest.raises(UnsupportedModelError, match="vd"):
        tf.function(lambda: clipped_gradients(model, vec(6), Y, None, xent, 0.5, training=False,
                                              method="ghost").per_example_norms, autograph=False)()


class _TiedProjection(tf.keras.layers.Layer):
    """Reads another layer's kernel (an output projection tied to it): no weights of its own."""

    def __init__(self, dense, **kwargs):
        super().__init__(**kwargs)
        self.dense = dense

    def call(self, h):
        return tf.matmul(h, self.dense.kernel, transpose_b=True)


@pytest.mark.parametrize("where", ["layer", "model"])
def test_a_weight_read_outside_its_layer_falls_back(where):
    # The Dense rule saw only the kernel's own call: its other use was left out of the per-example norm and
    # of the clipped sum (the step trained on part of the gradient, norms 0.42 where 0.89 held).
    dense = tf.keras.layers.Dense(4, use_bias=False, name="tied")
    inp = tf.keras.Input((6,))
    h = tf.keras.layers.Activation("tanh")(dense(inp))
    if where == "layer":
        model = tf.keras.Model(inp, _TiedProjection(dense)(h)[:, :3])
    else:
        class Tied(tf.keras.Model):
            def __init__(self):
                super().__init__()
                self.dense = dense

            def call(self, x):
                return tf.matmul(tf.tanh(self.dense(x)), self.dense.kernel, transpose_b=True)[:, :3]

        model = Tied()
        model(vec(6))
    x = vec(6)
    with pytest.raises(UnsupportedModelError, match="tied"):
        run(model, x, Y, 0.5, "ghost")
    ref = run(model, x, Y, 0.5, "jacobian")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = run(model, x, Y, 0.5, "auto")   # the jacobian path, which sees every use
    np.testing.assert_allclose(got[3], ref[3], rtol=1e-5)
    np.testing.assert_allclose(got[0][0], ref[0][0], rtol=1e-5, atol=1e-7)


class _StandardizedConv2D(tf.keras.layers.Conv2D):
    """Keras's own weight-standardization example: keeps ``call``, overrides ``convolution_op``."""

    def convolution_op(self, inputs, kernel):
        mean, var = tf.nn.moments(kernel, axes=[0, 1, 2], keepdims=True)
        return tf.nn.conv2d(inputs, (kernel - mean) / tf.sqrt(var + 1e-10), padding="VALID",
                            strides=list(self.strides))


def test_a_conv_subclass_overriding_convolution_op_falls_back():
    # The Conv2D rule took the kernel as the convolution reads it, not the standardized one: norms 27.7
    # where 37.2 held, and a clipped sum that was not the kernel's gradient.
    model = tf.keras.Sequential([tf.keras.Input((5, 5, 2)), _StandardizedConv2D(3, 3, name="standardized"),
                                 tf.keras.layers.Flatten(), tf.keras.layers.Dense(3)])
    x = vec(5, 5, 2)
    with pytest.raises(UnsupportedModelError, match="standardized"):
        run(model, x, Y, 0.5, "ghost")
    ref = run(model, x, Y, 0.5, "jacobian")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = run(model, x, Y, 0.5, "auto")
    np.testing.assert_allclose(got[3], ref[3], rtol=1e-5)
    np.testing.assert_allclose(got[0][0], ref[0][0], rtol=1e-5, atol=1e-7)


def test_carried_public_batch_norm_falls_back():
    public = rng.normal(size=(4, 6)).astype("float32")
    model = tf.keras.Sequential([
        tf.keras.Input((6,)), L.AppendPublicBatch(public_batch=public, name="append"),
        tf.keras.layers.Dense(5), L.PublicBatchNormalization(num_public=4, carried=True),
        L.DropPublicBatch(4), tf.keras.layers.Dense(3)])
    with pytest.raises(ValueError, match="append"):
        run(model, vec(6), Y, 0.5, "ghost")


def test_trainable_batch_norm_rejected_and_bad_method():
    model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(4),
                                 tf.keras.layers.BatchNormalization(), tf.keras.layers.Dense(3)])
    for method in ("auto", "ghost", "jacobian"):
        with pytest.raises(ValueError, match="BatchNormalization"):
            run(model, vec(6), Y, 0.5, method, graph=False)
    with pytest.raises(ValueError, match="method"):
        run(model, vec(6), Y, 0.5, "fast", graph=False)


class _Tokenwise(tf.keras.layers.Layer):
    """A Dense applied to every token by merging the batch with the time axis ([B, T, D] -> [B * T, D])."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.dense = tf.keras.layers.Dense(units, name="tokens")

    def call(self, t):
        z = self.dense(tf.reshape(t, [-1, t.shape[-1]]))
        return tf.reshape(z, [tf.shape(t)[0], -1, z.shape[-1]])


def _token_model(inner):
    return tf.keras.Sequential([tf.keras.Input((4, 6)), inner, tf.keras.layers.GlobalAveragePooling1D(),
                                tf.keras.layers.Dense(3)])


@pytest.mark.parametrize("inner", ["reshape", "time_distributed"])
def test_a_layer_called_on_rows_that_merge_the_batch_falls_back(inner):
    # Each of an example's 4 token rows clipped to C alone would let one example move the clipped sum by 4 C.
    layer = _Tokenwise(5) if inner == "reshape" else tf.keras.layers.TimeDistributed(
        tf.keras.layers.Dense(5, name="tokens"))
    model = _token_model(layer)
    x = vec(4, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        auto = run(model, x, Y, 0.5, "auto")
    ref = run(model, x, Y, 0.5, "jacobian")  # each example's whole gradient clipped
    np.testing.assert_allclose(auto[3], ref[3], rtol=1e-5)
    assert auto[3].shape == (B,)
    for a, r in zip(auto[0], ref[0], strict=True):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-7)
    with pytest.raises(UnsupportedModelError, match="tokens"):
        run(model, x, Y, 0.5, "ghost")


def test_rows_that_merge_the_batch_unknown_at_the_trace_fail_the_step():
    model = _token_model(_Tokenwise(5))
    def clipped(x, y):
        return clipped_gradients(model, x, y, None, xent, 0.5, method="ghost").clipped_sum

    signature = [tf.TensorSpec([None, 4, 6]), tf.TensorSpec([None], tf.int64)]
    step = tf.function(clipped, input_signature=signature, autograph=False)
    refused = "layer tokens: called on a tensor whose first axis"
    with pytest.raises(tf.errors.InvalidArgumentError, match=refused):
        step(vec(4, 6), Y.astype(np.int64))


def test_layer_normalization_with_rms_scaling_falls_back():
    # Keras 3's rms_scaling divides by the root mean square without centring: the rule's centred xhat gave
    # the scale's per-example norms up to 27 times off (and its gradient wrong), so the exact path runs.
    try:
        norm = tf.keras.layers.LayerNormalization(rms_scaling=True, name="rms")
    except TypeError:
        pytest.skip("this Keras's LayerNormalization has no rms_scaling")
    model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(5), norm,
                                 tf.keras.layers.Dense(3)])
    x = vec(6)
    with pytest.warns(UserWarning, match="rms"):
        auto = run(model, x, Y, 0.5, "auto")
    ref = run(model, x, Y, 0.5, "jacobian")
    np.testing.assert_allclose(auto[3], ref[3], rtol=1e-5)
    for a, r in zip(auto[0], ref[0], strict=True):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="rms"):
        run(model, x, Y, 0.5, "ghost")
