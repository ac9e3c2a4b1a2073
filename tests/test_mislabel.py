"""The mislabelling likelihood, ``rs.glm(family, mislabel=True)`` (bernoulli and categorical).

Each observed label is the true one with probability 1 - e and each of the other K - 1 classes with
probability e / (K - 1): with s = softmax(eta), p(y = k) = (1 - e) s_k + e / (K - 1) (1 - s_k);
bernoulli: p(1) = e + (1 - 2 e) inv_logit(eta). Two programs (bernoulli; categorical, K = 3):

- exact: the log density (``jacobian=False``) at random unconstrained points, each minus its value
  at a reference point, against the same difference of a NumPy implementation written here from
  the formula above and DESIGN.md section 2's losses (the glm's normal priors; e's uniform prior
  and the constants of Stan's ``~`` statements cancel in the difference), under KL, beta, gamma and
  gamma (original form). Both sides sum O(N) terms of order one in double precision: they agree to
  1e-10 relative to the log density's size. The points reach e at 2e-6 and 0.98 of its range
  (bernoulli: e = 1e-6 and 0.49) and linear predictors of +-30.
- the bernoulli program's beta and gamma losses run in C++ (robust_stan_native.hpp), which sees
  only the mislabelled logits; e's gradient reaches it through the chain rule. Checked against the
  Stan functions (``tests/test_native_losses.check_native_against_stan``: value, gradient, and the
  per-example gradients through the linear predictor, which copy e per row) and against central
  differences of the NumPy value; the same identities on the categorical program (pointwise
  losses, per-example gradients by copies).
- the label-flip case of examples/select_divergence.py: coverage of the true coefficients by the
  90% intervals, mislabel glm against the plain glm.
- bad input names the argument.
"""

import numpy as np
import pytest
from scipy.special import expit, log_softmax
from scipy.stats import norm

import robust_stan as rs

from .conftest import ENGINE
from .test_native_losses import check_native_against_stan

DIVERGENCES = [rs.KL(), rs.BetaD(0.5), rs.GammaD(0.5), rs.GammaD(0.5, form="original")]
IDS = ["KL", "beta", "gamma", "gamma_original"]
N, P, K = 50, 2, 3
PRIOR_SCALE = 2.5  # data['prior_scale_b'], given explicitly


@pytest.fixture(scope="module")
def bernoulli_mislabel():
    return rs.glm("bernoulli", mislabel=True, engine=ENGINE)


@pytest.fixture(scope="module")
def categorical_mislabel():
    return rs.glm("categorical", mislabel=True, engine=ENGINE)


def design(seed: int = 0) -> np.ndarray:
    """A first column spread over [-1, 1] (a slope of 30 puts eta at +-30) and a normal second one."""
    rng = np.random.default_rng(seed)
    return np.column_stack([np.linspace(-1, 1, N), rng.normal(size=N)])


def numpy_log_density(log_p: np.ndarray, y: np.ndarray, divergence, log_prior: float) -> float:
    """log prior - sum_i l_i, with log_p (N, K) the log probabilities of every class and y the
    observed class (0-based), the losses of DESIGN.md section 2 (weights 1, learning rate 1)."""
    lp = log_p[np.arange(len(y)), y]
    if isinstance(divergence, rs.KL):
        return log_prior + lp.sum()
    a = divergence.param
    integral = np.exp((1 + a) * log_p).sum(axis=1)
    if isinstance(divergence, rs.BetaD):
        return log_prior - np.sum(-np.exp(a * lp) / a + integral / (1 + a))
    if divergence.form == "decomposable":
        return log_prior - np.sum(-(1 + a) / a * np.exp(a * lp) / integral ** (a / (1 + a)))
    return log_prior - (-len(y) / a * np.log(np.mean(np.exp(a * lp))) + len(y) / (1 + a) * np.log(np.mean(integral)))


def bernoulli_reference(theta: np.ndarray, data: dict, divergence) -> float:
    """theta = (alpha, b_1, b_2, u) with e = 0.5 inv_logit(u) (Stan's transform of <lower=0, upper=0.5>)."""
    alpha, b, e = theta[0], theta[1:1 + P], 0.5 * expit(theta[-1])
    eta = alpha + data["X"] @ b
    p1 = e + (1 - 2 * e) * expit(eta)  # p(0) is written the same way, not as 1 - p(1)
    p0 = e + (1 - 2 * e) * expit(-eta)
    log_prior = norm.logpdf(alpha, 0, 2.5) + norm.logpdf(b, 0, PRIOR_SCALE).sum()
    return numpy_log_density(np.log(np.column_stack([p0, p1])), data["y"], divergence, log_prior)


def categorical_reference(theta: np.ndarray, data: dict, divergence) -> float:
    """theta = (alpha (K-1), B (P x K-1, column-major as Stan stores it), u), e = (K-1)/K inv_logit(u)."""
    alpha = theta[:K - 1]
    B = theta[K - 1:K - 1 + P * (K - 1)].reshape(K - 1, P).T
    e = (K - 1) / K * expit(theta[-1])
    eta = np.column_stack([np.zeros(N), alpha + data["X"] @ B])
    s = np.exp(log_softmax(eta, axis=1))
    p = (1 - e) * s + e / (K - 1) * (1 - s)
    log_prior = norm.logpdf(alpha, 0, 2.5).sum() + norm.logpdf(B, 0, PRIOR_SCALE).sum()
    return numpy_log_density(np.log(p), data["y"] - 1, divergence, log_prior)


def random_points(dim: int, rng: np.random.Generator) -> np.ndarray:
    """A reference point, then random points and two at the edges: e at 2e-6 and 0.98 of its range,
    with a slope of 30 on the spread column (linear predictors of +-30)."""
    points = [np.r_[np.full(dim - 1, 0.2), 0.0]]
    points += [np.r_[rng.normal(0, 1.5, dim - 1), rng.normal(0, 2)] for _ in range(4)]
    for u in (np.log(2e-6 / (1 - 2e-6)), np.log(0.98 / 0.02)):
        edge = np.r_[rng.normal(0, 0.5, dim - 1), u]
        edge[1 if dim == 4 else K - 1] = 30.0  # b_1, or B[1, 1]
        points.append(edge)
    return np.array(points)


def assert_log_density_matches(model, data, reference, divergence):
    rng = np.random.default_rng(3)
    points = random_points(model.unconstrained_dimension(data), rng)
    ours = np.array([model.log_density(data, theta, divergence, jacobian=False) for theta in points])
    theirs = np.array([reference(theta, data, divergence) for theta in points])
    assert np.all(np.isfinite(ours)) and np.all(np.isfinite(theirs))
    scale = np.max(np.abs(theirs))
    np.testing.assert_allclose(ours[1:] - ours[0], theirs[1:] - theirs[0], rtol=0, atol=1e-10 * scale)


def bernoulli_data(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"X": design(seed), "y": rng.integers(0, 2, N), "prior_scale_b": np.full(P, PRIOR_SCALE)}


def categorical_data(seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    return {"X": design(seed), "y": rng.integers(1, K + 1, N), "K": K, "prior_scale_b": np.full(P, PRIOR_SCALE)}


@pytest.mark.stan
@pytest.mark.parametrize("divergence", DIVERGENCES, ids=IDS)
def test_bernoulli_log_density_is_the_mislabelled_likelihood(bernoulli_mislabel, divergence):
    assert_log_density_matches(bernoulli_mislabel, bernoulli_data(), bernoulli_reference, divergence)


@pytest.mark.stan
@pytest.mark.parametrize("divergence", DIVERGENCES, ids=IDS)
def test_categorical_log_density_is_the_mislabelled_likelihood(categorical_mislabel, divergence):
    assert_log_density_matches(categorical_mislabel, categorical_data(), categorical_reference, divergence)


@pytest.mark.stan
@pytest.mark.parametrize("divergence", [rs.KL(), rs.BetaD(0.3), rs.GammaD(0.4)], ids=["KL", "beta", "gamma"])
def test_the_native_loss_and_per_example_gradients_carry_the_flip_rate(bernoulli_mislabel, divergence):
    data = bernoulli_data()
    theta = np.array([0.2, 3.0, 0.5, -1.0])
    weights = np.random.default_rng(2).uniform(0.2, 2.0, N)
    assert "rs_native_bernoulli_logit_total_loss" in bernoulli_mislabel.stan_code
    check_native_against_stan(bernoulli_mislabel, data, theta, divergence, weights, f"mislabel {divergence}")


@pytest.mark.stan
@pytest.mark.parametrize("divergence", [rs.KL(), rs.BetaD(0.3)], ids=["KL", "beta"])
def test_the_categorical_pointwise_losses_and_per_example_gradients_agree(categorical_mislabel, divergence):
    """The same identities on the categorical program (its generated quantities and per-example mode)."""
    data = categorical_data()
    theta = np.r_[np.random.default_rng(5).normal(0, 1, 6), 0.5]
    weights = np.random.default_rng(2).uniform(0.2, 2.0, N)
    check_native_against_stan(categorical_mislabel, data, theta, divergence, weights, f"categorical {divergence}")


@pytest.mark.stan
def test_the_gradient_matches_differences_of_the_numpy_density(bernoulli_mislabel):
    """Central differences, h = 1e-5: truncation O(h^2) times third derivatives of order N, rounding
    1e-16 |f| / h, so 1e-6 relative holds with room; e's direction is the last coordinate."""
    data = bernoulli_data()
    theta = np.array([0.2, 3.0, 0.5, -1.0])
    h = 1e-5
    for divergence in (rs.KL(), rs.BetaD(0.3), rs.GammaD(0.4)):
        _, gradient = bernoulli_mislabel.log_density_gradient(data, theta, divergence, jacobian=False)
        for direction in (np.eye(4)[-1], np.array([0.3, -0.5, 0.8, 0.6])):
            difference = (bernoulli_reference(theta + h * direction, data, divergence)
                          - bernoulli_reference(theta - h * direction, data, divergence)) / (2 * h)
            assert gradient @ direction == pytest.approx(difference, rel=1e-6), f"{divergence}"


# --- the label-flip case -----------------------------------------------------------------------

TRUE_B = np.array([1.5, -1.0])
COVERAGE_DATASETS, COVERAGE_ROWS = 20, 200


def flipped_logistic_data(rows: int, seed: int) -> dict:
    """examples/select_divergence.py's ``discrete_data("logistic_flips", rows, seed)``: y ~
    Bernoulli(inv_logit(0.3 + X b)), X ~ N(0, I_2), and a tenth of the labels, chosen at random, flipped."""
    rng = np.random.default_rng([seed, 10])
    X = rng.normal(size=(rows, TRUE_B.size))
    y = rng.binomial(1, expit(0.3 + X @ TRUE_B))
    flipped = rng.choice(rows, rows // 10, replace=False)
    y[flipped] = 1 - y[flipped]
    return {"X": X, "y": y}


def interval_coverage(model, data_sets) -> float:
    """The share of the coefficients, over the data sets, whose central 90% posterior interval holds b."""
    held = []
    for seed, data in data_sets:
        fit = model.sample(data, seed=seed, chains=2, iter_warmup=400, iter_sampling=600, show_progress=False)
        b = np.asarray(fit.posterior["b"]).reshape(-1, TRUE_B.size)
        low, high = np.quantile(b, [0.05, 0.95], axis=0)
        held.extend((low <= TRUE_B) & (TRUE_B <= high))
    return float(np.mean(held))


# short chains on the (b, flip_rate) ridge often warn of R-hat just above 1.01; coverage is what is tested
@pytest.mark.stan
@pytest.mark.statistical_study
@pytest.mark.filterwarnings("ignore:nuts. the chains have not converged:robust_stan.RobustStanWarning")
def test_the_mislabel_glm_covers_the_truth_on_random_label_flips(bernoulli_mislabel):
    """20 data sets of N = 200, a tenth of the labels flipped. A calibrated 90% interval holds b with
    probability 0.9; the two coefficients of one data set may be correlated, so the share over 2 x 20
    intervals has a standard error at most that of 20 independent indicators, sqrt(0.9 0.1 / 20) =
    0.067 (the intervals' own Monte Carlo error, 1200 draws at the 5% and 95% quantiles, moves a
    share by far less). The mislabel glm's share must lie within 3 of those se of 0.9 (above 0.699);
    the plain glm's, attenuated by the flips (0.355 over 100 data sets in the label-flip study,
    examples/results/select_divergence), must lie below that band."""
    data_sets = [(seed, flipped_logistic_data(COVERAGE_ROWS, seed)) for seed in range(1, COVERAGE_DATASETS + 1)]
    bound = 3 * np.sqrt(0.9 * 0.1 / COVERAGE_DATASETS)
    mislabel = interval_coverage(bernoulli_mislabel, data_sets)
    plain = interval_coverage(rs.glm("bernoulli", engine=ENGINE), data_sets)
    assert abs(mislabel - 0.9) <= bound, f"mislabel glm covers {mislabel:.3f}"
    assert plain < 0.9 - bound, f"plain glm covers {plain:.3f}"


# --- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["normal", "poisson", "binomial", "multi_normal"])
def test_mislabel_on_a_family_without_labels_names_the_argument(family):
    with pytest.raises(rs.RobustStanInputError, match=r"mislabel: .*bernoulli and categorical.*" + family):
        rs.glm(family, mislabel=True)


def test_mislabel_must_be_a_bool():
    with pytest.raises(rs.RobustStanInputError, match="mislabel: must be True or False"):
        rs.glm("bernoulli", mislabel="yes")
