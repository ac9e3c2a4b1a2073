"""Weights, learning rate and the per-example / prior-only modes of one compiled program.

All checks are log-density identities on the real compiled program, so they hold to
rounding (1e-10 relative), apart from the finite differences (central, h = 1e-5:
truncation error O(h^2) times third derivatives of order one, far below 1e-6).
"""

import numpy as np
import pytest

import robust_stan as rs

from .conftest import ENGINE

pytestmark = pytest.mark.stan  # every test here compiles or loads a Stan program

DIVERGENCES = [rs.KL(), rs.BetaD(0.4), rs.GammaD(0.3), rs.GammaD(0.3, form="original")]
DECOMPOSABLE = DIVERGENCES[:3]
IDS = ["KL", "beta", "gamma", "gamma-original"]
RTOL = 1e-10


def glm_data(n=12, p=3, seed=0):
    """A small regression with one gross outlier; prior scales fixed so that
    duplicating or removing rows changes nothing but the likelihood."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    y = 0.5 + X @ np.linspace(-1, 1, p) + rng.normal(size=n)
    y[0] += 8.0
    return {"X": X, "y": y, "prior_scale_b": np.full(p, 2.5)}


PER_OBSERVATION = ("X", "y", "g")


def rows(data, index):
    """The data set made of the given rows (repeats allowed); other entries unchanged."""
    return {k: (np.asarray(v)[index] if k in PER_OBSERVATION else v) for k, v in data.items()}


def a_point(dim, seed=1):
    return np.random.default_rng(seed).normal(scale=0.5, size=dim)


@pytest.mark.parametrize("divergence", DIVERGENCES, ids=IDS)
def test_weight_two_equals_duplicating_an_observation(glm_normal, divergence):
    data = glm_data()
    theta = a_point(5)
    weights = np.ones(12)
    weights[[0, 3]] = 2.0
    weighted = glm_normal.log_density(data, theta, divergence=divergence, weights=weights)
    duplicated = glm_normal.log_density(rows(data, np.r_[np.arange(12), 0, 3]), theta, divergence=divergence)
    assert weighted == pytest.approx(duplicated, rel=RTOL)


@pytest.mark.parametrize("divergence", DIVERGENCES, ids=IDS)
def test_one_row_scalar_loss_equals_the_vector_form(glm_normal, divergence):
    """A one-row data set takes the library's scalar path (the per-example mode's);
    the same row beside a zero-weight row takes the vector path."""
    data = glm_data()
    theta = a_point(5, seed=3)
    for i, weight in ((0, 1.0), (4, 0.7)):
        one = glm_normal.log_density_gradient(rows(data, [i]), theta, divergence=divergence,
                                              weights=np.array([weight]))
        two = glm_normal.log_density_gradient(rows(data, [i, 1]), theta, divergence=divergence,
                                              weights=np.array([weight, 0.0]))
        assert one[0] == pytest.approx(two[0], rel=RTOL)
        np.testing.assert_allclose(one[1], two[1], rtol=RTOL, atol=1e-12)


@pytest.mark.parametrize("divergence", DIVERGENCES, ids=IDS)
def test_weight_zero_equals_removing_an_observation(glm_normal, divergence):
    data = glm_data()
    theta = a_point(5)
    weights = np.ones(12)
    weights[[0, 5]] = 0.0
    weighted, grad_w = glm_normal.log_density_gradient(data, theta, divergence=divergence, weights=weights)
    kept = np.setdiff1d(np.arange(12), [0, 5])
    removed, grad_r = glm_normal.log_density_gradient(rows(data, kept), theta, divergence=divergence)
    assert weighted == pytest.approx(removed, rel=RTOL)
    np.testing.assert_allclose(grad_w, grad_r, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("divergence", DIVERGENCES, ids=IDS)
def test_learning_rate_scales_the_loss_not_the_prior(glm_normal, divergence):
    """log pi_w = log prior - w * L, so the prior-only mode and w = 1 predict every w."""
    data = glm_data()
    theta = a_point(5)
    prior = glm_normal.log_density(data, theta, divergence=divergence, mode="prior")
    at_one = glm_normal.log_density(data, theta, divergence=divergence)
    for w in (0.25, 3.0):
        at_w = glm_normal.log_density(data, theta, divergence=divergence, learning_rate=w)
        assert at_w == pytest.approx(prior + w * (at_one - prior), rel=RTOL)


def test_prior_mode_is_the_prior(glm_normal):
    """Mode 'prior' ignores y entirely (same value whatever the outcomes)."""
    data = glm_data()
    theta = a_point(5)
    other = dict(data, y=data["y"] + 100.0)
    a = glm_normal.log_density(data, theta, divergence=rs.BetaD(0.4), mode="prior")
    b = glm_normal.log_density(other, theta, divergence=rs.BetaD(0.4), mode="prior")
    assert a == b


def single_loss_gradient(model, data, index, theta, divergence):
    """grad l_i from a one-observation data set: -(posterior - prior) in mode 0, no Jacobian."""
    one = rows(data, [index])
    _, g_post = model.log_density_gradient(one, theta, divergence=divergence, jacobian=False)
    _, g_prior = model.log_density_gradient(one, theta, divergence=divergence, mode="prior", jacobian=False)
    return -(g_post - g_prior)


def single_loss(model, data, index, theta, divergence):
    one = rows(data, [index])
    return -(model.log_density(one, theta, divergence=divergence, jacobian=False)
             - model.log_density(one, theta, divergence=divergence, mode="prior", jacobian=False))


@pytest.mark.parametrize("divergence", DECOMPOSABLE, ids=IDS[:3])
def test_per_example_gradients_equal_single_observation_gradients(glm_normal, divergence):
    data = glm_data()
    theta = a_point(5)
    G = glm_normal.per_example_gradients(data, theta, divergence=divergence)
    assert G.shape == (12, 5)
    for i in range(12):
        np.testing.assert_allclose(G[i], single_loss_gradient(glm_normal, data, i, theta, divergence),
                                   rtol=1e-9, atol=1e-12)
    # and against central finite differences of the single-observation loss (two rows)
    h = 1e-5
    for i in (0, 7):
        fd = np.array([(single_loss(glm_normal, data, i, theta + h * e, divergence)
                        - single_loss(glm_normal, data, i, theta - h * e, divergence)) / (2 * h)
                       for e in np.eye(5)])
        np.testing.assert_allclose(G[i], fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("divergence", DECOMPOSABLE, ids=IDS[:3])
def test_per_example_rows_sum_to_the_full_loss_gradient(glm_normal, divergence):
    data = glm_data()
    theta = a_point(5, seed=4)
    weights = np.linspace(0.5, 1.5, 12)
    G = glm_normal.per_example_gradients(data, theta, divergence=divergence)
    _, g_post = glm_normal.log_density_gradient(data, theta, divergence=divergence, weights=weights, jacobian=False)
    _, g_prior = glm_normal.log_density_gradient(data, theta, divergence=divergence, mode="prior", jacobian=False)
    np.testing.assert_allclose(weights @ G, -(g_post - g_prior), rtol=1e-9, atol=1e-12)


def test_per_example_minibatch_rows(glm_normal):
    data = glm_data()
    theta = a_point(5, seed=2)
    full = glm_normal.per_example_gradients(data, theta, divergence=rs.BetaD(0.4))
    batch = np.array([9, 2, 2, 11])
    part = glm_normal.per_example_gradients(data, theta, divergence=rs.BetaD(0.4), batch=batch)
    np.testing.assert_allclose(part, full[batch], rtol=1e-12, atol=0)


def test_per_example_mode_rejects_gamma_original(glm_normal):
    with pytest.raises(rs.RobustStanInputError, match="divergence"):
        glm_normal.per_example_gradients(glm_data(), a_point(5), divergence=rs.GammaD(0.3, form="original"))


@pytest.fixture(scope="module")
def hierarchical():
    model = rs.custom(
        "normal",
        data="int<lower=1> P; matrix[N, P] X; int<lower=1> G; array[N] int<lower=1, upper=G> g;",
        parameters="vector[P] b; vector[G] u; real<lower=0> tau; real<lower=0> sigma;",
        priors="b ~ normal(0, 5); u ~ normal(0, tau); tau ~ exponential(1); sigma ~ exponential(1);",
        mu="X[n] * b + u[g[n]]", sigma="sigma", engine=ENGINE)
    model.compile(show_progress=False)
    return model


def test_per_example_gradients_of_a_hierarchical_custom_model(hierarchical):
    rng = np.random.default_rng(3)
    n, p, groups = 10, 2, 3
    data = {"X": rng.normal(size=(n, p)), "g": rng.integers(1, groups + 1, n), "G": groups, "P": p}
    data["y"] = data["X"] @ np.array([1.0, -0.5]) + rng.normal(size=n)
    dim = p + groups + 2
    assert hierarchical.unconstrained_dimension(data) == dim
    theta = a_point(dim, seed=5)
    divergence = rs.BetaD(0.3)
    G = hierarchical.per_example_gradients(data, theta, divergence=divergence)
    assert G.shape == (n, dim)
    for i in range(n):
        np.testing.assert_allclose(G[i], single_loss_gradient(hierarchical, data, i, theta, divergence),
                                   rtol=1e-9, atol=1e-12)
        # the loss of row i does not involve the other groups' effects, nor tau
        others = [p + k for k in range(groups) if k + 1 != data["g"][i]]
        assert np.all(G[i, others] == 0) and G[i, p + groups] == 0
    _, g_post = hierarchical.log_density_gradient(data, theta, divergence=divergence, jacobian=False)
    _, g_prior = hierarchical.log_density_gradient(data, theta, divergence=divergence, mode="prior", jacobian=False)
    np.testing.assert_allclose(G.sum(axis=0), -(g_post - g_prior), rtol=1e-9, atol=1e-12)
