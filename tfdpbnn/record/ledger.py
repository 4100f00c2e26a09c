"""The privacy ledger of one model's training: what really ran, phase by phase, as one ``DpEvent``.

A phase is a stretch of DP-SGD steps (Abadi et al. 2016) with one noise multiplier and one sampling scheme.
Its ``DpEvent`` (dp-accounting's convention: noise multiplier in units of the L2 sensitivity, C for
add/remove and 2C for replace-one) comes from COUNTED quantities:

- "poisson": ``steps`` Poisson(q)-subsampled Gaussian mechanisms (Mironov, Talwar & Zhang 2019), for
  batches drawn by ``tfdpbnn.data.poisson_batches`` with a secret seed (or asserted by the user) whose
  realized sizes passed the Binomial test (``tfdpbnn.privacy.sampling_test``);
- "participations": ``count`` Gaussian mechanisms without amplification, where ``count`` is the number of
  noised sums the most-exposed example can have entered: ``ceil(examples processed / n)`` for passes over
  the data (shuffled batches), or every step when the sampling cannot be trusted to amplify (a fixed
  seed, or batches that failed the Poisson test);
- "gaussian": one Gaussian mechanism of noise multiplier ``noise_multiplier`` (exact mu-GDP composition of
  adaptively chosen Gaussian releases, Dong, Roth & Su 2019, Corollary 3.3: SI-DPSGD's paper mode).

Phases compose (``ComposedDpEvent``), so recompiling, a new optimizer or a restored checkpoint with other
settings adds a phase and never rewrites the epsilon of steps already taken.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import secrets

import dp_accounting
import numpy as np

from tfdpbnn._validation import check_choice, check_open_unit
from tfdpbnn.privacy._rdp_conversion import conversion_terms, rdp_epsilon_with
from tfdpbnn.privacy.budget import NEIGHBORING, SENSITIVITY
from tfdpbnn.privacy.registry import get_accountant, sound_accountants

PHASE_KINDS = ("poisson", "participations", "gaussian")


def step_event(noise_multiplier: float, neighboring: str = "add_or_remove",
               sample_rate: float | None = None) -> dp_accounting.DpEvent:
    """The ``DpEvent`` of one release of a clipped sum plus ``N(0, (sigma C)^2)`` (Abadi et al. 2016).

    In units of the sensitivity (C under add-or-remove, 2C under replace-one, so the Gaussian's noise
    multiplier is ``sigma / sensitivity``); ``NonPrivateDpEvent`` for sigma = 0. With ``sample_rate`` q the
    batch was Poisson-sampled (``PoissonSampledDpEvent``); without it the event is one participation of an
    example, without amplification.
    """
    if noise_multiplier == 0:
        return dp_accounting.NonPrivateDpEvent()
    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier / SENSITIVITY[neighboring])
    if sample_rate is None:
        return gaussian
    return dp_accounting.PoissonSampledDpEvent(float(sample_rate), gaussian)


def new_phase_id() -> int:
    """A random 52-bit identifier (exact in a float64 variable) that keeps phases unique across merges."""
    return secrets.randbits(52)


def derived_phase_id(text: str) -> int:
    """A 52-bit phase identifier fixed by ``text`` (SHA-256): the same phase wherever it is derived again."""
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "little") % (1 << 52) or 1


@dataclasses.dataclass(frozen=True)
class Phase:
    """One stretch of training with one mechanism, described by what was counted.

    Attributes:
      kind: one of ``PHASE_KINDS`` (module docstring).
      noise_multiplier: sigma, noise std over the clip norm C (per step; for "gaussian" the whole phase's).
      neighboring: "add_or_remove" or "replace_one".
      steps: DP steps taken in the phase.
      sample_rate: q for "poisson", else None.
      participations: for "participations", how many noised sums the most-exposed example entered.
      examples: examples processed (sum of realized batch sizes).
      num_examples: n of the data the batches were drawn from.
      sampling: one line on how the batches were drawn (and whether that was checked or asserted).
      phase_id: unique identifier.
      noise_replayable: the phase's noise was replayable from a seed (an optimizer built with
        ``debug_noise_seed``): whoever knows the seed subtracts it, so the phase is a non-private release
        (``event``) wherever it goes: another optimizer that imports it, the privacy record store, a saved
        config. ``with_secret_noise`` gives the accountant's event for the same steps with secret noise.
    """

    kind: str
    noise_multiplier: float
    neighboring: str
    steps: int
    sample_rate: float | None = None
    participations: int | None = None
    examples: int = 0
    num_examples: int | None = None
    sampling: str = ""
    phase_id: int = dataclasses.field(default_factory=new_phase_id)
    noise_replayable: bool = False

    def __post_init__(self):
        check_choice("kind", self.kind, PHASE_KINDS)
        check_choice("neighboring", self.neighboring, tuple(NEIGHBORING))
        if not self.noise_multiplier >= 0:
            raise ValueError(f"noise_multiplier must be >= 0, got {self.noise_multiplier!r}")
        if self.kind == "poisson" and not (self.sample_rate is not None and 0 < self.sample_rate <= 1):
            raise ValueError(f"sample_rate: a poisson phase needs q in (0, 1], got {self.sample_rate!r}")
        if self.kind == "participations" and (self.participations is None or self.participations < 0):
            raise ValueError(f"participations must be an integer >= 0, got {self.participations!r}")

    @property
    def released(self) -> bool:
        """Whether the phase released anything (a step was taken)."""
        if self.kind == "participations":
            return (self.participations or 0) > 0
        return self.steps > 0

    def event(self) -> dp_accounting.DpEvent:
        """The phase's ``DpEvent`` in units of the sensitivity (C, or 2C under replace-one)."""
        if not self.released:
            return dp_accounting.NoOpDpEvent()
        if self.noise_multiplier == 0 or self.noise_replayable:
            return dp_accounting.NonPrivateDpEvent()
        if self.kind == "poisson":
            return dp_accounting.SelfComposedDpEvent(
                step_event(self.noise_multiplier, self.neighboring, float(self.sample_rate or 0.0)),
                int(self.steps))
        gaussian = step_event(self.noise_multiplier, self.neighboring)
        if self.kind == "participations":
            return dp_accounting.SelfComposedDpEvent(gaussian, int(self.participations or 0))
        return gaussian

    def to_config(self) -> dict:
        """A JSON-safe dict (``Phase(**config)`` rebuilds it): every field, each a plain scalar."""
        return {name: getattr(self, name) for name in _PHASE_FIELDS}

    def with_secret_noise(self) -> Phase:
        """This phase as if its noise had been secret: the accountant's value, no guarantee if replayable."""
        return dataclasses.replace(self, noise_replayable=False) if self.noise_replayable else self


#: The start of the ``sampling`` text of a phase that stands for weights written outside the DP step.
WRITTEN_OUTSIDE_DP = "no DP: weights written outside the DP step"


def written_outside_dp_phase(names, neighboring: str) -> Phase:
    """A release without noise: the variables ``names`` were written outside the DP step.

    What set them (a weight set from the data's mean, a plain optimizer's steps) is covered by no epsilon:
    a phase of noise multiplier 0 (its event ``NonPrivateDpEvent``), written to the privacy record store
    beside the ledger of the weights it changed. An optimizer that finds it there gives no guarantee
    (``RunRecord.inherit``, which keeps it out of the optimizer's ledger), and weights whose record holds
    it are not counted as a DP run's (``RunRecord.recognises_weights``, ``weights_and_spent``).
    """
    names = list(names)
    return Phase(kind="participations", noise_multiplier=0.0, neighboring=neighboring, steps=1,
                 participations=1, sampling=f"{WRITTEN_OUTSIDE_DP}: variable(s) {names[:3]}"
                                            + (f" and {len(names) - 3} more" if len(names) > 3 else ""))


def is_written_outside_dp(phase: Phase) -> bool:
    """Whether ``phase`` stands for weights written outside the DP step (``written_outside_dp_phase``)."""
    return phase.noise_multiplier == 0 and phase.sampling.startswith(WRITTEN_OUTSIDE_DP)


#: The fields of ``Phase``, in order (``Phase.to_config``).
_PHASE_FIELDS = tuple(field.name for field in dataclasses.fields(Phase))


class PrivacyLedger:
    """The phases of one model's DP training, composed into one ``DpEvent``.

    ``epsilon(delta, accountant)`` is an upper bound for everything in the ledger when ``accountant`` is
    sound (``tfdpbnn.privacy.sound_accountants()``); approximate accountants are refused here.
    """

    def __init__(self, phases=()):
        self._phases: list[Phase] = []
        for phase in phases:
            self.add(phase)

    @property
    def phases(self) -> tuple[Phase, ...]:
        """The recorded phases, oldest first."""
        return tuple(self._phases)

    def with_secret_noise(self) -> PrivacyLedger:
        """The same phases as if every noise had been secret (``Phase.with_secret_noise``)."""
        return PrivacyLedger([p.with_secret_noise() for p in self._phases])

    def add(self, phase: Phase) -> None:
        """Append ``phase`` (a phase already present, by id, is not added twice)."""
        if not isinstance(phase, Phase):
            phase = Phase(**phase)
        if any(p.phase_id == phase.phase_id for p in self._phases):
            return
        if self._phases and phase.neighboring != self._phases[0].neighboring:
            raise ValueError(
                f"neighboring: this model's ledger is accounted under {self._phases[0].neighboring!r}; a "
                f"phase under {phase.neighboring!r} cannot be composed with it. Keep one neighboring "
                "relation for all training of a model.")
        self._phases.append(phase)

    @property
    def steps(self) -> int:
        """DP steps over all phases."""
        return sum(p.steps for p in self._phases)

    @property
    def neighboring(self) -> str:
        """The neighboring relation of every phase ("add_or_remove" when empty)."""
        return self._phases[0].neighboring if self._phases else "add_or_remove"

    def event(self) -> dp_accounting.DpEvent:
        """All phases as one ``ComposedDpEvent``."""
        return dp_accounting.ComposedDpEvent([p.event() for p in self._phases])

    def epsilon(self, delta: float, accountant: str = "rdp") -> float:
        """Epsilon at ``delta`` of everything recorded, by a sound accountant; ``inf`` if sigma was 0."""
        check_open_unit("delta", delta)
        if accountant not in sound_accountants():
            raise ValueError(
                f"accountant: {accountant!r} is not a sound accountant (one of {sound_accountants()}); an "
                "approximation cannot be a privacy statement (see approximate_epsilon)")
        return _epsilon_of(self.event(), delta, accountant, self.neighboring)

    def approximate_epsilon(self, delta: float, accountant: str = "gdp") -> float:
        """Epsilon by any registered accountant, approximate ones included (label it as such)."""
        check_open_unit("delta", delta)
        return _epsilon_of(self.event(), delta, accountant, self.neighboring)

    def gaussian_mu(self) -> float | None:
        """The mu of the exact mu-GDP composition when no phase is subsampled (Dong, Roth & Su 2019).

        Composing Gaussian mechanisms of noise multipliers sigma_i (in sensitivity units) is exactly mu-GDP
        with mu^2 = sum_i 1 / sigma_i^2; None when a phase is Poisson-subsampled.
        """
        total = 0.0
        for phase in self._phases:
            if not phase.released:
                continue
            if phase.kind == "poisson":
                return None
            if phase.noise_multiplier == 0:
                return math.inf
            count = (phase.participations or 0) if phase.kind == "participations" else 1
            sigma = phase.noise_multiplier / SENSITIVITY[phase.neighboring]
            total += count / sigma ** 2
        return math.sqrt(total)

    def to_config(self) -> list[dict]:
        """JSON-safe list of the phases."""
        return [p.to_config() for p in self._phases]


@functools.lru_cache(maxsize=256)
def _rdp_of_one(event: dp_accounting.DpEvent, neighboring: str) -> np.ndarray:
    """dp-accounting's RDP curve (default orders) of ONE ``event`` (Mironov 2017), cached.

    It is computed once per (noise multiplier, sample rate), however many steps compose it.
    """
    acc = get_accountant("rdp", neighboring_relation=NEIGHBORING[neighboring])
    curve = acc.compose(event).rdp
    curve.setflags(write=False)
    return curve


def _leaf_counts(event: dp_accounting.DpEvent) -> dict:
    """Every leaf event of ``event`` (composed and self-composed events unrolled) with its total count.

    Composition is commutative (Dwork & Roth 2014, Theorem 3.16; Mironov 2017, Proposition 1; the PLD of a
    composition is the convolution of the parts', Koskela et al. 2020), so an event is determined, for every
    accountant, by this multiset; a no-op leaf and a zero count add nothing and are left out.
    """
    counts: dict = {}
    stack = [(event, 1)]
    while stack:
        item, count = stack.pop()
        if isinstance(item, dp_accounting.ComposedDpEvent):
            stack.extend((e, count) for e in item.events)
        elif isinstance(item, dp_accounting.SelfComposedDpEvent):
            stack.append((item.event, count * item.count))
        elif count and not isinstance(item, dp_accounting.NoOpDpEvent):
            counts[item] = counts.get(item, 0) + count
    return counts


def merged_event(event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
    """``event`` with repeated leaves merged: one ``SelfComposedDpEvent`` per distinct leaf, in a fixed order.

    The same privacy loss as ``event`` (``_leaf_counts``), and the form every accountant composes fastest:
    a ledger that holds many runs with the same noise and sampling (one experiment over seeds) composes each
    distinct step once, self-composed by its total count (dp-accounting's PLD by one FFT power, instead of
    one convolution per run).
    """
    return _from_leaves(_sorted_leaves(event))


def _sorted_leaves(event) -> tuple:
    return tuple(sorted(_leaf_counts(event).items(), key=lambda item: repr(item[0])))


def _from_leaves(leaves) -> dp_accounting.ComposedDpEvent:
    return dp_accounting.ComposedDpEvent([e if n == 1 else dp_accounting.SelfComposedDpEvent(e, n)
                                          for e, n in leaves])


def _rdp_epsilon(event, delta, neighboring) -> float:
    """``RdpAccountant().compose(event).get_epsilon(delta)`` computed from cached per-event curves.

    RDP composes by adding curves (Mironov 2017, Proposition 1), which is what dp-accounting's
    ``RdpAccountant`` does (count times the curve of a self-composed event, the sum over a composed one);
    here each distinct event's curve is computed once, so the cost does not grow with the number of steps
    or epoch ends. The epsilon itself is cached by everything it depends on (``_rdp_epsilon_of_leaves``):
    the multiset of leaf events with their counts, ``delta`` and the neighbouring relation.
    """
    return _rdp_epsilon_of_leaves(_sorted_leaves(event), float(delta), neighboring)


@functools.lru_cache(maxsize=1024)
def _rdp_epsilon_of_leaves(leaves: tuple, delta: float, neighboring: str) -> float:
    """RDP epsilon of the composition of ``leaves`` (sorted (leaf event, count) pairs) at ``delta`` (cached).

    The curve is the sum of count times each leaf's curve (``_rdp_of_one``), converted by dp-accounting's
    RDP-to-epsilon conversion (``rdp_epsilon_with``, whose terms of the orders and delta are cached by
    ``_rdp_terms``). A ledger's epsilon at each epoch end is one lookup when its phases have not changed
    since the last one.
    """
    total = np.zeros_like(_rdp_of_one(dp_accounting.NoOpDpEvent(), neighboring))
    for item, count in leaves:  # sorted: a fixed order of the sum
        total = total + count * _rdp_of_one(item, neighboring)
    return rdp_epsilon_with(_rdp_terms(neighboring, delta), _rdp_orders(neighboring), total, delta)


@functools.lru_cache(maxsize=64)
def _rdp_terms(neighboring: str, delta: float):
    """``conversion_terms`` of ``neighboring``'s orders (``_rdp_orders``) at ``delta``, cached."""
    return conversion_terms(_rdp_orders(neighboring), delta)


@functools.lru_cache(maxsize=4)
def _rdp_orders(neighboring: str) -> np.ndarray:
    """The Renyi orders of dp-accounting's ``RdpAccountant`` (those of ``_rdp_of_one``'s curves)."""
    orders = np.asarray(get_accountant("rdp", neighboring_relation=NEIGHBORING[neighboring]).orders,
                        dtype=np.float64)
    orders.setflags(write=False)
    return orders


def _epsilon_of(event, delta, accountant, neighboring) -> float:
    if isinstance(event, dp_accounting.ComposedDpEvent) and not event.events:
        return 0.0
    if _non_private(event):
        return math.inf
    if accountant == "rdp":
        return _rdp_epsilon(event, delta, neighboring)
    return _accountant_epsilon(_sorted_leaves(event), float(delta), accountant, neighboring)


@functools.lru_cache(maxsize=1024)
def _accountant_epsilon(leaves: tuple, delta, accountant, neighboring) -> float:
    """Epsilon by ``accountant`` of a merged event given as its sorted leaves and counts (cached)."""
    if not leaves:
        return 0.0
    acc = get_accountant(accountant, neighboring_relation=NEIGHBORING[neighboring])
    return float(acc.compose(_from_leaves(leaves)).get_epsilon(delta))


def largest_epsilon(events_lists, delta: float, accountant: str, neighboring_of) -> float | None:
    """The largest epsilon over several compositions (each a list of events), computed sparingly.

    Each composition's epsilon is the smaller of ``accountant``'s and RDP's (Mironov 2017): both are upper
    bounds, so the smaller is one. RDP costs a sum of cached curves. The compositions are visited by
    decreasing RDP epsilon; one whose leaves (``_leaf_counts``) are contained in a visited one's is skipped
    (composition only adds privacy loss, for every accountant), and the other accountant runs only while a
    composition's RDP epsilon exceeds the largest found so far (none after it can be larger). A ledger's
    histories are mostly prefixes of each other, so few are composed. ``neighboring_of(i)`` gives the i-th
    composition's neighbouring relation. None for no composition.
    """
    items = []
    for i, events in enumerate(events_lists):
        event = dp_accounting.ComposedDpEvent(list(events))
        if accountant == "rdp":
            rdp = _epsilon_of(event, delta, "rdp", neighboring_of(i))
        else:
            try:
                rdp = _epsilon_of(event, delta, "rdp", neighboring_of(i))
            except ValueError:  # an event RDP does not compose: the accountant alone answers, never skipped
                rdp = math.inf
        items.append((rdp, i, event))
    if not items:
        return None
    if accountant == "rdp":
        return max(rdp for rdp, _, _ in items)
    items.sort(key=lambda item: -item[0])
    worst = -math.inf
    visited: list[tuple[str, dict]] = []
    for rdp, i, event in items:
        if rdp <= worst:
            break
        neighboring, leaves = neighboring_of(i), _leaf_counts(event)
        if any(n == neighboring and all(held.get(k, 0) >= c for k, c in leaves.items())
               for n, held in visited):
            continue
        visited.append((neighboring, leaves))
        if accountant == "rdp" or math.isinf(rdp):
            value = _epsilon_of(event, delta, accountant, neighboring)
        else:
            value = min(rdp, _epsilon_of(event, delta, accountant, neighboring))
        worst = max(worst, value)
    return worst


def _non_private(event) -> bool:
    if isinstance(event, dp_accounting.NonPrivateDpEvent):
        return True
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return any(_non_private(e) for e in event.events)
    return False


__all__ = ["PHASE_KINDS", "Phase", "PrivacyLedger", "largest_epsilon", "merged_event", "new_phase_id",
           "step_event"]
