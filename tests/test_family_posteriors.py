"""Every family's generalized posterior under NUTS against an independent quadrature.

DESIGN.md section 5: for small models the generalized posterior is computed on a grid, here
from DESIGN.md section 2's losses transcribed in NumPy/SciPy (log densities from scipy.stats,
integral terms by direct sums or by the student_t integral written out below), independently
of the Stan library. The models are the intercept-only glms (X a zero column, so the slope b
keeps its prior and drops out of the intercept's posterior), standardize=False, N = 30 with
3 gross outliers. NUTS mean within 4 MCSE of the grid's; sd within 10% (at ESS ~ 1000 the
sd's own Monte Carlo error is about 2-3%).
"""

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from scipy import special, stats

import robust_stan as rs
from robust_stan.arviz_output import scalar_diagnostics

from .conftest import ENGINE

NUTS = dict(chains=4, iter_warmup=1000, iter_sampling=1000, show_progress=False)
N, N_OUT = 30, 3
DIVERGENCES = [rs.BetaD(0.5), rs.GammaD(0.5), rs.GammaD(0.5, form="original")]
# Bounded losses leave the posterior's tails to the prior (alpha ~ normal(0, 2.5)), so the
# grids reach 6 prior sds; _grid_moments checks the mass at the edges is below 1e-8.
WIDE = np.linspace(-15, 15, 12001)
WIDE_2D = np.linspace(-15, 15, 751)


def _log_sum_pmf_power(log_pmf: np.ndarray, a: float, axis: int = -1) -> np.ndarray:
    """log sum_k p_k^(1+a) over the support axis."""
    return special.logsumexp((1 + a) * log_pmf, axis=axis)


def total_loss(log_p: np.ndarray, log_i: np.ndarray, divergence) -> np.ndarray:
    """DESIGN.md section 2: the total loss over observations (last axis), weights 1."""
    a = divergence.param
    if divergence.code == 1:
        return (-np.exp(a * log_p) / a + np.exp(log_i) / (1 + a)).sum(axis=-1)
    if divergence.code == 2:
        return (-((1 + a) / a) * np.exp(a * log_p - a / (1 + a) * log_i)).sum(axis=-1)
    n = log_p.shape[-1]
    return (-(n / a) * (special.logsumexp(a * log_p, axis=-1) - np.log(n))
            + (n / (1 + a)) * (special.logsumexp(log_i, axis=-1) - np.log(n)))


@dataclass
class FamilyCase:
    data: dict
    # grid axes of the intercept(s) and the map (a, grid point) -> (log p_i, log I_i)
    axes: dict[str, np.ndarray]
    log_terms: Callable
    log_prior: Callable
    column: dict[str, int]  # grid axis -> its column of the model's alpha vector (categorical)


def _case(family: str) -> FamilyCase:
    rng = np.random.default_rng(7)
    data = {"X": np.zeros((N, 1))}
    normal_prior = lambda alpha: stats.norm.logpdf(alpha, 0, 2.5)  # noqa: E731
    if family == "bernoulli":
        y = (rng.uniform(size=N) < 0.75).astype(int)
        y[:N_OUT] = 0  # flipped labels
        data["y"] = y

        def log_terms(a, alpha):
            p = special.expit(alpha)[..., None]
            log_p = np.where(y == 1, np.log(p), np.log1p(-p))
            return log_p, np.log(p ** (1 + a) + (1 - p) ** (1 + a)) + 0 * log_p
        return FamilyCase(data, {"alpha": WIDE}, log_terms, normal_prior, {})
    if family == "binomial":
        trials = rng.integers(3, 12, N)
        y = rng.binomial(trials, 0.3)
        y[:N_OUT] = trials[:N_OUT]
        data.update(y=y, trials=trials)
        k = np.arange(trials.max() + 1)

        def log_terms(a, alpha):
            p = special.expit(alpha)
            log_p = stats.binom.logpmf(y, trials, p[..., None])
            log_pmf_k = stats.binom.logpmf(k, trials[:, None], p[..., None, None])  # (grid, N, k); -inf past n_i
            return log_p, _log_sum_pmf_power(log_pmf_k, a)
        return FamilyCase(data, {"alpha": WIDE}, log_terms, normal_prior, {})
    if family == "poisson":
        y = rng.poisson(3.0, N)
        y[:N_OUT] = 40
        data["y"] = y
        k = np.arange(200)

        def log_terms(a, alpha):  # k up to 199: lambda <= e^4 here, the tail beyond is below 1e-60
            lam = np.exp(alpha)[..., None]
            log_p = stats.poisson.logpmf(y, lam)
            log_i = _log_sum_pmf_power(stats.poisson.logpmf(k, lam), a)[..., None] + 0 * log_p
            return log_p, log_i
        return FamilyCase(data, {"alpha": WIDE}, log_terms, normal_prior, {})
    if family == "exponential":
        y = rng.exponential(2.0, N)
        y[:N_OUT] = 60.0
        data["y"] = y

        def log_terms(a, alpha):  # I_a = integral of (rate e^(-rate y))^(1+a) dy = rate^a / (1+a)
            rate = np.exp(-alpha)[..., None]
            log_p = np.log(rate) - rate * y
            return log_p, a * np.log(rate) - np.log1p(a) + 0 * log_p
        return FamilyCase(data, {"alpha": WIDE}, log_terms, normal_prior, {})
    if family == "categorical":
        y = rng.choice([1, 2, 3], size=N, p=[0.6, 0.3, 0.1])
        y[:N_OUT] = 3
        data.update(y=y, K=3)

        def log_terms(a, a1, a2):
            eta = np.stack(np.broadcast_arrays(np.zeros_like(a1), a1, a2), axis=-1)
            log_probs = eta - special.logsumexp(eta, axis=-1, keepdims=True)
            log_p = np.take(log_probs, y - 1, axis=-1)
            return log_p, _log_sum_pmf_power(log_probs, a)[..., None] + 0 * log_p
        return FamilyCase(data, {"a1": WIDE_2D, "a2": WIDE_2D}, log_terms,
                          lambda a1, a2: normal_prior(a1) + normal_prior(a2),
                          {"a1": 0, "a2": 1})
    raise ValueError(family)


def _grid_moments(case: FamilyCase, divergence):
    names = list(case.axes)
    mesh = np.meshgrid(*case.axes.values(), indexing="ij")
    log_p, log_i = case.log_terms(divergence.param, *mesh)
    log_post = case.log_prior(*mesh) - total_loss(log_p, np.broadcast_to(log_i, log_p.shape), divergence)
    w = np.exp(log_post - log_post.max())
    w /= w.sum()
    edge = max(w.take(0, axis=k).sum() + w.take(-1, axis=k).sum() for k in range(w.ndim))
    assert edge < 1e-8, f"the grid does not hold the posterior (edge mass {edge:.2g})"
    out = {}
    for name, values in zip(names, mesh):
        mean = (w * values).sum()
        out[name] = (mean, np.sqrt((w * (values - mean) ** 2).sum()))
    return out


@pytest.fixture(scope="module", params=["bernoulli", "binomial", "poisson", "exponential", "categorical"])
def family_model(request):
    model = rs.glm(request.param, standardize=False, engine=ENGINE)
    model.compile(show_progress=False)
    return request.param, model


@pytest.mark.slow
@pytest.mark.parametrize("divergence", DIVERGENCES, ids=repr)
def test_nuts_matches_grid_for_every_family(family_model, divergence):
    family, model = family_model
    case = _case(family)
    reference = _grid_moments(case, divergence)
    fit = model.sample(case.data, divergence=divergence, seed=17, **NUTS)
    alpha = fit.draws("alpha")
    for name, (mean, sd) in reference.items():
        draws = alpha if name == "alpha" else alpha[..., case.column[name]]
        mcse = scalar_diagnostics(draws)["mcse_mean"]
        assert abs(draws.mean() - mean) < 4 * mcse, (family, name, draws.mean(), mean, mcse)
        assert abs(draws.std() / sd - 1) < 0.10, (family, name, draws.std(), sd)
