"""Shared traversal of ``dp_accounting`` events for tfdpbnn's own accountants.

Event convention (the same as dp-accounting's RdpAccountant and PLDAccountant): a ``GaussianDpEvent``'s
``noise_multiplier`` is the noise standard deviation divided by the L2 sensitivity Delta of the released
sum under the accountant's neighbouring relation. ``tfdpbnn.privacy.compute_epsilon`` builds events with
Delta = C (clip norm) for add/remove and Delta = 2C for replace-one.

Domain edges follow dp-accounting's ``PrivacyAccountant`` contract (the values its RDP and PLD accountants
return): with nothing private composed, epsilon is 0 at every delta in [0, 1] and delta 0 at every epsilon
in [0, inf]; after a non-private event, epsilon is inf and delta 1. Otherwise every composed mechanism is a
Gaussian or a subsampled Gaussian, which is (0, 1)-DP and (inf, 0)-DP but eps-DP for no finite eps:
``get_epsilon(1) = 0``, ``get_epsilon(0) = inf``, ``get_delta(inf) = 0``.
"""

from __future__ import annotations

import abc
import math
from typing import TypeAlias

import dp_accounting
from dp_accounting import NeighboringRelation
from dp_accounting.privacy_accountant import PrivacyAccountant

from tfdpbnn._validation import check_nonnegative_or_inf, check_real

_Details: TypeAlias = PrivacyAccountant.CompositionErrorDetails


class EventAccountant(PrivacyAccountant, metaclass=abc.ABCMeta):
    """Base class: walks NoOp/NonPrivate/Composed/SelfComposed events and dispatches the leaves.

    Subclasses implement ``_add_gaussian(sigma, count)`` and ``_add_poisson_gaussian(q, sigma, count)``, and
    ``_epsilon(delta)`` for delta in (0, 1) and ``_delta(epsilon)`` for finite epsilon >= 0, called only once
    a private event was composed; ``get_epsilon``/``get_delta`` check the argument and answer the domain
    edges (module docstring). Poisson-subsampled Gaussians are only supported under add/remove adjacency (as
    in dp-accounting).
    """

    def __init__(self, neighboring_relation: NeighboringRelation = NeighboringRelation.ADD_OR_REMOVE_ONE):
        if neighboring_relation not in (NeighboringRelation.ADD_OR_REMOVE_ONE,
                                        NeighboringRelation.REPLACE_ONE):
            raise ValueError("neighboring_relation must be one of NeighboringRelation.ADD_OR_REMOVE_ONE, "
                             f"NeighboringRelation.REPLACE_ONE; got {neighboring_relation!r}")
        super().__init__(neighboring_relation)
        self._non_private = False
        self._private = False   # a Gaussian or subsampled Gaussian (noise > 0, count > 0, q > 0) was composed

    @abc.abstractmethod
    def _epsilon(self, target_delta: float) -> float:
        """Epsilon at ``target_delta`` in (0, 1) of the composed (private, non-empty) events."""

    @abc.abstractmethod
    def _delta(self, target_epsilon: float) -> float:
        """Delta at finite ``target_epsilon`` >= 0 of the composed (private, non-empty) events."""

    def get_epsilon(self, target_delta: float) -> float:
        """Epsilon at ``target_delta`` in [0, 1]: 0 for no private event, inf after a non-private one."""
        delta = check_real("target_delta", target_delta, 0.0, 1.0)
        if self._non_private:
            return math.inf
        if not self._private or delta == 1.0:
            return 0.0
        if delta == 0.0:
            return math.inf
        return self._epsilon(delta)

    def get_delta(self, target_epsilon: float) -> float:
        """Delta at ``target_epsilon`` in [0, inf]: 0 for no private event, 1 after a non-private one."""
        epsilon = check_nonnegative_or_inf("target_epsilon", target_epsilon)
        if self._non_private:
            return 1.0
        if not self._private or math.isinf(epsilon):
            return 0.0
        return self._delta(epsilon)

    @abc.abstractmethod
    def _add_gaussian(self, sigma: float, count: int) -> None:
        """Compose ``count`` Gaussian mechanisms with noise multiplier ``sigma``."""

    @abc.abstractmethod
    def _add_poisson_gaussian(self, q: float, sigma: float, count: int) -> None:
        """Compose ``count`` Poisson(q)-subsampled Gaussian mechanisms with noise multiplier ``sigma``."""

    def _maybe_compose(self, event: dp_accounting.DpEvent, count: int,
                       do_compose: bool) -> _Details | None:
        if isinstance(event, dp_accounting.NoOpDpEvent):
            return None
        if isinstance(event, dp_accounting.NonPrivateDpEvent):
            if do_compose:
                self._non_private = True
            return None
        if isinstance(event, dp_accounting.SelfComposedDpEvent):
            return self._maybe_compose(event.event, event.count * count, do_compose)
        if isinstance(event, dp_accounting.ComposedDpEvent):
            for sub in event.events:
                err = self._maybe_compose(sub, count, do_compose)
                if err is not None:
                    return err
            return None
        if isinstance(event, dp_accounting.GaussianDpEvent):
            if do_compose and count > 0:
                if event.noise_multiplier == 0:
                    self._non_private = True
                else:
                    self._add_gaussian(float(event.noise_multiplier), count)
                    self._private = True
            return None
        if isinstance(event, dp_accounting.PoissonSampledDpEvent):
            if self.neighboring_relation is not NeighboringRelation.ADD_OR_REMOVE_ONE:
                return _Details(invalid_event=event, error_message=(
                    "neighboring_relation must be ADD_OR_REMOVE_ONE for PoissonSampledDpEvent; found "
                    f"{self.neighboring_relation}."))
            if not isinstance(event.event, dp_accounting.GaussianDpEvent):
                return _Details(invalid_event=event, error_message=(
                    "Subevent of PoissonSampledDpEvent must be a GaussianDpEvent; found "
                    f"{event.event}."))
            if do_compose and count > 0 and event.sampling_probability > 0:
                if event.event.noise_multiplier == 0:
                    self._non_private = True
                else:
                    self._add_poisson_gaussian(float(event.sampling_probability),
                                               float(event.event.noise_multiplier), count)
                    self._private = True
            return None
        return _Details(invalid_event=event, error_message=f"{type(self).__name__} cannot bound this event.")
