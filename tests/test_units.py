"""Units: built-in models with a continuous outcome report the same posterior whatever the
outcome's units, and standardising changes nothing under the ordinary (KL) posterior.

The beta and gamma losses are not invariant to the units of y (DESIGN.md section 2), so
built-in models standardise y; a parameter fitted on the standardised scale (and a known
value such as sigma) must move with y. Two checks per model, each within Monte Carlo error
(4 combined MCSE of the two posterior means):
- standardised fits of y and of 10 y agree once the second is divided by 10 (KL and beta);
- under KL, standardize=True and standardize=False agree on the original scale (the default
  priors are weak: their effect on these means is below 1e-3 posterior sd at N = 60).
"""

import numpy as np
import pytest

import robust_stan as rs
from robust_stan.arviz_output import scalar_diagnostics

from .conftest import ENGINE

NUTS = dict(chains=4, iter_warmup=400, iter_sampling=600, show_progress=False)

# name: (the model for (standardize, unit of y), whether it has predictors X). A known sigma
# is given in the units of y, so data in 10 y come with a known sigma 10 times larger.
MODELS = {
    "location normal": (lambda s, unit: rs.location("normal", standardize=s, engine=ENGINE), False),
    "location normal, known sigma": (
        lambda s, unit: rs.location("normal", known={"sigma": 1.5 * unit}, standardize=s, engine=ENGINE), False),
    "location student_t, known sigma": (
        lambda s, unit: rs.location("student_t", known={"sigma": 1.5 * unit}, standardize=s, engine=ENGINE), False),
    "location exponential": (lambda s, unit: rs.location("exponential", standardize=s, engine=ENGINE), False),
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


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_standardising_leaves_the_ordinary_posterior_alone(name):
    uses_x = MODELS[name][1]
    data = model_data(name, uses_x)
    standardised = _model(name, True).sample(data, divergence=rs.KL(), seed=3, **NUTS)
    raw = _model(name, False).sample(data, divergence=rs.KL(), seed=4, **NUTS)
    _agree(_means_and_mcse(standardised), _means_and_mcse(raw))
