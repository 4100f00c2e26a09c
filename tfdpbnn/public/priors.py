"""Priors of Bayesian layers from a posterior fit on public data (empirical Bayes on public data)."""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn._validation import check_real


def _bbp_layers(model):
    from tfdpbnn.layers import DenseBayesByBackprop

    return [layer for layer in model.layers if isinstance(layer, DenseBayesByBackprop)]


def set_priors_from_public_fit(model: tf.keras.Model, public_model: tf.keras.Model,
                               scale_multiplier: float = 1.0, *, public_reason=None) -> int:
    """Set each Bayes-by-Backprop layer's prior of ``model`` to the posterior of ``public_model``'s layer.

    Blundell et al. (2015) priors, N(loc, scale^2) per weight, with loc = mu and scale = ``scale_multiplier``
    * softplus(rho) of the corresponding ``DenseBayesByBackprop`` layer (same order, same shapes) of a model
    trained on public data (e.g. with ``pretrain``). ``scale_multiplier`` > 1 widens the prior (the public
    fit is of other data). The KL term of the ELBO then uses this prior; as a function of public data only it
    costs no privacy. Returns the number of layers set. DenseVariational's log-uniform prior (Molchanov et al.
    2017) has no parameters to set: use ``pretrain`` for variational-dropout models. ``public_reason``
    (required): which public data ``public_model`` was trained on; each layer's ``set_prior`` asserts it
    (listed under ``asserted_by_user`` in the privacy statement).
    """
    scale_multiplier = check_real("scale_multiplier", scale_multiplier, low=0.0, low_open=True)
    targets, sources = _bbp_layers(model), _bbp_layers(public_model)
    if not targets:
        raise ValueError("model has no DenseBayesByBackprop layer: there is no Gaussian prior to set")
    if len(targets) != len(sources):
        raise ValueError(f"public_model must have as many DenseBayesByBackprop layers as model: "
                         f"{len(sources)} != {len(targets)}")
    for target, source in zip(targets, sources, strict=True):
        if target.kernel_mu.shape != source.kernel_mu.shape or target.use_bias != source.use_bias:
            raise ValueError(f"layer {source.name} of public_model does not match {target.name} of model "
                             f"(kernel {source.kernel_mu.shape} vs {target.kernel_mu.shape}, use_bias "
                             f"{source.use_bias} vs {target.use_bias})")
        kernel_loc, kernel_scale, bias_loc, bias_scale = source.posterior()
        target.set_prior(kernel_loc, scale_multiplier * kernel_scale, bias_loc,
                         None if bias_scale is None else scale_multiplier * bias_scale,
                         public_reason=public_reason)
    return len(targets)
