"""How one stated epsilon is shared between DP training and the private calibration that follows it.

A model calibrated on private held-out data releases two more things about that data: a temperature (Guo
et al. 2017; ``fit_temperature_private``, Gaussian noisy bisection) and a split-conformal threshold
(Angelopoulos et al. 2022; ``private_conformal_threshold``). Their noise is fixed by their own epsilon and
number of queries alone, so their ``DpEvent``s are known before any data is read; the training noise is
then the smallest whose composition with them meets the stated epsilon
(``tfdpbnn.privacy.calibrate_noise(other_events=...)``, sequential composition under one accountant: no
disjointness of the training and held-out examples is assumed).

The default shares were fixed from the noise they imply alone: at a stated epsilon of 1 (PLD, delta 1e-5)
the threshold's safety margin is 34 counts and the temperature's noise standard deviation 98 clipped terms,
against the 359 held-out DIGITS images of a 25% split.
"""

from __future__ import annotations

import dataclasses

from tfdpbnn._validation import check_open_unit, check_positive, check_positive_int


@dataclasses.dataclass(frozen=True)
class CalibrationPlan:
    """Shares of a stated epsilon spent by a private temperature and a private conformal threshold.

    ``temperature_share`` / ``conformal_share``: each release's own epsilon as a fraction of the stated
    one (their composition with training, not their sum, is what the statement reports); ``*_steps``: their
    numbers of Gaussian queries; ``conformal_gamma``: the share of ``alpha`` spent on the noise; ``alpha``:
    miscoverage of the prediction sets (0.1: 90% sets).
    """

    temperature_share: float = 0.2
    temperature_steps: int = 4
    conformal_share: float = 0.5
    conformal_steps: int = 4
    conformal_gamma: float = 0.3
    alpha: float = 0.1

    def __post_init__(self):
        for name in ("temperature_share", "conformal_share", "conformal_gamma", "alpha"):
            check_open_unit(name, getattr(self, name))
        check_positive_int("temperature_steps", self.temperature_steps)
        check_positive_int("conformal_steps", self.conformal_steps)

    def events(self, epsilon, delta, accountant="rdp"):
        """The two releases' ``DpEvent``s at a stated ``epsilon`` (they depend on no data)."""
        from tfdpbnn.uncertainty.private_release import gaussian_queries

        epsilon = check_positive("epsilon", epsilon)
        return [gaussian_queries(self.temperature_share * epsilon, delta, self.temperature_steps,
                                 "temperature", accountant)[1].dp_event,
                gaussian_queries(self.conformal_share * epsilon, delta, self.conformal_steps,
                                 "conformal", accountant)[1].dp_event]

    def fit(self, probs, labels, epsilon, delta, accountant="rdp", seeds=(None, None)):
        """``(TemperatureScaling, ConformalThreshold)`` fit privately on held-out ``probs``/``labels``.

        The threshold is fit on the calibrated probabilities; ``seeds``: the two fits' noise seeds.
        """
        from tfdpbnn.uncertainty.conformal import private_conformal_threshold
        from tfdpbnn.uncertainty.temperature import fit_temperature_private

        epsilon = check_positive("epsilon", epsilon)
        temperature = fit_temperature_private(probs, labels, self.temperature_share * epsilon, delta,
                                              steps=self.temperature_steps, accountant=accountant,
                                              seed=seeds[0])
        threshold = private_conformal_threshold(temperature.apply(probs), labels, self.alpha,
                                                self.conformal_share * epsilon, delta,
                                                steps=self.conformal_steps, gamma=self.conformal_gamma,
                                                accountant=accountant, seed=seeds[1])
        return temperature, threshold


__all__ = ["CalibrationPlan"]
