"""The public registry of fast per-example clipping rules, one per layer type.

A rule tells the ghost engine (``tfdpbnn.clipping.ghost``) how to get a layer's per-example gradient norms
and its clipped gradient sum from tensors recorded during one forward pass (Goodfellow 2015, "Efficient
per-example gradient computations"; Li et al. 2022 ghost clipping; Bu et al. 2023 book-keeping). A layer's
per-example parameter gradient depends only on its own per-example input and on the per-example gradient of
the loss with respect to its output (the loss of example ``i`` depends on example ``i`` only, so the gradient
of ``sum_i L_i`` with respect to the output holds every example's output gradient in its own row).

Writing a rule for your own layer::

    class ScaleRule(tfdpbnn.clipping.ClippingRule):
        # layer computes y = x * scale, scale of shape [d]
        def variables(self, layer):
            return [layer.scale]

        def forward(self, layer, call, inputs, *args, **kwargs):
            outputs = call(inputs, *args, **kwargs)
            return outputs, [outputs], inputs          # outputs, taps, context

        def squared_norms(self, layer, context, grads):
            x, (g,) = context, grads                       # g = d(sum_i L_i) / d outputs
            return [tf.reduce_sum(tf.square(x * g), axis=1)]   # ||dL_i/dscale||^2, one per variable

        def clipped_sums(self, layer, context, grads, factors):
            x, (g,) = context, grads
            return [tf.reduce_sum(factors[:, None] * x * g, axis=0)]  # sum_i c_i dL_i/dscale

    tfdpbnn.clipping.register_rule(ScaleLayer, ScaleRule())

A rule registered for a class also covers its subclasses that do not override ``call`` (nor another of
the rule's ``layer_methods``, such as a convolution's ``convolution_op``); a subclass that overrides one
needs its own rule (otherwise the engine falls back to the jacobian path with a warning).
"""

from __future__ import annotations

import tensorflow as tf


class ClippingRule:
    """Base class of fast per-example clipping rules (see the module docstring for a worked example).

    The ghost engine calls, for each layer the rule covers:

    1. ``forward(layer, call, inputs, *args, **kwargs)`` in place of the layer's ``call`` during the engine's
       forward pass: it must return the same outputs as ``call(inputs, *args, **kwargs)`` (``call`` is the
       layer's original, unwrapped ``call``), the list of "tap" tensors whose loss gradient it needs (e.g. the
       pre-activation), and any context object (e.g. the inputs).
    2. ``squared_norms(layer, context, grads)``: ``grads[k]`` is the gradient of ``sum_i L_i`` with respect
       to ``taps[k]``; return one ``[batch]`` tensor per variable of ``variables(layer)``: the squared L2 norm
       of each example's gradient of that variable (or ``None`` for a variable that gets none).
    3. ``clipped_sums(layer, context, grads, factors)``: one tensor per variable, ``sum_i factors[i] *
       dL_i/dvariable``, shaped like the variable.
    """

    #: The layer's methods the rule's derivation assumes: a subclass of the registered class that overrides
    #: any of them computes something else and is not covered by this rule.
    layer_methods: tuple = ("call",)

    def variables(self, layer) -> list:
        """The trainable variables this rule produces gradients for (default: the layer's own)."""
        return list(layer.trainable_weights)

    def unsupported_reason(self, layer) -> str | None:
        """``None`` if the rule handles this layer's configuration, else a short reason (fallback)."""
        return None

    def call_unsupported_reason(self, layer, inputs, *args, **kwargs) -> str | None:
        """Checked at each call (e.g. on ``training``): a reason makes the engine fall back, else ``None``."""
        return None

    def forward(self, layer, call, inputs, *args, **kwargs):
        """Run the layer; return ``(outputs, taps, context)``."""
        raise NotImplementedError

    def squared_norms(self, layer, context, grads) -> list:
        """Per-variable ``[batch]`` squared per-example gradient norms."""
        raise NotImplementedError

    def clipped_sums(self, layer, context, grads, factors) -> list:
        """Per-variable clipped gradient sums ``sum_i factors[i] * dL_i/dvariable``."""
        raise NotImplementedError


_RULES: dict[type, ClippingRule] = {}
_UNSUPPORTED: dict[type, str] = {}


def register_rule(layer_class: type, rule: ClippingRule) -> None:
    """Register ``rule`` (a ``ClippingRule`` instance) for ``layer_class`` (replacing any earlier rule)."""
    if not isinstance(layer_class, type) or not issubclass(layer_class, tf.keras.layers.Layer):
        raise ValueError(f"layer_class must be a subclass of tf.keras.layers.Layer, got {layer_class!r}")
    if not isinstance(rule, ClippingRule):
        raise ValueError(f"rule must be a tfdpbnn.clipping.ClippingRule instance, got {rule!r}")
    _RULES[layer_class] = rule


def unregister_rule(layer_class: type) -> None:
    """Remove the rule registered for exactly ``layer_class`` (no error if there is none)."""
    _RULES.pop(layer_class, None)


def registered_rules() -> dict:
    """A copy of the registry: ``{layer_class: rule}``."""
    return dict(_RULES)


def rule_for(layer) -> ClippingRule | None:
    """The rule covering ``layer``: registered for its class, or for a base class whose methods it keeps.

    Those methods are the rule's ``layer_methods`` (``call``; a convolution's ``convolution_op`` too).
    """
    cls = type(layer)
    if cls in _RULES:
        return _RULES[cls]
    for base in cls.__mro__[1:]:
        rule = _RULES.get(base)
        if rule is not None and all(getattr(cls, name, None) is getattr(base, name, None)
                                    for name in getattr(rule, "layer_methods", ("call",))):
            return rule
    return None


def mark_unsupported(layer_class: type, reason: str) -> None:
    """Declare that a model containing ``layer_class`` needs the jacobian path (e.g. it mixes batch rows)."""
    if not isinstance(layer_class, type) or not issubclass(layer_class, tf.keras.layers.Layer):
        raise ValueError(f"layer_class must be a subclass of tf.keras.layers.Layer, got {layer_class!r}")
    _UNSUPPORTED[layer_class] = str(reason)


def unsupported_reason_for(layer) -> str | None:
    """The reason given to ``mark_unsupported`` for ``layer``'s class (or a base class), else ``None``."""
    for cls, reason in _UNSUPPORTED.items():
        if isinstance(layer, cls):
            return reason
    return None
