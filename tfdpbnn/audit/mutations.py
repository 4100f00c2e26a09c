"""Deliberately broken variants of the DP mechanism, injected for audits only (mutation testing).

An audit that never sees a broken mechanism says nothing about its power. ``inject_bug(name)`` switches the
mechanism that every tfdpbnn optimizer runs (``tfdpbnn.optimizers.mechanism.DPMechanism``) to one of the
broken variants in ``MUTATIONS`` for the length of a ``with`` block, through a single module-level switch
(``mechanism._AUDIT_INJECTED_BUG``) read when a step is built; outside the block the mechanism is the honest
one. Nothing in the public optimizer API can set it, and its name says what it is: it exists so that
``tfdpbnn.audit.step_audit`` and the tests can show that each bug would be caught. Each variant keeps the
accounting of the honest mechanism (the claim does not change), as a shipped bug would. The noise variants
act on every noise draw; the clipping variants ("clip-1.5x", "double-count", "unclipped-layer") on
``DPMechanism.clip_model``, the path ``model.fit`` and ``dp_train_step`` take.
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
}


@contextlib.contextmanager
def inject_bug(name: str, argument=None):
    """FOR AUDITS ONLY: run the DP mechanism with the deliberately broken variant ``name`` inside the block.

    Args:
      name: a key of ``MUTATIONS``.
      argument: overrides the variant's argument (required for "unclipped-layer": a layer class name such as
        "Embedding" or "NoisyDense").

    Steps traced inside the block keep the bug (a ``tf.function`` traced here and called later still has
    it); build the steps you audit inside the block.
    """
    from tfdpbnn.optimizers import mechanism

    if name not in MUTATIONS:
        raise ValueError(f"name must be one of {sorted(MUTATIONS)}, got {name!r}")
    value = MUTATIONS[name][1] if argument is None else argument
    if value is None:
        raise ValueError(f"argument: mutation {name!r} needs one (a layer class name)")
    if mechanism._AUDIT_INJECTED_BUG is not None:
        raise RuntimeError(f"a mutation is already injected: {mechanism._AUDIT_INJECTED_BUG[0]!r}")
    mechanism._AUDIT_INJECTED_BUG = (name, value)
    try:
        yield
    finally:
        mechanism._AUDIT_INJECTED_BUG = None


__all__ = ["MUTATIONS", "inject_bug"]
