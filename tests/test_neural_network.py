"""The neural-network custom specification (rs.mlp): its vectorised posterior mode and its
per-row per-example mode describe the same model, and its gradients are derivatives."""

import numpy as np
import pytest
from scipy.optimize import approx_fprime

import robust_stan as rs

from .conftest import ENGINE


@pytest.fixture(scope="module")
def network():
    model = rs.mlp("normal", engine=ENGINE)
    model.compile(show_progress=False)
    return model


def network_data(n=12, p=2, hidden=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    return {"X": X, "y": np.sin(X[:, 0]) + 0.1 * rng.normal(size=n), "H": hidden, "P": p}


@pytest.mark.stan
@pytest.mark.parametrize("divergence", [rs.KL(), rs.BetaD(0.3), rs.GammaD(0.3)], ids=["KL", "beta", "gamma"])
def test_per_row_and_vectorised_forms_agree(network, divergence):
    """Sum of the per-example gradients (per-row expression) = minus the data part of the
    posterior gradient (vectorised expression), to rounding."""
    data = network_data()
    dim = network.unconstrained_dimension(data)
    assert dim == 2 * 3 + 3 + 3 * 3 + 3 + 3 + 1 + 1
    theta = np.random.default_rng(1).normal(scale=0.7, size=dim)
    G = network.per_example_gradients(data, theta, divergence=divergence)
    _, g_post = network.log_density_gradient(data, theta, divergence=divergence, jacobian=False)
    _, g_prior = network.log_density_gradient(data, theta, divergence=divergence, mode="prior", jacobian=False)
    np.testing.assert_allclose(G.sum(axis=0), -(g_post - g_prior), rtol=1e-9, atol=1e-10)


@pytest.mark.stan
def test_gradient_matches_finite_differences(network):
    data = network_data(seed=2)
    theta = np.random.default_rng(3).normal(scale=0.7, size=network.unconstrained_dimension(data))
    _, gradient = network.log_density_gradient(data, theta, divergence=rs.BetaD(0.3))
    numeric = approx_fprime(theta, lambda t: network.log_density(data, t, divergence=rs.BetaD(0.3)), 1e-6)
    # forward differences with step 1e-6: truncation and rounding errors about 1e-6 x the
    # curvature scale, so 1e-4 bounds them with room
    np.testing.assert_allclose(gradient, numeric, rtol=1e-4, atol=1e-4)


def test_unknown_family_and_vectorised_argument():
    with pytest.raises(rs.RobustStanInputError, match=r"^family: the network has a 'normal', 'student_t' or 'bernoulli'"):
        rs.mlp("poisson")
    with pytest.raises(rs.RobustStanInputError, match=r"^vectorised: \['sigma'\] are not arguments"):
        rs.custom("normal", parameters="real m;", mu="m", vectorised={"sigma": "1"})


@pytest.mark.stan
def test_network_output_reproduces_the_programs_own_log_likelihood(network):
    """rs.network_output computes the location mu in NumPy; Stan's generated log_lik of the same
    draws is normal_lpdf(y | mu, sigma), so the two agree to rounding."""
    data = network_data(n=30, seed=4)
    fit = network.variational(data, rs.KL(), draws=50, iter=200, seed=1, show_progress=False)
    mu = rs.network_output(fit, data["X"])
    sigma = np.asarray(fit.draws("sigma")).reshape(-1, 1)
    expected = -0.5 * ((data["y"] - mu) / sigma) ** 2 - np.log(sigma) - 0.5 * np.log(2 * np.pi)
    np.testing.assert_allclose(np.asarray(fit.draws("log_lik")).reshape(mu.shape), expected, rtol=1e-10, atol=1e-10)
    with pytest.raises(rs.RobustStanInputError, match=r"^X: expected a \(rows, 2\) array"):
        rs.network_output(fit, data["X"][:, :1])
