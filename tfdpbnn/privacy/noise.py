"""The Gaussian noise of a DP step: one fused, vectorized Box-Muller draw with untruncated tails.

DP-SGD (Abadi et al. 2016, Algorithm 1, "add noise") needs one N(0, s^2) number per trainable parameter per
step: 785k numbers for the DPVD paper's 784-1000-10 MLP. ``tf.random.normal`` draws them with a scalar
Box-Muller loop per element, which made the noise the largest cost of a DP step on CPU (docs/benchmarks.md).
Here the Box-Muller transform (Box & Muller 1958)

    z1 = r cos(2 pi u),  z2 = r sin(2 pi u),  r = s sqrt(2 E),  E ~ Exp(1),  u ~ U[0, 1)   (E = -log U')

runs as a handful of vectorized TensorFlow ops over one draw for all variables (the scale ``s`` folded into
the radius, computed once per pair), and the result is split into the variables' shapes.

Tails. The accountant assumes an exact Gaussian. A float32 uniform has 23 random bits, so ``E = -log(1 - u)``
from one stops at 23 log 2 and the noise at ``5.65 s``: an example whose clipped gradient (norm C) lies in one
coordinate would be revealed whenever the noise landed above ``5.65 s - C``. Here ``E`` is drawn from as many
random bits as its tail needs (``exponential_variates``): a 32-bit word ``w`` gives ``E = -log((w + 1/2)
2^-32)``; when ``w = 0`` (probability 2^-32) the draw continues with ``32 log 2 + E'``, ``E'`` from the next
word. That is exact by memorylessness: given ``U < 2^-32``, ``2^32 U`` is again uniform. With
``RADIUS_WORDS = 4`` words (128 bits) the largest attainable radius is ``s sqrt(2 (128 + 1) log 2) =
13.37 s`` (``max_radius``), and the Gaussian mass it leaves out, ``P(|Z| > 13.37) < 1e-39`` per coordinate
and step, is below any delta a privacy statement uses: for every sigma >= 0.5, an example whose clipped
gradient sits in one coordinate is revealed with probability ``<= exp(-(13.37 - 1/sigma)^2 / 2) < 1e-28``
per step (``tail_reveal_probability``). Each further word is drawn only when some pair's ``w`` is 0
(``tf.cond``), so the expected cost is one 32-bit word for the radius and one for the angle, as before.
Below the tail the radius is quantized on cells of probability 2^-32 (2^-23 with float32 uniforms), as
every floating-point sampler is (Mironov 2012); the accounting treats the noise as exact, like tf-privacy
and Opacus.

Seeds: what the noise depends on. Every draw is stateless from a 128-bit step seed (``step_seed``), made
inside the traced step, so every executed step draws fresh noise (none is frozen into the graph when the
step is traced). By default the step seed is a Philox hash of a run KEY and a step COUNTER, both held by a
``NoiseKey`` (``DPMechanism.noise_key``) in two variables that no checkpoint, ``get_config``, ``.keras``
file or SavedModel holds: the key is 16 bytes of ``os.urandom``, drawn when the mechanism is built and
again at the start of every run (``NoiseKey.new_run``: each ``fit``, ``train_on_batch`` and
``begin_training`` call of a DP optimizer), and the counter is incremented by the step itself. So the
noise depends on no seed a user or a library can set (``tf.keras.utils.set_random_seed``,
``tf.random.set_seed``, numpy's), and restoring a checkpoint (``BackupAndRestore``, ``tf.train.Checkpoint``)
or reloading a model does not replay it: a restore rewinds the optimizer, not the key or the counter. Two
processes forked after a key was drawn share it until their next run starts (``new_run``); a custom loop
that forks calls ``mechanism.new_run()`` in each child. Philox is a counter-based generator, not a
cryptographic one (no known practical attack): an observer who could recover the key from released noise
could predict the rest of that run's noise. Secure mode (``secure_mode=True``, or ``set_secure_mode``
process-wide, as Opacus's ``secure_mode``) closes that too: every step's seed is 128 fresh bits of
``os.urandom``, fetched by the step (a ``tf.py_function``, so not under XLA). The weight noise of the
noisy layers an ``SIDPOptimizer`` tracks is drawn from its mechanism's key too (``tfdpbnn.layers.noisy``).

Replayable noise, for debugging only: ``debug_noise_seed=<int>`` on a DP optimizer or ``DPMechanism`` makes
the key a function of that seed (and ``new_run`` keeps the key and the counter), so the noise of a fresh
optimizer is replayed exactly from the seed. Anyone who knows the seed can subtract the noise, so no
epsilon holds: the privacy statement then says ``"guarantee": false`` with the reason (``docs/privacy.md``).

Replicas. Under ``tf.distribute`` (``gaussian_noise_like(..., across_replicas=True)``) the replica with
global id 0 draws the whole ``N(0, s^2)`` and the others add zeros; the optimizer's all-reduce SUMS the
replicas' gradients, so the update holds exactly one ``N(0, s^2)`` per coordinate and step, whatever seeds
the workers share. (Independent ``N(0, s^2 / R)`` shares on every replica would sum to the same law, but
need R independent streams and cost R draws of compute per step; on replicas that share cores, as logical
CPU devices do, that is R times the noise cost.)
"""

from __future__ import annotations

import math
import numbers
import os

import numpy as np
import tensorflow as tf

from tfdpbnn import _private_api

_TWO_PI = np.float32(2.0 * math.pi)
#: Random 32-bit words the radius may use (drawn lazily: each word after the first only where the previous
#: ones were all 0). 4 words: radius at most 13.37 s, Gaussian tail left out < 1e-39 per coordinate.
RADIUS_WORDS = 4
_WORD_BITS = 32
_SECURE = False


def set_secure_mode(enabled: bool) -> None:
    """Turn secure mode on or off for every DP optimizer without a per-optimizer setting.

    Secure mode seeds each step's noise from ``os.urandom`` (128 fresh bits per step) instead of a Philox
    hash of the run's key and step counter (Opacus's ``secure_mode``). Read when a train step is traced:
    set it before ``model.fit`` (or recompile the model).
    """
    if not isinstance(enabled, bool):
        raise ValueError(f"enabled must be True or False, got {enabled!r}")
    global _SECURE
    _SECURE = enabled


def secure_mode() -> bool:
    """Whether the module-wide secure mode is on (``set_secure_mode``)."""
    return _SECURE


def max_radius(stddev: float = 1.0, words: int = RADIUS_WORDS) -> float:
    """The largest radius ``s sqrt(2 E)`` the sampler can produce: every word 0, ``E = (32 words + 1) log 2``.

    No coordinate of the noise exceeds it in absolute value.
    """
    return float(stddev) * math.sqrt(2.0 * (_WORD_BITS * words + 1) * math.log(2.0))


def tail_reveal_probability(noise_multiplier: float, words: int = RADIUS_WORDS) -> float:
    """Per-step probability that the radius cut reveals an example: ``P(R > r_max - 1/sigma)``.

    An example whose clipped gradient (norm C) lies in one coordinate shifts that coordinate of the noised
    sum by C; outputs beyond ``r_max sigma C`` exist only with it present. The radius
    R = |(z1, z2)| / (sigma C) is Rayleigh, ``P(R > t) = exp(-t^2 / 2)``, an upper bound for one coordinate.
    Summed over the steps an example takes part in, this is the delta the cut adds (Dwork & Roth 2014,
    Definition 2.4).
    """
    if not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier!r}")
    t = max(0.0, max_radius(1.0, words) - 1.0 / noise_multiplier)
    return math.exp(-t * t / 2.0)


def _seed_for(seed, stream):
    """Seed ``stream`` of a [2] int64 step seed: its second half XOR the stream index.

    Philox scrambles the whole 128-bit seed into key and counter, so distinct seeds give independent streams.
    """
    return tf.stack([seed[0], tf.bitwise.bitwise_xor(seed[1], tf.cast(stream, tf.int64))])


def exponential_variates(size, seed, words: int = RADIUS_WORDS, word_bits: int = _WORD_BITS,
                         stream: int = 0) -> tf.Tensor:
    """``size`` independent Exp(1) numbers (float32), their tail drawn from up to ``words`` random words.

    ``E = -log((w + 1/2) 2^-b)`` for a b-bit word w; where ``w = 0``, ``E = b log 2 + E'`` with ``E'`` from
    the next word (memorylessness of U[0, 1): given ``U < 2^-b``, ``2^b U`` is uniform). Only the last word's
    0 is cut, at ``E = (b words + 1) log 2``. ``word_bits < 32`` uses the top bits of each word (tests of the
    recursion).

    Args:
      size: number of variates (Python int).
      seed: [2] int64 stateless seed; word k uses stream ``stream + k`` of it.
      words: most words one variate may use (the tail is cut only when all are 0).
      word_bits: random bits per word (32; fewer only to test the recursion).
      stream: first stream of ``seed`` used.
    """
    def level(k):
        w = tf.random.stateless_uniform([size], seed=_seed_for(seed, stream + k), minval=None, maxval=None,
                                        dtype=tf.uint32)
        if word_bits < _WORD_BITS:
            w = tf.bitwise.right_shift(w, tf.constant(_WORD_BITS - word_bits, tf.uint32))
        e = -tf.math.log((tf.cast(w, tf.float32) + 0.5) * np.float32(2.0 ** -word_bits))
        if k + 1 == words:
            return e
        zero = tf.equal(w, 0)
        return tf.cond(tf.reduce_any(zero),
                       lambda: tf.where(zero, np.float32(word_bits * math.log(2.0)) + level(k + 1), e),
                       lambda: e)

    return level(0)


def _fresh_key() -> np.ndarray:
    """128 bits of ``os.urandom`` as a [2] int64 key."""
    return np.frombuffer(os.urandom(16), dtype=np.int64).copy()


def check_debug_noise_seed(value, secure_mode=None):
    """``debug_noise_seed`` as None or an int in [0, 2^63), else ``ValueError`` naming it.

    Also refused with ``secure_mode=True`` (replayable and per-step OS-entropy noise exclude each other).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) < 2 ** 63:
        raise ValueError("debug_noise_seed must be None (noise keyed from os.urandom, the default) or an "
                         f"integer in [0, 2**63) (replayable noise, no privacy guarantee); got {value!r}")
    if secure_mode:
        raise ValueError("debug_noise_seed: replayable noise and secure_mode=True exclude each other; give "
                         f"one (got debug_noise_seed={value!r} with secure_mode=True)")
    return int(value)


class NoiseKey:
    """Where a run's DP noise comes from: a 128-bit key and a step counter (see the module docstring).

    The two are ``tf.Variable`` held by this plain (not trackable) object, so no checkpoint or saved model
    holds them; they are created with ``synchronization=ON_READ`` so that under ``tf.distribute`` each
    replica keeps its own copy and the replica that draws the noise updates its counter alone.

    Args:
      debug_seed: None (default): the key is 16 bytes of ``os.urandom``, drawn now and at every
        ``new_run``. An integer in [0, 2^63): the key is ``[debug_seed, 0]`` and ``new_run`` changes
        nothing, so the noise is replayable from the seed (debugging only: no privacy guarantee).
    """

    def __init__(self, debug_seed=None):
        self.debug_seed = check_debug_noise_seed(debug_seed)
        key = _fresh_key() if self.debug_seed is None else np.array([self.debug_seed, 0], np.int64)
        with tf.init_scope():
            on_read = {"trainable": False, "synchronization": tf.VariableSynchronization.ON_READ,
                       "aggregation": tf.VariableAggregation.ONLY_FIRST_REPLICA}
            self._key = tf.Variable(key, dtype=tf.int64, name="dp_noise_key", **on_read)
            self._counter = tf.Variable(0, dtype=tf.int64, name="dp_noise_counter", **on_read)

    @property
    def replayable(self) -> bool:
        """Whether the noise is replayable from a seed (``debug_seed`` given)."""
        return self.debug_seed is not None

    def new_run(self) -> None:
        """Start a run: a fresh key from ``os.urandom`` (nothing with ``debug_seed``).

        The counter goes on from where it is: each step's seed is Philox of (key, counter), so a fresh
        uniformly random 128-bit key alone makes the run's seeds independent of every earlier run's, whatever
        the counter holds (one write per run start, not two).
        """
        if self.debug_seed is not None:
            return
        with tf.init_scope():
            _private_api.assign_now(self._key, _fresh_key())

    def next_seed(self) -> tf.Tensor:
        """The [2] int64 seed of the next draw: Philox of (key, counter + 1); increments the counter.

        Runs inside the traced step, so each execution of the step gets the next counter value.
        """
        count = self._counter.assign_add(1)
        key = tf.convert_to_tensor(self._key)
        return tf.random.stateless_uniform(
            [2], seed=tf.stack([key[0], tf.bitwise.bitwise_xor(key[1], count)]), minval=None, maxval=None,
            dtype=tf.int64)


_DEFAULT_KEY = None


def default_key() -> NoiseKey:
    """The process-wide ``NoiseKey`` of ``gaussian_noise_like`` calls without a key (from ``os.urandom``)."""
    global _DEFAULT_KEY
    if _DEFAULT_KEY is None:
        _DEFAULT_KEY = NoiseKey()
    return _DEFAULT_KEY


def step_seed(secure: bool | None = None, key: NoiseKey | None = None) -> tf.Tensor:
    """A fresh [2] int64 seed for one step's noise, made inside the traced step.

    ``secure`` (default: ``secure_mode()``): 16 bytes of ``os.urandom``, fetched at every execution of the
    step; otherwise ``key.next_seed()`` (``key`` default: ``default_key()``): a hash of a key from
    ``os.urandom`` and a step counter. Neither depends on a seed set in the process.
    """
    secure = _SECURE if secure is None else secure
    if secure:
        seed = tf.py_function(lambda: _fresh_key(), [], tf.int64)
        return tf.ensure_shape(seed, [2])
    return (default_key() if key is None else key).next_seed()


def _flat_noise(total, stddev, seed):
    """``total`` independent N(0, stddev^2) float32 numbers: Box-Muller over exact-tailed radii."""
    pairs = (total + 1) // 2
    # Streams of the seed: 0 .. RADIUS_WORDS - 1 the radius words, RADIUS_WORDS the angle.
    energy = exponential_variates(pairs, seed)
    radius = tf.sqrt(energy * (2.0 * tf.square(tf.cast(stddev, tf.float32))))
    angle = _TWO_PI * tf.random.stateless_uniform([pairs], seed=_seed_for(seed, RADIUS_WORDS))
    flat = tf.concat([radius * tf.cos(angle), radius * tf.sin(angle)], axis=0)
    return flat[:total] if 2 * pairs != total else flat


def gaussian_noise_like(tensors, stddev, seed=None, *, secure: bool | None = None,
                        across_replicas: bool = False, key: NoiseKey | None = None):
    """Independent N(0, stddev^2) noise shaped like each tensor of ``tensors`` (float32), in one draw.

    With ``across_replicas=True``, in a ``tf.distribute`` replica context with R > 1 replicas in sync
    (``MirroredStrategy``, ``MultiWorkerMirroredStrategy``): the replica with global id 0
    (``replica_id_in_sync_group``) draws the whole ``N(0, stddev^2)`` and every other replica returns zeros.
    The optimizers' all-reduce SUMS the replicas' gradients, so the update holds exactly one draw per global
    step, the single-device noise, whatever seeds the workers share (Opacus adds its noise on rank 0 the
    same way). Outside a replica context (no strategy, or a cross-replica call) this is the plain draw.

    Args:
      tensors: tensors (or variables) with fully defined static shapes; only their shapes and dtypes are
        used.
      stddev: scalar standard deviation (Python float or scalar tensor), >= 0.
      seed: None (a fresh ``step_seed``: DP noise), or a fixed seed, an integer or a [2] int64 tensor (a
        stateless seed: the same draw at every call; tests and debugging only).
      secure: with ``seed=None``, seed every draw from ``os.urandom`` (default: ``secure_mode()``).
      key: with ``seed=None`` and not secure, the ``NoiseKey`` the step seed comes from (default:
        ``default_key()``).
      across_replicas: add the noise on one replica only (above).

    Returns:
      one tensor per input, same shape and dtype.
    """
    tensors = list(tensors)
    if not tensors:
        return []
    shapes = []
    for t in tensors:
        if not t.shape.is_fully_defined():
            raise ValueError(f"tensors: gaussian_noise_like needs static shapes, got {t.shape} for {t!r}")
        shapes.append(t.shape)
    sizes = [int(s.num_elements()) for s in shapes]
    total = sum(sizes)

    def zeros():
        return [tf.zeros(s, t.dtype) for s, t in zip(shapes, tensors, strict=True)]

    if total == 0:
        return zeros()
    context = tf.distribute.get_replica_context() if across_replicas else None
    replica = None
    if context is not None and int(context.num_replicas_in_sync) > 1:
        replica = context.replica_id_in_sync_group
        if tf.get_static_value(replica) is not None:
            if int(tf.get_static_value(replica)) != 0:
                return zeros()
            replica = None

    def draw():
        if seed is None:
            step = step_seed(secure, key)
        elif isinstance(seed, numbers.Integral):
            step = tf.constant([int(seed), 0], tf.int64)
        else:
            step = seed
        return _flat_noise(total, stddev, tf.cast(step, tf.int64))

    flat = draw() if replica is None else tf.cond(tf.equal(replica, 0), draw, lambda: tf.zeros([total]))
    pieces = tf.split(flat, sizes) if len(sizes) > 1 else [flat]
    return [tf.cast(tf.reshape(p, s), t.dtype) if t.dtype != tf.float32 else tf.reshape(p, s)
            for p, s, t in zip(pieces, shapes, tensors, strict=True)]


__all__ = ["RADIUS_WORDS", "NoiseKey", "check_debug_noise_seed", "default_key", "exponential_variates",
           "gaussian_noise_like", "max_radius", "secure_mode", "set_secure_mode", "step_seed",
           "tail_reveal_probability"]
