"""Privacy accounting of DP-SGD: T steps of the Poisson-subsampled Gaussian mechanism.

The accounting comes from Google's ``dp-accounting`` library: it is maintained
(regular releases), and it has in one package both a tight numerical accountant,
privacy loss distributions (PLD; the family of the PRV accountant of Gopi, Lee and
Wutschitz 2021 that the noise-aware DPVI paper uses, and like it a pessimistic
bound), and the looser Renyi-DP accountant used as a cross-check. (The paper's
``prv-accountant`` package has had no release since 2022; the tests compare with
it.) Neighbouring data sets differ by adding or removing one example, the relation
under which Poisson subsampling is analysed, with the number of rows N public
(:data:`ADJACENCY` says why).

The noise multiplier sigma (noise sd = sigma C for clipping bound C) is solved
from (epsilon, delta, T, kappa) by the library's own calibration, and checked:
the PLD epsilon of the returned sigma is at most epsilon.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
from dataclasses import dataclass

from ...common.errors import RobustStanInputError

ACCOUNTANTS = ("pld", "rdp")

#: The neighbouring relation the guarantee holds for (recorded in every :class:`PrivacyAccounting`).
ADJACENCY = ("add or remove one row, with the number of rows N public: each row's clipped term holds the "
             "prior, Jacobian and entropy terms divided by N, so N is a constant of the mechanism that is "
             "not protected (a data set with one row more or less but the same N is the neighbour analysed)")


@dataclass(frozen=True)
class PrivacyAccounting:
    """The public privacy settings of a DP-SGD run and the accounting behind them.

    ``noise_multiplier`` is sigma (the noise sd divided by the clipping bound);
    ``epsilon_spent`` is ``accountant``'s epsilon for it at ``delta`` (<= ``epsilon``);
    ``adjacency`` the neighbouring relation the guarantee is for (:data:`ADJACENCY`).

    Parameters
    ----------
    epsilon, delta : float
        The guarantee asked for.
    sampling_rate : float
        kappa, each row's probability of joining a step's Poisson subsample.
    steps : int
        T, the number of noisy steps.
    noise_multiplier : float
        sigma.
    epsilon_spent : float
        The accountant's epsilon for ``noise_multiplier`` at ``delta``.
    accountant, accountant_version : str
        Which accountant gave ``epsilon_spent``, and its package's version.
    adjacency : str
        The neighbouring relation.
    """

    epsilon: float
    delta: float
    sampling_rate: float
    steps: int
    noise_multiplier: float
    epsilon_spent: float
    accountant: str
    accountant_version: str
    adjacency: str = ADJACENCY


def check_privacy_arguments(epsilon, delta, sampling_rate, steps) -> tuple[float, float, float, int]:
    """The accounting's inputs as numbers, or a RobustStanInputError naming the bad one."""
    checks = (("epsilon", epsilon, lambda v: v > 0, "must be > 0"),
              ("delta", delta, lambda v: 0 < v < 1, "must lie in (0, 1)"),
              ("sampling_rate", sampling_rate, lambda v: 0 < v <= 1, "must lie in (0, 1]"))
    values = []
    for name, value, valid, rule in checks:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise RobustStanInputError(f"{name}: {rule}, got {value!r}") from None
        if not (number == number and valid(number)):  # rejects NaN too
            raise RobustStanInputError(f"{name}: {rule}, got {value!r}")
        values.append(number)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise RobustStanInputError(f"steps: must be an integer >= 1, got {steps!r}")
    return values[0], values[1], values[2], steps


def dp_sgd_event(noise_multiplier: float, sampling_rate: float, steps: int):
    """The dp-accounting event of ``steps`` Poisson-subsampled Gaussian mechanisms."""
    import dp_accounting

    step = dp_accounting.GaussianDpEvent(noise_multiplier)
    if sampling_rate < 1:
        step = dp_accounting.PoissonSampledDpEvent(sampling_rate, step)
    return dp_accounting.SelfComposedDpEvent(step, steps)


def _fresh_accountant(accountant: str):
    from dp_accounting import pld, rdp

    if accountant == "pld":
        return pld.PLDAccountant()
    if accountant == "rdp":
        return rdp.RdpAccountant()
    raise RobustStanInputError(f"accountant: must be one of {list(ACCOUNTANTS)}, got {accountant!r}")


def epsilon_for(noise_multiplier: float, delta: float, sampling_rate: float, steps: int,
                accountant: str = "pld") -> float:
    """The epsilon at ``delta`` of DP-SGD with this noise multiplier, by the PLD or RDP accountant."""
    return float(_fresh_accountant(accountant).compose(dp_sgd_event(noise_multiplier, sampling_rate, steps))
                 .get_epsilon(delta))


#: Below this noise multiplier the PLD accountant's grid grows beyond memory (the privacy loss
#: range widens as 1 / sigma^2); there the RDP accountant's (looser, still valid) answer is used.
PLD_SMALLEST_SIGMA = 0.3


@functools.lru_cache(maxsize=64)
def solve_noise_multiplier(epsilon: float, delta: float, sampling_rate: float, steps: int) -> PrivacyAccounting:
    """The smallest noise multiplier (to 0.1%) whose PLD epsilon at ``delta`` is at most ``epsilon``
    (cached: a TARP study asks the same question thousands of times).

    The RDP accountant's sigma (an upper bound on the PLD one, found fast) brackets the search;
    when it is below :data:`PLD_SMALLEST_SIGMA` (epsilon so large that the noise hardly
    matters) the RDP sigma itself is used and named as the accountant."""
    import dp_accounting

    epsilon, delta, sampling_rate, steps = check_privacy_arguments(epsilon, delta, sampling_rate, steps)
    version = importlib.metadata.version("dp-accounting")

    def calibrated(accountant, bracket, tol):
        absl_logger = logging.getLogger("absl")
        level = absl_logger.level
        absl_logger.setLevel(logging.ERROR)  # RDP's search logs every order it drops at small sigma
        try:
            return float(dp_accounting.calibrate_dp_mechanism(
                lambda: _fresh_accountant(accountant), lambda s: dp_sgd_event(s, sampling_rate, steps), epsilon,
                delta, bracket, tol=tol))
        finally:
            absl_logger.setLevel(level)

    sigma = sigma_rdp = calibrated("rdp", dp_accounting.LowerEndpointAndGuess(1e-4, 1.0), 1e-3)
    accountant = "rdp" if sigma_rdp < PLD_SMALLEST_SIGMA else "pld"
    if accountant == "pld":
        sigma = calibrated("pld", dp_accounting.ExplicitBracketInterval(0.5 * sigma_rdp, sigma_rdp), 1e-3 * sigma_rdp)
    while (spent := epsilon_for(sigma, delta, sampling_rate, steps, accountant)) > epsilon:
        sigma *= 1.001  # the calibration returns the bracket's feasible end; this guards the guarantee anyway
    return PrivacyAccounting(epsilon, delta, sampling_rate, steps, sigma, spent,
                             f"dp-accounting {accountant.upper()} (add/remove one)", version)
