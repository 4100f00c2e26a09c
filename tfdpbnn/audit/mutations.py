"""Deliberately broken variants of the DP mechanism, injected for audits only (mutation testing).

An audit that never sees a broken mechanism says nothing about its power. ``inject_bug(name)`` switches the
mechanism that every tfdpbnn optimizer runs (``tfdpbnn.optimizers.mechanism.DPMechanism``) to one of the
broken variants in ``MUTATIONS`` for the length of a ``with`` block, through a single module-level switch
(``_audit_hook.INJECTED``) read when a step is built; outside the block the mechanism is the honest
one. Nothing in the public optimizer API can set it, and its name says what it is: it exists so that
``tfdpbnn.audit.step_audit`` and the tests can show that each bug would be caught. Each variant keeps the
accounting of the honest mechanism (the claim does not change), as a shipped bug would. The noise variants
act on every noise draw; the clipping variants ("clip-1.5x", "double-count", "unclipped-layer") on
``DPMechanism.clip_model``, the path ``model.fit`` and ``dp_train_step`` take; the pipeline variants
("sample-rate-1.5x", "shard-overlap") on the batches a pipeline built inside the block draws, which the
sampling audit (``tfdpbnn.audit.sampling``) tests.
"""

from __future__ import annotations

import contextlib

#: name -> (what the mechanism does instead, its argument). The argument of "unclipped-layer" is the
#: class name of the layer type whose clipping is skipped (the audit passes its canary's layer type).
MUTATIONS = {
    "noise-2/3": ("the noise standard deviation is 2/3 of sigma C (1.5x sensitivity / noise)", 2 / 3),
    "clip-1.5x": ("examples are clipped to 1.5 C while the noise is calibrated to C", 1.5),
    "double-count": ("the last example of every batch is counted twice", True),
    "unclipped-layer": ("clipping is skipped for the variables of one layer type", None),
    "reused-seed": ("every noise draw comes from the same fixed seed (replayable noise)", True),
    "sample-rate-1.5x": ("the Poisson pipelines draw each example with probability 1.5 q while q is declared",
                         1.5),
    "shard-overlap": ("one example is placed in two replicas' shards (it can join two replicas' batches in "
                      "one step)", 0),
}
#: The variants that act on the data pipelines (the sampling audit's), the others on the mechanism (the step
#: audit's).
PIPELINE_MUTATIONS = ("sample-rate-1.5x", "shard-overlap")
STEP_MUTATIONS = tuple(name for name in MUTATIONS if name not in PIPELINE_MUTATIONS)


@contextlib.contextmanager
def inject_bug(name: str, argument=None):
    """FOR AUDITS ONLY: run the DP mechanism with the deliberately broken variant ``name`` inside the block.

    Args:
      name: a key of ``MUTATIONS``.
      argument: overrides the variant's argument (required for "unclipped-layer": a layer class name such as
        "Embedding" or "NoisyDense"; "sample-rate-1.5x": the factor on q; "shard-overlap": the index of the
        example that shard 0 holds and that is added to shard 1).

    Steps traced inside the block keep the bug (a ``tf.function`` traced here and called later still has
    it); build the steps, and the pipelines, you audit inside the block.
    """
    from tfdpbnn import _audit_hook

    if name not in MUTATIONS:
        raise ValueError(f"name must be one of {sorted(MUTATIONS)}, got {name!r}")
    value = MUTATIONS[name][1] if argument is None else argument
    if value is None:
        raise ValueError(f"argument: mutation {name!r} needs one (a layer class name)")
    if _audit_hook.INJECTED is not None:
        raise RuntimeError(f"a mutation is already injected: {_audit_hook.INJECTED[0]!r}")
    _audit_hook.INJECTED = (name, value)
    try:
        yield
    finally:
        _audit_hook.INJECTED = None


__all__ = ["MUTATIONS", "PIPELINE_MUTATIONS", "STEP_MUTATIONS", "inject_bug"]
