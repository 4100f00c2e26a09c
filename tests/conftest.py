"""Test-wide fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_record_store(tmp_path, monkeypatch):
    """Every test gets its own privacy record store (never the user's ``~/.tfdpbnn``)."""
    monkeypatch.setenv("TFDPBNN_PRIVACY_STORE", str(tmp_path / "privacy_record.sqlite"))


@pytest.fixture(autouse=True)
def _fixed_seed_noise_keys(request, monkeypatch):
    """DP noise keys from a seed fixed per test instead of ``os.urandom``, so the suite's statistical tests
    of trained models are fixed-seed (and a failure a real change, not chance).

    The library draws every noise key from ``os.urandom`` (``tfdpbnn.privacy.noise._fresh_key``); here that
    one function returns draws of a generator seeded by the test's id. Tests marked ``os_entropy_noise``
    (``tests/test_run_owns_noise.py``) run the real ``os.urandom`` keys. Subprocesses are not patched.
    """
    if request.node.get_closest_marker("os_entropy_noise") is not None:
        return
    import zlib

    import numpy as np

    from tfdpbnn.privacy import noise

    rng = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
    monkeypatch.setattr(noise, "_fresh_key",
                        lambda: rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, size=2,
                                             dtype=np.int64))


@pytest.fixture
def per_example_checks(monkeypatch):
    """The models ``tfdpbnn.optimizers.fit_checks.check_per_example`` ran on, in order."""
    from tfdpbnn.optimizers import fit_checks

    ran = []
    original = fit_checks.check_per_example

    def counted(model, *args, **kwargs):
        ran.append(model)
        return original(model, *args, **kwargs)

    monkeypatch.setattr(fit_checks, "check_per_example", counted)
    return ran
