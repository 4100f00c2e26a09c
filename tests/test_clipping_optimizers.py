"""Through ``model.compile``/``model.fit``: the optimizers' "auto" clipping takes the ghost engine (no
fallback warning) for every tfdpbnn layer type, and one DP step (sigma = 0, clipping active) moves the
weights exactly as the jacobian reference does."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tfdpbnn
import tfdpbnn.layers as L


@pytest.fixture(autouse=True)
def fixed_noise(monkeypatch):
    def normal(shape, mean=0.0, stddev=1.0, dtype=tf.float32, seed=None, name=None):
        return mean + stddev * tf.random.stateless_normal(shape, seed=[3, 7], dtype=dtype)

    monkeypatch.setattr(tf.random, "normal", normal)


def build(kind):
    tf.keras.utils.set_random_seed(0)   # before the layers: Keras 3 seeds each initializer when it is made
    public = np.random.default_rng(1).normal(size=(4, 5)).astype("float32")
    stacks = {
        "dpvd": [L.DenseVariational(6, num_examples=32, activation="relu"),
                 L.DenseVariational(3, num_examples=32)],
        "bbp": [L.DenseBayesByBackprop(6, num_examples=32, activation="relu"),
                L.MCDropout(0.2, gaussian=True), L.DenseBayesByBackprop(3, num_examples=32)],
        "sidp": [L.PublicBatchNormalization(public_batch=public), L.NoisyDense(6, noise_stddev=0.1),
                 tf.keras.layers.LayerNormalization(), L.NoisyDense(3)],
    }
    return tf.keras.Sequential([tf.keras.Input((5,)), *stacks[kind]])


# The fast tier keeps one fit-level run (the ghost dispatch through fit); each rule's ghost = jacobian
# equivalence is tested directly in test_clipping_ghost.py.
@pytest.mark.parametrize("kind", ["dpvd", pytest.param("bbp", marks=pytest.mark.slow),
                                  pytest.param("sidp", marks=pytest.mark.slow)])
def test_fit_uses_ghost_and_matches_jacobian_step(kind):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 5)).astype("float32")
    y = rng.integers(0, 3, 16)
    weights = {}
    for method in ("auto", "jacobian"):
        model = build(kind)
        opt = tfdpbnn.DPSGDOptimizer(0.05, 0.0, learning_rate=0.5, num_examples=16, batch_size=16,
                                     clipping_method=method)
        model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*falling back.*")
            model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
        weights[method] = model.get_weights()
    moved = False
    for a, r, w0 in zip(weights["auto"], weights["jacobian"], build(kind).get_weights(), strict=True):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-6)
        moved = moved or not np.allclose(a, w0)
    assert moved


def test_a_float64_model_is_clipped_as_the_float32_one():
    # Clipping factors were min(1.0, C / norm) with a float32 literal: a float64 layer (dtype="float64", or
    # tf.keras.backend.set_floatx("float64")) failed in the DP step with a TypeError.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 5)).astype("float32") * 10.0   # every example's gradient norm above C
    y = rng.integers(0, 3, 16)
    start = [rng.normal(size=(5, 3)), rng.normal(size=3)]
    weights = {}
    for dtype in ("float32", "float64"):
        for method in ("auto", "jacobian"):
            model = tf.keras.Sequential([tf.keras.Input((5,)), tf.keras.layers.Dense(3, dtype=dtype)])
            model.set_weights([w.astype(dtype) for w in start])
            opt = tfdpbnn.DPSGDOptimizer(0.05, 0.0, learning_rate=0.5, num_examples=16, batch_size=16,
                                         clipping_method=method)
            model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
            assert all(w.dtype == np.dtype(dtype) for w in model.get_weights())
            weights[dtype, method] = [w.astype("float64") for w in model.get_weights()]
            moved = np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(weights[dtype, method], start,
                                                                       strict=True)))
            assert 0.0 < moved <= 0.5 * 0.05 * (1 + 1e-4)   # learning rate x C: the mean of clipped gradients
    for method in ("auto", "jacobian"):
        for a, b in zip(weights["float64", method], weights["float32", method], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("order", [("float64", "float32"), ("float32", "float64")])
def test_a_model_mixing_float64_and_float32_layers_is_clipped_as_the_float32_one(order):
    # Sequential([Input((4,)), Dense(5, dtype="float64"), Dense(3)]) (or reversed) failed in the DP step with
    # a TypeError: tf.add_n of the layers' squared norms, float64 and float32.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 4)).astype("float32") * 10.0   # every example's gradient norm above C
    y = rng.integers(0, 3, 16)
    start = [rng.normal(size=(4, 5)), rng.normal(size=5), rng.normal(size=(5, 3)), rng.normal(size=3)]
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def build(dtypes):
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(5, dtype=dtypes[0]),
                                     tf.keras.layers.Dense(3, dtype=dtypes[1])])
        model.set_weights([w.astype(dtypes[i // 2]) for i, w in enumerate(start)])
        return model

    for method in ("auto", "jacobian"):
        weights = {}
        for dtypes in (order, ("float32", "float32")):
            model = build(dtypes)
            opt = tfdpbnn.DPSGDOptimizer(0.05, 0.0, learning_rate=0.5, num_examples=16, batch_size=16,
                                         clipping_method=method)
            model.compile(optimizer=opt, loss=loss)
            model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
            assert [w.dtype for w in model.get_weights()] == [np.dtype(dtypes[i // 2]) for i in range(4)]
            weights[dtypes] = [w.astype("float64") for w in model.get_weights()]
            moved = np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(weights[dtypes], start, strict=True)))
            assert 0.0 < moved <= 0.5 * 0.05 * (1 + 1e-4)   # learning rate x C: the mean of clipped gradients
        for a, b in zip(weights[order], weights["float32", "float32"], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
        model = build(order)   # with noise: each variable's update in its own dtype
        model.compile(optimizer=tfdpbnn.DPSGDOptimizer(0.05, 1.0, learning_rate=0.5, num_examples=16,
                                                       batch_size=16, clipping_method=method), loss=loss)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
        assert all(np.isfinite(w).all() for w in model.get_weights())
        assert [w.dtype for w in model.get_weights()] == [np.dtype(order[i // 2]) for i in range(4)]
