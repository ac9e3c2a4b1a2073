"""Units: built-in models with a continuous outcome report the same posterior whatever the
outcome's units, and a known scale moves with the outcome.

The beta and gamma losses are not invariant to the units of y (DESIGN.md section 2), so
built-in models standardise y; a parameter fitted on the standardised scale (and a known
value such as sigma) must move with y. Two checks, within Monte Carlo error:
- every built-in model with a continuous outcome: standardised fits of y and of 10 y agree
  once the second is divided by 10 (KL and beta; 4 combined MCSE of the two means);
- location models with a known sigma, standardised or not, on y and on 10 y: NUTS against a
  quadrature of the same generalized posterior.
(Standardised and raw fits are not compared with each other: the default priors are stated
on the fitted scale, so the two are different models.)
"""

import numpy as np
import pytest
from scipy import stats

import robust_stan as rs
from robust_stan.building.divergences import DivergenceCode
from robust_stan.results.arviz_output import scalar_diagnostics

from .conftest import ENGINE

pytestmark = pytest.mark.stan  # every test here compiles or loads a Stan program

NUTS = dict(chains=4, iter_warmup=400, iter_sampling=600, show_progress=False)

# name: (the model for (standardize, unit of y), whether it has predictors X). A known sigma
# is given in the units of y, so data in 10 y come with a known sigma 10 times larger.
MODELS = {
    "location normal": (lambda s, unit: rs.location("normal", standardize=s, engine=ENGINE), False),
    "location normal, known sigma": (
        lambda s, unit: rs.location("normal", known={"sigma": 1.5 * unit}, standardize=s, engine=ENGINE), False),
    "location student_t, known sigma": (
        lambda s, unit: rs.location("student_t", known={"sigma": 1.5 * unit}, standardize=s, engine=ENGINE), False),
    "location exponential": (  # the prior of test_dpvi.py and test_fit.py: their build
        lambda s, unit: rs.location("exponential", priors={"rate": "gamma(2, 2)"}, standardize=s, engine=ENGINE),
        False),
    "glm normal": (lambda s, unit: rs.glm("normal", standardize=s, engine=ENGINE), True),
}


def model_data(name, uses_x, unit=1.0, seed=4):
    rng = np.random.default_rng(seed)
    n = 60
    X = rng.normal(size=(n, 2))
    if "exponential" in name:
        y = rng.exponential(2.0, size=n)
        y[:5] *= 15.0
    else:
        y = 3.0 + (X @ np.array([1.0, -0.5]) if uses_x else 0.0) + 1.5 * rng.standard_t(5, size=n)
        y[:5] += 20.0
    data = {"y": unit * y}
    if uses_x:
        data["X"] = X
    return data


def _model(name, standardize, unit=1.0):
    return MODELS[name][0](standardize, unit)


def _means_and_mcse(fit):
    out = {}
    for name in fit.parameter_names:
        draws = fit.draws(name)
        flat = draws.reshape(draws.shape[:2] + (-1,))
        for j in range(flat.shape[2]):
            x = flat[:, :, j]
            out[f"{name}[{j}]"] = (x.mean(), scalar_diagnostics(x)["mcse_mean"], x.std())
    return out


def _agree(a, b, scales=None):
    """Each mean of ``a`` equals the mean of ``b`` divided by its unit factor, within 4 combined MCSE."""
    for key, (mean_a, mcse_a, sd_a) in a.items():
        mean_b, mcse_b, _ = b[key]
        factor = scales.get(key.split("[")[0], 1.0) if scales else 1.0
        mean_b, mcse_b = mean_b / factor, mcse_b / factor
        assert abs(mean_a - mean_b) < 4 * np.hypot(mcse_a, mcse_b), (key, mean_a, mean_b, mcse_a, mcse_b, sd_a)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("divergence", [rs.KL(), rs.BetaD(0.3)], ids=["KL", "beta"])
def test_standardised_fit_is_the_same_in_any_units(name, divergence):
    uses_x = MODELS[name][1]
    fit_y = _model(name, True).sample(model_data(name, uses_x), divergence=divergence, seed=1, **NUTS)
    fit_10y = _model(name, True, unit=10.0).sample(model_data(name, uses_x, unit=10.0), divergence=divergence,
                                                   seed=2, **NUTS)
    # every parameter here scales with y except the exponential's rate (1/10) and student_t's nu (1)
    scales = {"mu": 10.0, "alpha": 10.0, "b": 10.0, "sigma": 10.0, "rate": 0.1, "nu": 1.0}
    _agree(_means_and_mcse(fit_y), _means_and_mcse(fit_10y), scales=scales)


# the normal only: student_t's known sigma is scaled by the same code, and its standardised fits in
# any units are compared above (one program fewer for the suite)
KNOWN_SCALE_FAMILIES = {
    "normal": (dict(sigma=1.5), lambda y, mu, sigma: stats.norm.logpdf(y, mu, sigma)),
}


def _quadrature_mean_sd(log_density, y_fitted, sigma_fitted, divergence, prior_sd=10.0):
    """Mean and sd of mu (fitted scale) under prior normal(0, prior_sd) and the loss of
    ``divergence`` on a fine grid. With sigma known, the integral term of the beta loss does
    not depend on mu, so the target is prior(mu) * exp(sum_i p_i^beta / beta) (KL: the likelihood)."""
    centre = np.median(y_fitted)
    grid = np.linspace(centre - 12 * sigma_fitted, centre + 12 * sigma_fitted, 20001)
    log_p = log_density(y_fitted[None, :], grid[:, None], sigma_fitted)
    if divergence.code == DivergenceCode.KL:
        log_target = log_p.sum(axis=1)
    else:
        log_target = np.exp(divergence.param * log_p).sum(axis=1) / divergence.param
    log_target += stats.norm.logpdf(grid, 0.0, prior_sd)
    weights = np.exp(log_target - log_target.max())
    weights /= weights.sum()
    mean = weights @ grid
    return mean, np.sqrt(weights @ (grid - mean) ** 2)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(KNOWN_SCALE_FAMILIES))
@pytest.mark.parametrize("standardize", [True, False], ids=["standardised", "raw"])
@pytest.mark.parametrize("unit", [1.0, 10.0], ids=["y", "10y"])
@pytest.mark.parametrize("divergence", [rs.KL(), rs.BetaD(0.3)], ids=["KL", "beta"])
def test_known_scale_location_matches_quadrature(family, standardize, unit, divergence):
    """A known sigma is in the units of y: the NUTS posterior of mu (original scale) equals a
    quadrature of the same generalized posterior on the scale the model is fitted on
    (standardised: y and sigma both divided by 1.4826 x MAD, prior normal(0, 10) there).
    Mean within 4 MCSE; sd within 10% (the sd's own Monte Carlo error at ESS ~ 1000 is ~2%).
    This is the bug the outside check found: sigma used to be passed unscaled."""
    from robust_stan.building.data import robust_scale

    known, log_density = KNOWN_SCALE_FAMILIES[family]
    known = {k: (v * unit if k == "sigma" else v) for k, v in known.items()}
    y = model_data("location " + family, False, unit=unit)["y"]
    model = rs.location(family, known=known, standardize=standardize, engine=ENGINE)
    fit = model.sample({"y": y}, divergence=divergence, seed=5, **NUTS)
    centre, scale = (np.median(y), robust_scale(y)) if standardize else (0.0, 1.0)
    mean_fitted, sd_fitted = _quadrature_mean_sd(log_density, (y - centre) / scale, known["sigma"] / scale, divergence)
    mean, sd = centre + scale * mean_fitted, scale * sd_fitted
    draws = fit.draws("mu")
    mcse = scalar_diagnostics(draws)["mcse_mean"]
    assert abs(draws.mean() - mean) < 4 * mcse, (draws.mean(), mean, mcse)
    assert abs(draws.std() / sd - 1) < 0.10, (draws.std(), sd)
