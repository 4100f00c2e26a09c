"""Test-wide fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_record_store(tmp_path, monkeypatch):
    """Every test gets its own privacy record store (never the user's ``~/.tfdpbnn``)."""
    monkeypatch.setenv("TFDPBNN_PRIVACY_STORE", str(tmp_path / "privacy_record.sqlite"))
