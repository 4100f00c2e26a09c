"""Public data in DP training, at no privacy cost: pretraining, priors from a public fit, public selection.

Data that are public (released, not about the people the privacy statement protects) can be used freely:
``pretrain`` then private fine-tuning of the whole network or of its last layers (``freeze_layers``;
Tramer & Boneh 2021, De et al. 2022, Kurakin et al. 2022); ``set_priors_from_public_fit``, the Gaussian
priors of Bayes-by-Backprop layers set from their posterior fit on public data; ``select_on_public``,
hyperparameters chosen by training and scoring on public data. Each works with any public ``tf.data``
source (or arrays); the private run's privacy statement is unchanged, since nothing here reads private data.
"""

from tfdpbnn.public.pretraining import freeze_layers, pretrain
from tfdpbnn.public.priors import set_priors_from_public_fit
from tfdpbnn.public.selection import PublicSelection, select_on_public

__all__ = ["PublicSelection", "freeze_layers", "pretrain", "select_on_public", "set_priors_from_public_fit"]
