"""The native losses (stan/robust_stan_native.hpp) against the Stan-language library on one program.

The built-in programs of the normal, bernoulli and poisson families compute the beta and gamma
total loss in C++ with a closed-form gradient (mode 0, the posterior, and mode 3, per-example
through the linear predictor). The same compiled program still runs the Stan-language functions
of robust_stan.stanfunctions, which the library tests check against quadrature and exact sums,
in two places: the per-observation generated quantity ``robust_loss`` and the per-example mode
by parameter copies (mode 1). So on one program, at a random point:

- value: log density (mode 0) minus the prior-only log density = -sum_i w_i robust_loss_i;
- gradient: its gradient = -sum_i w_i (row i of the per-example gradients by copies);
- per-example gradients through the linear predictor (native) = those by copies (Stan).

Both sides evaluate the same closed forms in double precision, in a different order (the native
loss sums the rows once; the Stan side adds exp(log_sum_exp(...)) or per-row terms), so they agree
to rounding: 1e-10 relative, with an absolute floor of 1e-10 times the largest term, which bounds
cancellation between rows of opposite sign in a gradient coordinate. The data reach the edges of
each family: linear predictors of +-40 (bernoulli: probabilities 1e-18 from 0 and 1), poisson
rates from e^-14 (below the integral table's grid) to e^9 (Stirling's series, beyond the grid),
a > 4 (a table with no pieces: every row summed directly), weights with a zero.

rs.robustify's rewrites take the native losses too, and tests/test_robustify.py checks them against
the Stan functions: the per-example gradients by mixed derivatives (weights as parameters: Stan
functions) against one gradient per row (data weights: native) for the linear and poisson programs.
"""

import numpy as np
import pytest

import robust_stan as rs

from .conftest import ENGINE

pytestmark = pytest.mark.stan  # every test here compiles or loads a Stan program

RTOL = 1e-10


def family_data(family: str, n: int = 40, seed: int = 0) -> dict:
    """Two predictors, one of which spreads the linear predictor over the family's whole range."""
    rng = np.random.default_rng(seed)
    spread = np.linspace(-1, 1, n)
    X = np.column_stack([spread, rng.normal(size=n)])
    if family == "normal":
        y = 1.0 + X @ np.array([2.0, -1.0]) + rng.normal(size=n)
        y[:4] += 12.0  # gross outliers
    elif family == "bernoulli":
        y = rng.integers(0, 2, n)
    else:
        y = rng.poisson(np.exp(np.clip(-2.5 + 11.5 * (spread + 1) / 2, -30, 9.0)))
    return {"X": X, "y": y, "prior_scale_b": np.full(2, 2.5)}


def point(family: str, dim: int) -> np.ndarray:
    """Unconstrained parameters that put the linear predictor at the family's edges (first column
    of X in [-1, 1]): bernoulli eta in about [-40, 40]; poisson log-rate in about [-14, 9]."""
    theta = np.zeros(dim)
    theta[:3] = {"normal": [0.5, 1.5, -0.8], "bernoulli": [0.2, 40.0, 0.5], "poisson": [-2.5, 11.5, 0.3]}[family]
    if family == "normal":
        theta[3] = np.log(1.3)  # sigma
    return theta


def assert_close(actual, expected, what):
    actual, expected = np.asarray(actual, float), np.asarray(expected, float)
    floor = 1e-10 * max(1.0, float(np.max(np.abs(expected))))
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=floor, err_msg=what)


def check_native_against_stan(model, data, theta, divergence, weights, what):
    """The three identities of the module docstring on one program."""
    program = model.compile()
    stan_data = model.stan_data(data, divergence, weights=weights)
    value, gradient = model.log_density_gradient(data, theta, divergence, weights=weights, jacobian=False)
    prior_value, prior_gradient = model.log_density_gradient(data, theta, divergence, weights=weights,
                                                             mode="prior", jacobian=False)
    losses = np.asarray(program.constrain(stan_data, theta)["robust_loss"], dtype=float)
    assert np.all(np.isfinite(losses)), what
    assert_close(value - prior_value, -np.dot(weights, losses), f"{what}: total loss")
    by_copies = model.per_example_gradients(data, theta, divergence, strategy="copies")
    assert_close(gradient - prior_gradient, -(weights @ by_copies), f"{what}: gradient")
    if model.per_example(data, divergence).strategy == "linear_predictor":
        assert_close(model.per_example_gradients(data, theta, divergence, strategy="linear_predictor"), by_copies,
                     f"{what}: per-example gradients")


@pytest.mark.filterwarnings("ignore:divergence. with beta = 5:robust_stan.RobustStanWarning")  # meant: a > 4
@pytest.mark.parametrize("family", ["normal", "bernoulli", "poisson"])
@pytest.mark.parametrize("divergence", [rs.BetaD(0.3), rs.GammaD(0.4), rs.BetaD(5.0), rs.GammaD(5.0)],
                         ids=["beta0.3", "gamma0.4", "beta5", "gamma5"])
def test_glm_native_loss_equals_the_stan_functions(family, divergence):
    model = rs.glm(family, standardize=False, engine=ENGINE)
    data = family_data(family)
    assert "rs_native_" in model.stan_code
    theta = point(family, model.unconstrained_dimension(data))
    weights = np.random.default_rng(1).uniform(0.2, 2.0, len(data["y"]))
    weights[3] = 0.0
    check_native_against_stan(model, data, theta, divergence, weights, f"{family} {divergence}")


@pytest.mark.parametrize("family", ["normal", "bernoulli", "poisson"])
def test_location_models_take_the_real_argument_overloads(family):
    """rs.location's programs pass one shared (real) value, a different C++ instantiation."""
    model = rs.location(family, standardize=False, engine=ENGINE)
    data = {"y": family_data(family)["y"]}
    dim = model.unconstrained_dimension(data)
    theta = np.full(dim, 0.4)
    weights = np.linspace(0.5, 1.5, len(data["y"]))
    for divergence in (rs.BetaD(0.5), rs.GammaD(0.5)):
        check_native_against_stan(model, data, theta, divergence, weights, f"location {family} {divergence}")


def test_native_gradient_matches_finite_differences():
    """The closed-form gradient against central differences of the native value itself (h = 1e-5:
    truncation O(h^2) times third derivatives of order 10 here, rounding 1e-16 |f| / h; 1e-6 relative)."""
    model = rs.glm("bernoulli", standardize=False, engine=ENGINE)
    data = family_data("bernoulli")
    theta = np.array([0.2, 3.0, 0.5])
    direction = np.array([0.3, -0.5, 0.8])
    for divergence in (rs.BetaD(0.3), rs.GammaD(0.4)):
        _, gradient = model.log_density_gradient(data, theta, divergence, jacobian=False)
        h = 1e-5
        up = model.log_density(data, theta + h * direction, divergence, jacobian=False)
        down = model.log_density(data, theta - h * direction, divergence, jacobian=False)
        assert (up - down) / (2 * h) == pytest.approx(gradient @ direction, rel=1e-6)


def test_a_custom_model_with_a_vector_scale():
    """rs.custom normal with a per-row mean and a per-row scale (a heteroscedastic regression):
    the vector-vector instantiation, with both arguments' gradients."""
    model = rs.custom("normal", data="int<lower=1> P; matrix[N, P] X;",
                      parameters="vector[P] b; vector[P] c;",  # c: also the name a loop of the program once took
                      priors="b ~ normal(0, 5); c ~ normal(0, 1);",
                      mu="X[n] * b", sigma="exp(X[n] * c)", engine=ENGINE)
    rng = np.random.default_rng(4)
    n = 30
    X = np.column_stack([np.ones(n), rng.normal(size=n)])
    y = X @ np.array([1.0, 2.0]) + np.exp(X @ np.array([0.0, 0.5])) * rng.normal(size=n)
    y[:3] -= 9.0
    data = {"X": X, "y": y, "P": 2}
    assert "rs_native_normal_total_loss" in model.stan_code
    theta = np.array([0.8, 1.7, 0.1, 0.4])
    for divergence in (rs.BetaD(0.3), rs.GammaD(0.3)):
        check_native_against_stan(model, data, theta, divergence, rng.uniform(0.5, 1.5, n), f"custom {divergence}")


def test_native_header_is_installed_and_kl_still_takes_the_stan_functions():
    """CmdStan users reach the header by rs.native_header_path(); KL (like the original gamma) stays
    with the Stan functions: its total is the sum of the per-row losses, as before."""
    header = rs.native_header_path()
    assert header.name == "robust_stan_native.hpp" and header.is_file()
    text = header.read_text()
    for family in ("normal", "bernoulli_logit", "poisson_log"):
        assert f"rs_native_{family}_total_loss" in text
    model = rs.glm("poisson", standardize=False, engine=ENGINE)
    data = family_data("poisson")
    theta = point("poisson", model.unconstrained_dimension(data))
    value = model.log_density(data, theta, rs.KL(), jacobian=False)
    prior = model.log_density(data, theta, rs.KL(), mode="prior", jacobian=False)
    losses = model.compile().constrain(model.stan_data(data, rs.KL()), theta)["robust_loss"]
    assert value - prior == pytest.approx(-np.sum(losses), rel=RTOL)
