"""Private hyperparameter search whose epsilon covers the search (Papernot & Steinke 2022).

``private_search`` runs candidate trainings through ``model.compile``/``model.fit`` with tfdpbnn DP
optimizers, scores them on a held-out private split with a noisy count, and returns the selected model, its
hyperparameters and one privacy statement for everything it did. ``tfdpbnn.tuning.bounds`` holds the Renyi-DP
bounds (random stopping, Theorems 2 and 6 of Papernot & Steinke; naive composition as the baseline).
"""

from tfdpbnn.tuning.bounds import (
    PoissonTrials,
    TruncatedNegativeBinomial,
    composed_rdp,
    selection_rdp,
    trial_rdp,
)
from tfdpbnn.tuning.search import SearchResult, calibrate_search, private_search

__all__ = ["PoissonTrials", "SearchResult", "TruncatedNegativeBinomial", "calibrate_search", "composed_rdp",
           "private_search", "selection_rdp", "trial_rdp"]
