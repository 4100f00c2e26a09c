"""AUDIT-ONLY FAULT INJECTION: the one switch through which ``tfdpbnn.audit.inject_bug`` breaks the code.

``INJECTED`` is None in every real run. ``tfdpbnn.audit.mutations.inject_bug`` sets it, for the length of a
``with`` block, to ``(name, argument)`` of a deliberately broken variant (``tfdpbnn.audit.mutations.
MUTATIONS``), so an audit can show it would catch that bug. It is read through ``audit_bug`` only: by the DP
mechanism when a step is built (traced), and by the Poisson pipelines when they are built.
"""

from __future__ import annotations

from typing import Any

INJECTED: tuple[str, Any] | None = None


def audit_bug(name: str):
    """The argument of the injected audit bug ``name`` if that one is injected, else None (honest code)."""
    bug = INJECTED
    return None if bug is None or bug[0] != name else bug[1]
