"""The weights' identity (``tfdpbnn.record.store.weights_fingerprint``): every bit and variable, any process.

The identity is SHA-256 over each variable's dtype, shape and XXH3-128 of its exact bytes; the per-variable
float16/bfloat16 keys come from one traced call (FarmHash64 by ``tf.fingerprint``). ``reference_identity``
recomputes the identity independently (array by array, from ``get_weights()``). Stores written before it
hold earlier identities (``legacy_weights_fingerprints``: FarmHash64 rows, "v2"; SHA-256 of the bytes
before that): their weights are still found.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import xxhash
from _small_runs import DELTA, LOSS, small_data, small_model

import tfdpbnn
from tfdpbnn.record import store
from tfdpbnn.record.ledger import Phase, PrivacyLedger


def reference_identity(arrays) -> str:
    """The identity of ``arrays`` as ``weights_fingerprint`` defines it, computed array by array."""
    digest = hashlib.sha256(b"tfdpbnn weights identity v3: XXH3-128 of each variable's bytes, its dtype and "
                            b"shape\n")
    for array in arrays:
        array = np.array(array, copy=True, order="C")  # a 0-d array stays 0-d
        row = xxhash.xxh3_128(array.tobytes(), seed=0).digest()
        digest.update(f"{tf.as_dtype(array.dtype).name}{array.shape}:".encode() + row)
    return "weights:v3:" + digest.hexdigest()


def reference_v2_keys(arrays) -> list[str]:
    """The "v2" keys of the float arrays (all of a small array's values): FarmHash64 of their roundings."""
    keys = []
    for array in arrays:
        if np.issubdtype(np.asarray(array).dtype, np.floating):
            shape = "x".join(str(d) for d in np.shape(array))
            wide = tf.constant(np.asarray(array, np.float32).reshape(1, -1))
            keys += [f"variable:{name}:{shape}:" + bytes(tf.fingerprint(
                tf.bitcast(tf.cast(wide, dtype), tf.uint8)).numpy()[0]).hex()
                for name, dtype in (("f16s", tf.float16), ("bf16s", tf.bfloat16))]
    return keys


def reference_v2_identity(arrays) -> str:
    """The "v2" identity (FarmHash64 rows, eagerly: one ``tf.fingerprint`` per array)."""
    digest = hashlib.sha256(b"tfdpbnn weights identity: FarmHash64 of each variable's bytes, its dtype and "
                            b"shape\n")
    for array in arrays:
        array = np.array(array, copy=True, order="C")
        raw = (array.astype(np.uint8) if array.dtype == bool else array).reshape(1, -1).view(np.uint8)
        row = tf.fingerprint(tf.constant(raw)).numpy()[0]
        digest.update(f"{tf.as_dtype(array.dtype).name}{array.shape}:".encode() + row.tobytes())
    return "weights:v2:" + digest.hexdigest()


class _Counter(tf.keras.layers.Layer):
    """A layer holding an int64 counter and a bool flag (non-float weights are part of the identity)."""

    def build(self, input_shape):
        self.count = self.add_weight(name="count", shape=(), dtype="int64", initializer="zeros",
                                     trainable=False)
        self.flag = self.add_weight(name="flag", shape=(2,), dtype="bool", initializer="zeros",
                                    trainable=False)

    def call(self, inputs):
        return inputs


def _model_with_counter():
    tf.keras.utils.set_random_seed(0)
    return tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3), _Counter()])


def test_the_identity_is_every_bit_of_every_variable():
    """Equal to the independent reference; changed by one ulp, a sign of zero, an int counter, a bool."""
    model = _model_with_counter()
    first = store.weights_fingerprint(model)
    assert first == reference_identity(model.get_weights())
    assert store.weights_fingerprint(model) == first  # the held copy's identity, reused
    kernel, bias, count, flag = model.weights
    changes = [
        (kernel, lambda k: np.where(np.arange(k.size).reshape(k.shape) == 5,
                                    np.nextafter(k, np.float32(np.inf)), k).astype(np.float32)),
        (bias, lambda b: np.where(np.arange(3) == 1, np.float32(-0.0), b).astype(np.float32)),  # +0.0 before
        (count, lambda c: np.int64(c + 1)),
        (flag, lambda f: np.array([False, True])),
    ]
    seen = {first}
    for variable, change in changes:
        saved = variable.numpy()
        variable.assign(change(saved))
        changed = store.weights_fingerprint(model)
        assert changed == reference_identity(model.get_weights()) and changed not in seen, variable.name
        seen.add(changed)
        variable.assign(saved)
        assert store.weights_fingerprint(model) == first
    # The float keys (one pair per float variable) come from the same call, for the same bytes.
    identity, keys = store.weights_identity(model)
    assert identity == first and keys == store.variable_fingerprints(model) and len(keys) == 4
    assert keys[:2] == reference_keys(kernel.numpy(), "4x3")  # 12 values: every one


def reference_keys(values, shape: str) -> list[str]:
    """The two keys of float ``values`` (all of them read): TensorFlow's roundings, hashed by XXH3-64."""
    wide = tf.constant(np.asarray(values, np.float32).reshape(-1))
    return [f"variable:{name}:{shape}:" + xxhash.xxh3_64_hexdigest(
        tf.bitcast(tf.cast(wide, dtype), tf.uint16).numpy().astype("<u2").tobytes())
        for name, dtype in (("f16x", tf.float16), ("bf16x", tf.bfloat16))]


def test_the_keys_round_as_tensorflow_does_and_make_nans_zeros_and_subnormals_canonical():
    """Keys at the rounding edges equal TensorFlow's roundings; NaNs and subnormals do not split keys.

    Values halfway between two float16 and two bfloat16 values (ties to even, both ways), the largest
    finite float32 (bfloat16 overflows to infinity), infinities; then a variable holding NaNs with other
    payloads and signs, subnormals and -0.0 has the keys of the same variable holding one NaN and +0.0
    (keys may only over-count: a copy rounded by a kernel that flushes subnormals is found).
    """
    f16_tie = np.float32(1.0) + np.float32(2.0 ** -11)  # halfway between 1 and 1 + 2^-10: to 1
    f16_tie_up = np.float32(1.0) + np.float32(3 * 2.0 ** -11)  # halfway: to 1 + 2^-9 (even)
    bf16_tie = np.float32(1.0) + np.float32(2.0 ** -8)
    bf16_tie_up = np.float32(1.0) + np.float32(3 * 2.0 ** -8)
    edges = np.array([f16_tie, f16_tie_up, bf16_tie, bf16_tie_up, -bf16_tie_up, np.finfo(np.float32).max,
                      -np.finfo(np.float32).max, np.inf, -np.inf, 65520.0, 1e-3, 0.1, 3.0, -7.25], np.float32)
    assert store._rounding_keys(edges, (14,)) == reference_keys(edges, "14")
    nan_bits = np.array([0x7FC00000, 0xFFC00001, 0x7F800001, 0x7FFFFFFF], np.uint32).view(np.float32)
    odd = np.concatenate([nan_bits, np.array([1e-45, -1e-40, -0.0, 1e-39], np.float32), edges])
    plain = np.concatenate([np.full(4, np.nan, np.float32), np.zeros(4, np.float32), edges])
    assert store._rounding_keys(odd, (22,)) == store._rounding_keys(plain, (22,))
    assert store._rounding_keys(plain, (22,)) == reference_keys(plain, "22")
    # float64 and bfloat16 values are taken to float32 first: a float64 copy has the float32 keys.
    assert store._rounding_keys(edges.astype(np.float64), (14,)) == store._rounding_keys(edges, (14,))


def test_xxh3_128_is_the_value_it_was():
    """XXH3-128 (seed 0) of fixed bytes is pinned: an xxhash that changed it would change every identity.

    The empty input's value is the one the xxHash specification's reference implementation gives
    (0x99aa06d3014798d86001c324468d497f); the bytes 0..15 are pinned as this library's identity reads them
    (``_exact_digest``: the canonical big-endian bytes).
    """
    assert store._exact_digest(np.zeros(0, np.uint8)).hex() == "99aa06d3014798d86001c324468d497f"
    assert store._exact_digest(np.arange(16, dtype=np.uint8)).hex() == "72950631827607e2842812cc870dcae2"
    # Every dtype by its bytes in C order: the same bytes as a float32 array and as its transpose's copy.
    values = np.arange(16, dtype=np.uint8).view(np.float32).reshape(2, 2)
    assert store._exact_digest(values).hex() == "72950631827607e2842812cc870dcae2"
    assert store._exact_digest(np.asfortranarray(values)).hex() == "72950631827607e2842812cc870dcae2"


def test_farmhash64_is_the_value_it_was():
    """``tf.fingerprint`` of fixed bytes is pinned: a TensorFlow that changed it would change every identity.

    FarmHash documents its fingerprint functions as stable across platforms and versions; TensorFlow's
    documentation of ``tf.fingerprint`` (FarmHash64, little-endian bytes) does not promise it. The value is
    FarmHash's ``Fingerprint64`` of the bytes 0..15 (the same from the pyfarmhash bindings, little-endian).
    """
    data = tf.constant(np.arange(16, dtype=np.uint8).reshape(1, -1))
    assert bytes(tf.fingerprint(data).numpy()[0]).hex() == "d45641a3a025fd0e"


def test_the_identity_is_the_same_in_another_process():
    """The same weights (set from fixed arrays) have the same identity and keys in a fresh process."""
    code = ("import numpy as np, tfdpbnn, tensorflow as tf\n"
            "from tfdpbnn.record import store\n"
            "m = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])\n"
            "rng = np.random.default_rng(7)\n"
            "m.set_weights([rng.normal(size=w.shape).astype(np.float32) for w in m.get_weights()])\n"
            "identity, keys = store.weights_identity(m)\n"
            "print(identity, *keys)\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         check=True).stdout.split()
    model = small_model()
    rng = np.random.default_rng(7)
    model.set_weights([rng.normal(size=w.shape).astype(np.float32) for w in model.get_weights()])
    identity, keys = store.weights_identity(model)
    assert out == [identity, *keys]


def test_a_write_after_the_last_epoch_end_is_still_seen():
    """A callback's write in ``on_train_end`` (after the epoch end's key and the final snapshot): refused."""

    class WriteAtTrainEnd(tf.keras.callbacks.Callback):
        def on_train_end(self, logs=None):
            bias = self.model.weights[1]
            bias.assign(bias + 1e-3)

    x, y = small_data(16)
    model = small_model()
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=16, batch_size=8, delta=DELTA,
                                                   allow_exceeding_budget=True), loss=LOSS)
    with pytest.raises(ValueError, match="changed after the last DP step of fit"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[WriteAtTrainEnd()])


@pytest.mark.parametrize("earlier", ["v2", "sha256", "v2 keys"])
def test_weights_an_earlier_store_recorded_by_an_earlier_identity_are_still_found(monkeypatch, earlier):
    """A store row with an earlier identity (FarmHash64 rows, "v2"; or SHA-256 of the bytes), or only the
    earlier keys of the model's variables (FarmHash64 of their roundings: a layer copied by value), is found.

    A model loaded from those weights inherits the row's phases before its first step (its statement does
    not start from zero); the earlier identities are computed only when the new one is not in the store and
    the store holds earlier identities.
    """
    trained = small_model(seed=3)
    record = store.default_store()
    phase = Phase(kind="participations", noise_multiplier=1.1, neighboring="add_or_remove", steps=40,
                  participations=5, examples=320, num_examples=64)
    run = record.begin_run("data:earlier", "weights:" + "0" * 64, phase)
    identities, keys = store.legacy_weights_fingerprints(trained)
    assert identities == [reference_v2_identity(trained.get_weights()),
                          "weights:" + store._hash_arrays(trained.get_weights())]
    assert keys == reference_v2_keys(trained.get_weights())
    if earlier == "v2 keys":  # another model's identity; the kernel's keys (a copied layer)
        record.snapshot(run, "weights:v2:" + "1" * 64, phase, PrivacyLedger([phase]), final=True,
                        variables=keys[:2])
    else:  # as an earlier version wrote it
        record.snapshot(run, identities[0] if earlier == "v2" else identities[1], phase,
                        PrivacyLedger([phase]), final=True)

    def never():
        raise AssertionError("the earlier identity was computed although it was not needed")

    # Not found by the new identity, nor by the new keys: found by the earlier identity or keys.
    identity, new_keys = store.weights_identity(trained)
    assert record.weights_record(identity, variables=new_keys) == []
    found = record.weights_record(identity, variables=new_keys,
                                  legacy=lambda: store.legacy_weights_fingerprints(trained))
    assert [p.phase_id for p in found] == [phase.phase_id]
    # The ledger of these exact weights: by an identity only (a copied layer's keys are not these weights).
    exact = record.weights_ledger(identity, legacy=lambda: store.legacy_weights_fingerprints(trained))
    assert (exact is None) == (earlier == "v2 keys")
    loaded = small_model(seed=4)
    loaded.set_weights(trained.get_weights())
    x, y = small_data(16)
    loaded.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.1, 1.0, num_examples=16, batch_size=8, delta=DELTA,
                                                    allow_exceeding_budget=True), loss=LOSS)
    loaded.fit(x, y, batch_size=8, epochs=1, verbose=0)
    ledger = loaded.optimizer.ledger
    assert phase.phase_id in [p.phase_id for p in ledger.phases]
    assert ledger.epsilon(DELTA) > PrivacyLedger([phase]).epsilon(DELTA)
    # A store holding no earlier identity never computes one.
    monkeypatch.setenv(store.ENV_VAR, os.path.join(os.path.dirname(record.path), "fresh.sqlite"))
    fresh = store.default_store()
    assert fresh.weights_record(store.weights_fingerprint(trained), legacy=never) == []
    assert fresh.weights_ledger(store.weights_fingerprint(trained), legacy=never) is None


def test_distributed_weights_have_the_identity_of_the_same_plain_weights():
    """Mirrored variables (read through ``get_weights``; Keras 3's wrap them): the same identity and keys."""
    plain = small_model()
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        mirrored = small_model()
    mirrored.set_weights(plain.get_weights())
    assert store.weights_identity(mirrored) == store.weights_identity(plain)
    assert store.weights_fingerprint(mirrored) == reference_identity(plain.get_weights())


def test_identities_held_for_a_few_models_are_reused_and_bounded(monkeypatch):
    """Models fingerprinted in turn are each hashed once; at most ``_HELD_WEIGHTS_MAX`` entries are held."""
    monkeypatch.setattr(store, "_HELD_WEIGHTS", {})
    hashed = []
    identify = store._identity_and_keys
    monkeypatch.setattr(store, "_identity_and_keys", lambda *a: hashed.append(1) or identify(*a))
    models = [small_model(seed=seed) for seed in range(store._HELD_WEIGHTS_MAX + 1)]
    identities = [reference_identity(m.get_weights()) for m in models]
    for _ in range(3):
        assert [store.weights_fingerprint(m) for m in models[:2]] == identities[:2]
    assert len(hashed) == 2
    assert [store.weights_fingerprint(m) for m in models] == identities
    assert len(hashed) == len(models) and len(store._HELD_WEIGHTS) == store._HELD_WEIGHTS_MAX
    assert store.weights_fingerprint(models[2]) == identities[2] and len(hashed) == len(models)
    assert store.weights_fingerprint(models[0]) == identities[0]  # the least recently used: dropped
    assert len(hashed) == len(models) + 1


def test_keys_of_a_large_variable_round_its_values_at_fixed_positions_and_find_its_rounded_copies():
    """Over ``KEY_VALUES`` values, the keys round the values at flat positions floor(i n / k).

    Equal to a reference that picks those positions in numpy; a float16 and a bfloat16 copy of the variable
    have its keys (a rounded copy rounds alike); a value changed at a position the keys do not read changes
    the identity and not the keys (two such variables would share keys: an over-count, never a missed copy).
    """
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(50)])
    kernel = model.weights[0].numpy()
    n, k = kernel.size, store.KEY_VALUES
    assert n > k
    picked = kernel.reshape(-1)[np.arange(k) * n // k]
    identity, keys = store.weights_identity(model)
    assert keys[:2] == reference_keys(picked, "64x50")
    copy = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(50)])
    for dtype, index in ((tf.float16, 0), (tf.bfloat16, 1)):
        copy.set_weights([tf.cast(tf.cast(w, dtype), tf.float32).numpy() for w in model.get_weights()])
        assert store.weights_identity(copy)[1][index] == keys[index]
    unread = int(np.setdiff1d(np.arange(n), np.arange(k) * n // k)[0])
    changed = kernel.copy().reshape(-1)
    changed[unread] += 1.0
    copy.set_weights([changed.reshape(kernel.shape), model.weights[1].numpy()])
    assert store.weights_identity(copy)[0] != identity and store.weights_identity(copy)[1][:2] == keys[:2]
