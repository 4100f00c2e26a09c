"""What a training input declares about its sampling, and how tfdpbnn finds that declaration.

Privacy accounting of DP-SGD (Abadi et al. 2016) depends on how batches are drawn. tfdpbnn only trusts what it
built or what the user asserted by name:

- ``tfdpbnn.data.poisson_batches`` attaches a ``SamplingSpec(kind="poisson", ...)`` to the dataset it
  returns (verified: tfdpbnn drew the batches, and the realized batch sizes are tested during training);
- ``assert_sampling(dataset, ...)`` attaches a spec that the USER asserts for a pipeline tfdpbnn cannot
  inspect; the privacy statement then says "asserted by the user";
- arrays given to ``model.fit`` are shuffled and batched by Keras, one pass per epoch (verified by
  construction).

A spec survives ``Dataset.prefetch`` and ``Dataset.with_options`` (transformations that neither drop, add,
repeat nor reorder elements); any other transformation loses it, and a DP optimizer then refuses the input.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tfdpbnn import _private_api
from tfdpbnn._validation import check_choice, check_positive_int, check_sample_rate

#: Sampling schemes the accountants model (see ``tfdpbnn.privacy.budget``).
KINDS = ("poisson", "shuffle")

_ATTRIBUTE = "_tfdpbnn_sampling_spec"


@dataclasses.dataclass(frozen=True)
class SamplingSpec:
    """How the batches of one input were drawn.

    Attributes:
      kind: "poisson" (each example joins each batch independently with probability ``sample_rate``) or
        "shuffle" (passes over the data, each example at most once per pass).
      num_examples: n, the size of the private data set the batches are drawn from.
      sample_rate: q for "poisson"; None for "shuffle".
      source: "poisson_batches" (tfdpbnn drew the batches), "keras_arrays" (``model.fit`` on arrays) or
        "asserted_by_user" (``assert_sampling``).
      fixed_seed: True when a fixed, possibly known, seed chose the batches (``poisson_batches(seed=...,
        debug_fixed_seed=True)``): subsampling amplification then does not hold and the accounting treats
        every step as if every example took part.
      key_digest: for ``poisson_batches(secret_seed=K)``, a digest of K (``secret_seed_digest``; never K):
        every dataset made from K draws the same batches, so a DP run on it is written in the per-record
        ledger with this digest, and a later run on the same records from K again is refused. Else None.
      stream: with ``key_digest``, a random name of the dataset object (``secrets.token_hex``): training
        that object again goes on with its stream of draws (fresh batches), so the same stream is accepted.
    """

    kind: str
    num_examples: int
    sample_rate: float | None = None
    source: str = "asserted_by_user"
    fixed_seed: bool = False
    key_digest: str | None = None
    stream: str | None = None

    @property
    def sampler(self) -> tuple[str, str] | None:
        """``(key_digest, stream)`` of a dataset drawn from a user's ``secret_seed``, else None."""
        return None if self.key_digest is None else (self.key_digest, self.stream)

    def describe(self) -> str:
        """One line for the privacy statement."""
        text = {"poisson_batches": "Poisson batches drawn by tfdpbnn.data.poisson_batches",
                "keras_arrays": "arrays shuffled and batched by model.fit (one pass per epoch)",
                "asserted_by_user": "sampling asserted by the user (tfdpbnn.data.assert_sampling, or a "
                                    "poisson_batches secret_seed the user keeps secret)"}[self.source]
        if self.fixed_seed:
            text += "; fixed sampling seed (debug_fixed_seed): no subsampling amplification is claimed"
        return text


def tag(dataset: tf.data.Dataset, spec: SamplingSpec) -> tf.data.Dataset:
    """Attach ``spec`` to ``dataset`` (in place) and return it."""
    setattr(dataset, _ATTRIBUTE, spec)
    return dataset


def find_spec(dataset) -> SamplingSpec | None:
    """The spec attached to ``dataset`` or to the dataset it was made from by prefetch/with_options."""
    return _private_api.attached_attribute(dataset, _ATTRIBUTE)


def assert_sampling(dataset: tf.data.Dataset, sampling: str, num_examples: int,
                    sample_rate: float | None = None) -> tf.data.Dataset:
    """Declare, as the user, how ``dataset``'s batches are drawn; DP optimizers then account for that.

    tfdpbnn cannot see inside an arbitrary ``tf.data`` pipeline, so it refuses one unless its sampling is
    either built by tfdpbnn (``poisson_batches``) or asserted here. What is asserted:

    - ``sampling="shuffle"``: every iteration of ``dataset`` is one pass over ``num_examples`` private
      examples in which each example appears in at most one batch, and at most once in it. Epsilon then
      counts, for the most-exposed example, ``ceil(examples processed / num_examples)`` participations (the
      examples processed are counted during training, never derived from a declared batch size).
    - ``sampling="poisson"``: every batch is an independent Bernoulli(``sample_rate``) draw over all
      ``num_examples`` examples, with a seed nobody else knows. The realized batch sizes are still tested
      against Binomial(n, q) during training.

    The privacy statement records the assertion ("asserted by the user"). Returns ``dataset`` (tagged).
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise ValueError(f"dataset must be a tf.data.Dataset, got {type(dataset).__name__}")
    sampling = check_choice("sampling", sampling, KINDS)
    num_examples = check_positive_int("num_examples", num_examples)
    if sampling == "poisson":
        if sample_rate is None:
            raise ValueError("sample_rate is required with sampling='poisson' (q in (0, 1])")
        sample_rate = check_sample_rate("sample_rate", sample_rate)
    elif sample_rate is not None:
        raise ValueError(f"sample_rate: only for sampling='poisson'; got {sample_rate!r} with 'shuffle'")
    return tag(dataset, SamplingSpec(sampling, num_examples, sample_rate, "asserted_by_user", False))


__all__ = ["KINDS", "SamplingSpec", "assert_sampling", "find_spec", "tag"]
