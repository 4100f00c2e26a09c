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

Seeds. Every draw is stateless from a 128-bit step seed (``step_seed``): by default a stateful
``tf.random`` draw (reproducible under ``tf.keras.utils.set_random_seed``); in secure mode
(``set_secure_mode``, as Opacus's ``secure_mode``) 128 fresh bits from the operating system's CSPRNG
(``os.urandom``) at every step, so the noise cannot be replayed from a seed, a checkpoint or another
worker's state. Philox (TensorFlow's generator) then expands the seed; it is a counter-based generator, not
a cryptographic one, with no known practical attack.

Replicas. Under ``tf.distribute`` (``gaussian_noise_like(..., across_replicas=True)``) the replica with
global id 0 draws the whole ``N(0, s^2)`` and the others add zeros; the optimizer's all-reduce SUMS the
replicas' gradients, so the update holds exactly one ``N(0, s^2)`` per coordinate and step, whatever seeds
the workers share. (Independent ``N(0, s^2 / R)`` shares on every replica would sum to the same law, but
need R independent streams and cost R draws of compute per step; on replicas that share cores, as logical
CPU devices do, that is R times the noise cost.)
"""

from __future__ import annotations

import math
import os

import numpy as np
import tensorflow as tf

_TWO_PI = np.float32(2.0 * math.pi)
#: Random 32-bit words the radius may use (drawn lazily: each word after the first only where the previous
#: ones were all 0). 4 words: radius at most 13.37 s, Gaussian tail left out < 1e-39 per coordinate.
RADIUS_WORDS = 4
_WORD_BITS = 32
_SECURE = False


def set_secure_mode(enabled: bool) -> None:
    """Turn secure mode on or off for every DP optimizer without a per-optimizer setting.

    Secure mode seeds each step's noise from ``os.urandom`` (128 bits) instead of TensorFlow's seeded
    generator (Opacus's ``secure_mode``). Read when a train step is traced: set it before ``model.fit`` (or
    recompile the model).
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


def step_seed(secure: bool | None = None, op_seed=None) -> tf.Tensor:
    """A fresh [2] int64 seed for one step's noise.

    ``secure`` (default: ``secure_mode()``): 16 bytes of ``os.urandom``, fetched at every call of the traced
    step; otherwise a stateful ``tf.random`` draw (op seed ``op_seed``), reproducible under the global seed.
    """
    secure = _SECURE if secure is None else secure
    if secure:
        seed = tf.py_function(lambda: np.frombuffer(os.urandom(16), dtype=np.int64).copy(), [], tf.int64)
        return tf.ensure_shape(seed, [2])
    return tf.random.uniform([2], minval=tf.int64.min, maxval=tf.int64.max, dtype=tf.int64, seed=op_seed)


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
                        across_replicas: bool = False):
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
      seed: None (a fresh ``step_seed``), an integer (op seed of that draw, with the global seed, as
        ``tf.random.normal``), or a [2] int64 tensor (a stateless seed).
      secure: with ``seed=None``, seed from ``os.urandom`` (default: ``secure_mode()``).
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
        step = step_seed(secure, op_seed=seed) if seed is None or isinstance(seed, int) else seed
        return _flat_noise(total, stddev, tf.cast(step, tf.int64))

    flat = draw() if replica is None else tf.cond(tf.equal(replica, 0), draw, lambda: tf.zeros([total]))
    pieces = tf.split(flat, sizes) if len(sizes) > 1 else [flat]
    return [tf.cast(tf.reshape(p, s), t.dtype) if t.dtype != tf.float32 else tf.reshape(p, s)
            for p, s, t in zip(pieces, shapes, tensors, strict=True)]


__all__ = ["RADIUS_WORDS", "exponential_variates", "gaussian_noise_like", "max_radius", "secure_mode",
           "set_secure_mode", "step_seed", "tail_reveal_probability"]
