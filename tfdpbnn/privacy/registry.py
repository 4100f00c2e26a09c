"""Accountant registry: names -> factories, so training code can take an accountant by name.

"rdp" and "pld" are dp-accounting's own ``RdpAccountant`` (Mironov 2017; Mironov, Talwar & Zhang 2019) and
``PLDAccountant`` (Koskela et al. 2020; Doroshenko et al. 2022; pessimistic discretization, an upper
bound; ``AdaptivePLDAccountant`` picks its interval); "zcdp", "gdp", "ac" are tfdpbnn's. Every factory
takes ``neighboring_relation`` plus its own keyword arguments.
"""

from __future__ import annotations

from collections.abc import Callable

import dp_accounting
from dp_accounting import NeighboringRelation

from tfdpbnn._validation import check_choice
from tfdpbnn.privacy.advanced_composition import AdvancedCompositionAccountant
from tfdpbnn.privacy.gdp import GDPAccountant
from tfdpbnn.privacy.pld import AdaptivePLDAccountant
from tfdpbnn.privacy.zcdp import ZCDPAccountant

Factory = Callable[..., dp_accounting.PrivacyAccountant]
_FACTORIES: dict[str, Factory] = {}
_SOUND: dict[str, bool] = {}


def _rdp(neighboring_relation: NeighboringRelation = NeighboringRelation.ADD_OR_REMOVE_ONE,
         orders=None) -> dp_accounting.PrivacyAccountant:
    return dp_accounting.rdp.RdpAccountant(orders=orders, neighboring_relation=neighboring_relation)


def register_accountant(name: str, factory: Factory, *, sound: bool = False) -> None:
    """Register ``factory(neighboring_relation=..., **kwargs)`` under ``name``.

    ``sound=True`` declares that its epsilon is a guaranteed upper bound (listed by ``sound_accountants``).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string; got {name!r}")
    if not callable(factory):
        raise ValueError(f"factory must be callable; got {factory!r}")
    _FACTORIES[name] = factory
    _SOUND[name] = bool(sound)


def available_accountants() -> tuple[str, ...]:
    """Names accepted by ``get_accountant``, in registration order."""
    return tuple(_FACTORIES)


def sound_accountants() -> tuple[str, ...]:
    """Names whose epsilon is a guaranteed upper bound ("gdp" is approximate under subsampling: not here)."""
    return tuple(name for name in _FACTORIES if _SOUND[name])


def get_accountant(name: str, **kwargs) -> dp_accounting.PrivacyAccountant:
    """A fresh accountant by name; ``kwargs`` (e.g. ``neighboring_relation``, ``delta_prime``) go to it."""
    check_choice("accountant", name, available_accountants())
    return _FACTORIES[name](**kwargs)


register_accountant("rdp", _rdp, sound=True)
register_accountant("pld", AdaptivePLDAccountant, sound=True)
register_accountant("zcdp", ZCDPAccountant, sound=True)
register_accountant("gdp", GDPAccountant, sound=False)
register_accountant("ac", AdvancedCompositionAccountant, sound=True)
