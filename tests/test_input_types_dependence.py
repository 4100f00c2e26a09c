"""The data-dependence proof for ragged, dict and multi-input models, string inputs; unknown types refused."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from _small_runs import DELTA, LOSS, D, N, gaussians_epsilon, small_data
from _tiers import SLOW_ON_KERAS2

import tfdpbnn
from tfdpbnn import _keras_version
from tfdpbnn.clipping import clipped_gradients

KERAS3 = _keras_version.KERAS_MAJOR == 3


class _Penalty(tf.keras.layers.Layer):
    def call(self, t):
        self.add_loss(tf.reduce_sum(tf.square(t.flat_values if isinstance(t, tf.RaggedTensor) else t)))
        return t


def _ragged_model(dtype, penalty=False, mix=False):
    tf.keras.utils.set_random_seed(0)
    if dtype == "int32":
        inputs = tf.keras.Input((None,), ragged=True, dtype="int32")
        h = tf.keras.layers.Embedding(10, 4)(inputs)
    else:
        inputs = tf.keras.Input((None, 1), ragged=True)
        h = tf.keras.layers.Dense(4)(inputs)
    if penalty:
        h = _Penalty()(h)
    h = tf.keras.layers.Lambda(lambda t: tf.reduce_mean(t, axis=1))(h)
    if mix:
        h = tf.keras.layers.Lambda(lambda t: t - tf.reduce_mean(t, axis=0, keepdims=True))(h)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(3)(h))


def _ragged_data(dtype):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 5, N)
    if dtype == "int32":
        x = tf.ragged.constant([list(rng.integers(0, 10, k)) for k in lengths], dtype=tf.int32)
    else:
        x = tf.ragged.constant([[[float(v)] for v in rng.normal(size=k)] for k in lengths], ragged_rank=1)
    return x, rng.integers(0, 3, N)


def _fit(model, x, y):
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    return opt


# fast tier: int32 (the same refusal code; float32 in the full suite)
@pytest.mark.parametrize("dtype", ["int32", pytest.param("float32", marks=[
    *SLOW_ON_KERAS2, pytest.mark.skipif(KERAS3, reason="Keras 3's Dense takes no RaggedTensor ('object of "
                                                        "type RaggedTensor has no len()')")])])
def test_ragged_inputs_coupling_or_penalty_refused_plain_accepted(dtype):
    x, y = _ragged_data(dtype)
    with pytest.raises(ValueError, match="model.losses depends on the input data"):
        _fit(_ragged_model(dtype, penalty=True), x, y)
    with pytest.raises(ValueError, match="mixes examples"):
        _fit(_ragged_model(dtype, mix=True), x, y)
    opt = _fit(_ragged_model(dtype), x, y)
    assert opt.steps == 8 and opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 1), rel=1e-2)


def test_ragged_inputs_are_clipped_per_example_exactly():
    x, y = _ragged_data("int32")
    x, y = x[:6], y[:6]
    model = _ragged_model("int32")
    model(x)

    def loss_fn(yt, yp, sw=None):
        return tf.keras.losses.sparse_categorical_crossentropy(yt, yp, from_logits=True)

    clip = 0.05
    result = clipped_gradients(model, x, y, None, loss_fn, clip, method="auto")
    got = result.clipped_sum
    assert float(tf.reduce_max(result.per_example_norms)) > clip  # the clip acts
    with pytest.raises(ValueError, match="RaggedTensor"):
        clipped_gradients(model, x, y, None, loss_fn, clip, method="ghost")
    # Reference: each example alone (a ragged batch of one row), its gradient clipped to norm <= C, summed.
    want = [tf.zeros_like(v) for v in model.trainable_variables]
    for i in range(6):
        with tf.GradientTape() as tape:
            loss = loss_fn(y[i:i + 1], model(x[i:i + 1], training=True))[0]
        grads = [tf.convert_to_tensor(g) if g is not None else tf.zeros_like(v)
                 for g, v in zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables,
                                 strict=True)]
        norm = tf.sqrt(tf.add_n([tf.reduce_sum(g ** 2) for g in grads]))
        scale = tf.minimum(1.0, clip / norm)
        want = [w + scale * g for w, g in zip(want, grads, strict=True)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(), w.numpy(), rtol=1e-4, atol=1e-6)


def _dict_model(coupled):
    tf.keras.utils.set_random_seed(0)
    words = tf.keras.Input((2,), dtype="string", name="words")
    values = tf.keras.Input((D,), name="values")
    ids = tf.keras.layers.StringLookup(vocabulary=["a", "b", "c"])(words)
    h = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(5, 2)(ids))
    if coupled:
        h = tf.keras.layers.Lambda(lambda t: t - tf.reduce_mean(t, axis=0, keepdims=True))(h)
    return tf.keras.Model({"words": words, "values": values},
                          tf.keras.layers.Dense(3)(tf.keras.layers.Concatenate()([h, values])))


@pytest.mark.skipif(KERAS3, reason="Keras 3's fit cannot take numpy string arrays ('Invalid dtype: str32')")
def test_dict_input_with_strings_coupled_refused_and_plain_accepted():
    xv, y = small_data()
    rng = np.random.default_rng(0)
    x = {"words": rng.choice(["a", "b", "c"], (N, 2)), "values": xv}
    with pytest.raises(ValueError, match="mixes examples"):
        _fit(_dict_model(coupled=True), x, y)
    opt = _fit(_dict_model(coupled=False), x, y)
    assert opt.steps == 8


def test_multi_input_list_model_with_a_float_penalty_refused():
    tf.keras.utils.set_random_seed(0)
    a, b = tf.keras.Input((D,)), tf.keras.Input((D,))
    h = tf.keras.layers.Concatenate()([_Penalty()(tf.keras.layers.Dense(2)(a)), b])
    model = tf.keras.Model([a, b], tf.keras.layers.Dense(3)(h))
    x, y = small_data()
    with pytest.raises(ValueError, match="model.losses depends on the input data"):
        _fit(model, [x, x], y)


def test_sparse_and_deeply_ragged_inputs_are_refused_by_name():
    from tfdpbnn.optimizers import fit_checks

    sparse = tf.SparseTensorSpec([None, 4], tf.float32)
    with pytest.raises(ValueError, match="sparse inputs"):
        fit_checks._synthetic(sparse, 4, np.random.default_rng(0))
    deep = tf.RaggedTensorSpec([None, None, None], tf.float32, ragged_rank=2)
    with pytest.raises(ValueError, match="ragged rank 2"):
        fit_checks._synthetic(deep, 4, np.random.default_rng(0))


def test_float_ids_into_an_embedding_get_the_fix_and_integer_ids_train():
    """Float32 token ids reach an Embedding: on Keras 2 the pre-fit check names the layer and the fix
    (integer ids) instead of TensorFlow's out-of-range gather error; Keras 3 casts float ids, and they train
    there; the same ids as int32 train on both."""
    ids = np.random.default_rng(0).integers(0, 10, size=(N, 3))
    y = np.zeros(N, "int32")

    def model(dtype):
        tf.keras.utils.set_random_seed(0)
        inputs = tf.keras.Input((3,), dtype=dtype)
        h = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(10, 2, name="tokens")(inputs))
        return tf.keras.Model(inputs, tf.keras.layers.Dense(3)(h))

    if KERAS3:  # Keras 3's Embedding takes float ids (it casts them) and the pre-fit check runs through it
        assert _fit(model("float32"), ids.astype("float32"), y).privacy_statement()["epsilon"] > 0
    else:
        with pytest.raises(ValueError, match=r"Embedding layer\(s\) \['tokens'\] are fed float32 ids.*int32"):
            _fit(model("float32"), ids.astype("float32"), y)
    assert _fit(model("int32"), ids.astype("int32"), y).privacy_statement()["epsilon"] > 0


def _py_function_model(mix: bool):
    """x -> tf.py_function(f) -> Dense(3); f centres each batch over its examples when ``mix``."""
    tf.keras.utils.set_random_seed(0)

    def host(a):  # runs eagerly on the host, its gradient recorded on a tape of TensorFlow's
        return a - tf.reduce_mean(a, axis=0, keepdims=True) if mix else 2.0 * a

    inputs = tf.keras.Input((D,))
    h = tf.keras.layers.Lambda(
        lambda t: tf.ensure_shape(tf.py_function(host, [t], tf.float32), [None, D]))(inputs)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(3)(h))


def test_a_py_function_in_the_model_is_checked_like_any_other_layer():
    """A ``tf.py_function`` keeps its eager gradient for one backward pass; the per-example check takes
    several (outputs, then the loss), and its second used to fail with TensorFlow's bare ``UnknownError
    KeyError: b'pyfunc_N'``. The check now runs a new pass for it: a per-example host function trains,
    with the epsilon of its steps, and one that centres the batch is refused as mixing examples."""
    x, y = small_data()
    opt = _fit(_py_function_model(mix=False), x, y)
    statement = opt.privacy_statement()
    assert statement["guarantee"] is True
    # One pass over the data in shuffled batches: each example in one Gaussian release (dp-accounting).
    assert statement["steps"] == -(-N // 8) and opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 1),
                                                                               rel=1e-2)
    with pytest.raises(ValueError, match="a layer mixes examples of the batch"):
        _fit(_py_function_model(mix=True), x, y)
