"""The fast tier's cut on the Keras 2 sets.

``./scripts/test --fast`` runs the tests not marked ``slow``. On the Keras 2 sets CI runs the full suite, so a
test a unit test already covers (a second parametrization of the same code, a fit that repeats a property
checked at the step) can be left to it: ``slow_on_keras2``. On the Keras 3 set CI runs only the fast tier,
so there such a test stays in it, and the Keras 3 path keeps the coverage it had.
"""

from __future__ import annotations

import pytest

from tfdpbnn import _keras_version

#: the marks for ``pytest.param(..., marks=SLOW_ON_KERAS2)``: ``slow`` on Keras 2, none on Keras 3
SLOW_ON_KERAS2 = [pytest.mark.slow] if _keras_version.KERAS_MAJOR == 2 else []


def slow_on_keras2(test):
    """Mark ``test`` ``slow`` on the Keras 2 sets (where CI runs the full suite); unmarked on Keras 3."""
    return pytest.mark.slow(test) if _keras_version.KERAS_MAJOR == 2 else test
