"""Per-example gradients for every built-in family, minibatches and several points per call.

The glms of each family, except student_t and multi_normal: their location models (student_t with
sigma known and nu estimated, multi_normal with its covariance estimated) add the copies of a
shape parameter and of a Cholesky factor.

Reference: the gradient of one observation's loss from a one-row data set,
-(grad log posterior - grad log prior) in the ordinary mode, which runs the
library's weighted total instead of the per-example code path. Both are exact
autodiff of the same closed forms, so they agree to rounding (1e-9 relative).
"""

import numpy as np
import pytest

import robust_stan as rs

from .conftest import ENGINE

RTOL, ATOL = 1e-9, 1e-11


def family_case(family: str, n: int = 8, seed: int = 0):
    """(model, data, per-observation keys) for a small data set of the family."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    base = {"X": X, "prior_scale_b": np.full(2, 2.5)}
    eta = 0.3 + X @ np.array([0.8, -0.5])
    if family == "student_t":
        # the location model with sigma known and nu estimated (as tests/test_units.py compiles it): the
        # per-example copies then include nu's
        y = 0.3 + rng.normal(size=n)
        y[0] += 8.0
        return rs.location("student_t", known={"sigma": 1.5}, standardize=False, engine=ENGINE), {"y": y}, ("y",)
    if family == "multi_normal":
        y = rng.normal(size=(n, 3)) @ np.array([[1.0, 0.3, 0.0], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])
        y[0] += 6.0
        return rs.location("multi_normal", engine=ENGINE), {"y": y}, ("y",)
    if family == "normal":
        y = eta + rng.normal(size=n)
        y[0] += 8.0
    elif family == "bernoulli":
        y = (rng.uniform(size=n) < 1 / (1 + np.exp(-eta))).astype(int)
    elif family == "binomial":
        base["trials"] = rng.integers(1, 12, n)
        y = rng.binomial(base["trials"], 1 / (1 + np.exp(-eta)))
    elif family == "poisson":
        y = rng.poisson(np.exp(eta))
        y[0] = 40
    elif family == "categorical":
        base["K"] = 3
        y = rng.integers(1, 4, n)
    else:  # exponential
        y = rng.exponential(np.exp(-eta))
    model = rs.glm(family, standardize=False, engine=ENGINE)
    keys = ("X", "y") + (("trials",) if family == "binomial" else ())
    return model, dict(base, y=y), keys


FAMILIES = ["normal", "student_t", "bernoulli", "binomial", "poisson", "categorical", "exponential", "multi_normal"]
LINEAR_PREDICTOR_FAMILIES = {"normal", "bernoulli", "binomial", "poisson", "exponential"}  # glms with mode 3


@pytest.mark.stan
@pytest.mark.parametrize("family", FAMILIES)
def test_per_example_rows_equal_one_row_gradients(family):
    model, data, keys = family_case(family)
    n = len(data["y"])
    d = model.unconstrained_dimension(data)
    theta = np.random.default_rng(1).normal(scale=0.3, size=d)
    strategies = ["copies"] + (["linear_predictor"] if family in LINEAR_PREDICTOR_FAMILIES else [])
    assert model.per_example(data).strategy == strategies[-1]  # "auto" takes the faster one
    for divergence in (rs.BetaD(0.3), rs.GammaD(0.4)):
        for strategy in strategies:
            G = model.per_example_gradients(data, theta, divergence=divergence, strategy=strategy)
            assert G.shape == (n, d)
            for i in range(n):
                one = {k: (np.asarray(v)[[i]] if k in keys else v) for k, v in data.items()}
                _, g_post = model.log_density_gradient(one, theta, divergence=divergence, jacobian=False)
                _, g_prior = model.log_density_gradient(one, theta, divergence=divergence, mode="prior",
                                                        jacobian=False)
                np.testing.assert_allclose(G[i], -(g_post - g_prior), rtol=RTOL, atol=ATOL,
                                           err_msg=f"{family} ({strategy}) row {i}")


@pytest.mark.stan
@pytest.mark.parametrize("strategy", ["copies", "linear_predictor"])
def test_minibatches_and_several_points_in_one_call(glm_normal, strategy):
    model = glm_normal
    rng = np.random.default_rng(2)
    data = {"X": rng.normal(size=(30, 3)), "y": rng.normal(size=30), "prior_scale_b": np.full(3, 2.5)}
    per_example = model.per_example(data, rs.BetaD(0.3), strategy=strategy)
    thetas = rng.normal(scale=0.4, size=(3, 5))
    batch = np.array([4, 17, 17, 29])
    many = per_example.gradients_many(thetas, batch=batch)
    assert many.shape == (3, 4, 5)
    for p in range(3):
        full = per_example.gradients(thetas[p])
        np.testing.assert_allclose(many[p], full[batch], rtol=1e-12, atol=0)
    with pytest.raises(rs.RobustStanInputError, match="^batch: "):
        per_example.gradients(thetas[0], batch=np.array([0, 30]))
    with pytest.raises(rs.RobustStanInputError, match="^theta: "):
        per_example.gradients(np.zeros(4))
    reference = model.per_example(data, rs.BetaD(0.3), strategy="copies").gradients_many(thetas, batch=batch)
    np.testing.assert_allclose(many, reference, rtol=1e-12, atol=1e-14)


@pytest.mark.stan
@pytest.mark.parametrize("strategy", ["copies", "linear_predictor"])
def test_gradients_in_a_factor_s_coordinates(glm_normal, strategy):
    """gradients_many_in(thetas, L) is gradients_many(thetas) @ L (Rob-ULA's chain coordinates); the
    linear-predictor strategy keeps [1, X] @ L between calls, and a new L (or batch) replaces it.
    Same float64 numbers summed in another order: 1e-12 relative to the largest entry."""
    rng = np.random.default_rng(5)
    data = {"X": rng.normal(size=(30, 3)), "y": rng.normal(size=30), "prior_scale_b": np.full(3, 2.5)}
    per_example = glm_normal.per_example(data, rs.BetaD(0.3), strategy=strategy)
    thetas = rng.normal(scale=0.4, size=(2, 5))
    for factor, batch in ((rng.normal(size=(5, 5)), None), (np.tril(rng.normal(size=(5, 5))), None),
                          (np.tril(rng.normal(size=(5, 5))), np.array([3, 3, 11])), (rng.normal(size=(5, 2)), None)):
        for _ in range(2):  # the second call takes the kept product
            expected = per_example.gradients_many(thetas, batch=batch) @ factor
            actual = per_example.gradients_many_in(thetas, factor, batch=batch)
            np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-12 * np.abs(expected).max())
    for bad_thetas, bad_factor in ((thetas, np.eye(4)), (np.zeros((1, 4)), np.eye(5)), (thetas, np.ones(5))):
        with pytest.raises(rs.RobustStanInputError, match="^theta, factor: "):
            per_example.gradients_many_in(bad_thetas, bad_factor)


def test_strategy_is_checked():
    student_t = rs.glm("student_t", standardize=False, engine=ENGINE)
    data = family_case("normal")[1]
    with pytest.raises(rs.RobustStanInputError, match="^strategy: 'linear_predictor' needs a built-in glm"):
        student_t.per_example(data, strategy="linear_predictor")
    with pytest.raises(rs.RobustStanInputError, match="^strategy: must be one of"):
        student_t.per_example(data, strategy="fast")
    with pytest.raises(rs.RobustStanInputError, match="^mode: 'per_example_linear_predictor' needs"):
        student_t.stan_data(data, mode="per_example_linear_predictor")
