"""Keras preprocessing layers and DP training: refuse data-derived state, or adapt it privately.

``check_preprocessing`` runs before the first DP step (``fit``, ``train_on_batch``, ``begin_training``):
a preprocessing layer adapted on data is refused unless ``private_adapt_normalization`` adapted it or
``private_discretization`` built it (their Gaussian releases are composed into the privacy statement)
or ``assert_public_preprocessing`` declares it was adapted on public data (listed under
``asserted_by_user``).
"""

from tfdpbnn.preprocessing.checks import assert_public_preprocessing, check_preprocessing, data_derived_layers
from tfdpbnn.preprocessing.discretization import private_discretization
from tfdpbnn.preprocessing.normalization import calibrate_gaussian, private_adapt_normalization
from tfdpbnn.record.preprocessing import PreprocessingRecord

__all__ = ["PreprocessingRecord", "assert_public_preprocessing", "calibrate_gaussian", "check_preprocessing",
           "data_derived_layers", "private_adapt_normalization", "private_discretization"]
