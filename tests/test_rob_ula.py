"""Rob-ULA on a conjugate normal model: exact ULA moments, robustness, bad input.

Model: y_i ~ N(mu, 1), mu ~ N(0, 10^2) (rs.location("normal", known={"sigma": 1}),
no standardisation). -log posterior is quadratic with curvature lam = n + 1/100,
posterior mean m = sum(y) / lam and variance 1/lam. ULA with step eta is then the
AR(1) chain mu' = (1 - eta lam) mu + eta lam m + sqrt(2 eta) xi, whose stationary
law is N(m, (1/lam) / (1 - eta lam / 2)): the mean is exact and the variance has a
known bias, which the test predicts rather than tolerates.
"""

import numpy as np
import pytest

import robust_stan as rs
from robust_stan.arviz_output import group_names

from .conftest import ENGINE


@pytest.fixture(scope="module")
def normal_known_sigma():
    model = rs.location("normal", known={"sigma": 1.0}, standardize=False, engine=ENGINE)
    model.compile(show_progress=False)
    return model


def conjugate(y):
    lam = len(y) + 1 / 100
    return y.sum() / lam, 1 / lam, lam


def test_plain_ula_matches_the_exact_ula_law(normal_known_sigma):
    y = np.random.default_rng(0).normal(0.7, 1.0, 40)
    m, v, lam = conjugate(y)
    eta = 0.2 / lam
    fit = rs.rob_ula(normal_known_sigma, {"y": y}, epsilon=0.0, estimator="mean", step_size=eta,
                     iters=5000, warmup=200, chains=4, seed=1, show_progress=False)
    mu = fit.draws("mu")
    assert mu.shape == (4, 5000)
    v_ula = v / (1 - eta * lam / 2)  # 11% above the posterior variance
    # Monte Carlo error: the chain is AR(1) with rho = 1 - eta lam = 0.8, so
    # ESS(mean) = N (1 - rho)/(1 + rho) and ESS(variance) = N (1 - rho^2)/(1 + rho^2).
    rho, N = 1 - eta * lam, mu.size
    se_mean = np.sqrt(v_ula / (N * (1 - rho) / (1 + rho)))
    se_var = v_ula * np.sqrt(2 / (N * (1 - rho**2) / (1 + rho**2)))
    assert abs(mu.mean() - m) < 4 * se_mean
    assert abs(mu.var() - v_ula) < 4 * se_var
    assert abs(mu.var() - v) > 4 * se_var  # the bias is real and the test can see it
    stats = fit.to_arviz().sample_stats
    assert {"step_size", "kept_fraction", "lp"} <= set(stats.data_vars)
    assert np.allclose(stats["step_size"], eta) and np.allclose(stats["kept_fraction"], 1.0)
    summary = fit.summary()
    assert summary.loc["mu", "r_hat"] < 1.01


def test_lrv_ignores_planted_outliers_where_ula_does_not(normal_known_sigma):
    rng = np.random.default_rng(3)
    clean = rng.normal(0.0, 1.0, 80)
    y = np.concatenate([clean, rng.normal(10.0, 1.0, 20)])  # 20% at +10 sd
    m_clean, v_clean, _ = conjugate(clean)
    data = {"y": y}
    kwargs = dict(iters=1500, warmup=200, chains=2, seed=4, show_progress=False)
    robust = rs.rob_ula(normal_known_sigma, data, epsilon=0.2, estimator="lrv", **kwargs)
    plain = rs.rob_ula(normal_known_sigma, data, epsilon=0.2, estimator="mean", **kwargs)
    sd = np.sqrt(v_clean)  # 0.11
    # ULA follows the outliers: its mean moves by about 0.2 * 10 = 2 (18 posterior sds).
    assert plain.draws("mu").mean() - m_clean > 1.5
    # Rob-ULA keeps the (1 - 0.2)^2 = 64% of gradients in the shortest interval: all clean,
    # so its drift is a trimmed mean of the clean gradients, within a few posterior sds.
    assert abs(robust.draws("mu").mean() - m_clean) < 3 * sd
    assert np.nanmean(robust.draws("kept_fraction")) == pytest.approx(0.64, abs=0.01)


def test_default_step_size_comes_from_the_curvature(normal_known_sigma):
    y = np.random.default_rng(5).normal(size=30)
    fit = rs.rob_ula(normal_known_sigma, {"y": y}, epsilon=0.1, iters=20, warmup=0, chains=1,
                     seed=2, show_progress=False)
    lam = 30 + 1 / 100
    assert fit.settings.step_size == pytest.approx(0.1 / lam, rel=1e-3)


def test_default_step_size_ignores_the_curvature_of_dropped_outliers(glm_normal):
    """20% of rows with x = 50 (high leverage): they add about 0.2 n 2500 / sigma^2 to the
    Hessian of the plain mean's drift, against about n for the clean rows. The robust drift
    drops them, so its step is hundreds of times larger than plain ULA's."""
    rng = np.random.default_rng(9)
    X = np.vstack([rng.normal(size=(80, 2)), np.full((20, 2), 50.0)])
    y = 1 + X @ [1.0, -1.0] + rng.normal(size=100)
    kwargs = dict(epsilon=0.2, iters=1, warmup=0, chains=1, seed=3, show_progress=False,
                  generated_quantities=False, log_density=False)
    robust = rs.rob_ula(glm_normal, {"X": X, "y": y}, estimator="lrv", **kwargs).settings.step_size
    plain = rs.rob_ula(glm_normal, {"X": X, "y": y}, estimator="mean", **kwargs).settings.step_size
    assert robust > 100 * plain


def test_generated_quantities_and_log_density_can_be_left_out(normal_known_sigma):
    y = np.random.default_rng(5).normal(size=30)
    data = {"y": y}
    kwargs = dict(epsilon=0.1, step_size=1e-3, iters=5, warmup=0, chains=2, seed=2, show_progress=False)
    full = rs.rob_ula(normal_known_sigma, data, **kwargs)
    # log_lik is deterministic: -log p(y_i | mu) at each draw, on the httpstan oracle too.
    mu = full.draws("mu")
    expected = -0.5 * np.log(2 * np.pi) - 0.5 * (y - mu[..., None]) ** 2
    np.testing.assert_allclose(full.draws("log_lik"), expected, rtol=1e-12)
    # y_rep ~ N(mu, 1) with fresh noise at every draw: the 300 standardised residuals have mean 0
    # (sd 1/sqrt(300) = 0.058) and sd 1 (sd about 1/sqrt(600) = 0.041); 4 of those sds each.
    residuals = full.draws("y_rep") - mu[..., None]
    assert abs(residuals.mean()) < 4 * 0.058 and abs(residuals.std() - 1) < 4 * 0.041
    assert not np.allclose(residuals[0, 0], residuals[0, 1])
    np.testing.assert_array_equal(rs.rob_ula(normal_known_sigma, data, **kwargs).draws("y_rep"), full.draws("y_rep"))
    assert "posterior_predictive" in group_names(full.to_arviz())
    lean = rs.rob_ula(normal_known_sigma, data, generated_quantities=False, log_density=False, **kwargs)
    np.testing.assert_array_equal(lean.draws("mu"), mu)  # same seed, same chain
    idata = lean.to_arviz()
    assert "log_likelihood" not in group_names(idata) and "lp" not in idata.sample_stats
    with pytest.raises(rs.RobustStanInputError, match="no 'log_lik' draws"):
        lean.draws("log_lik")
    assert lean.diagnostics()["diverged_chains"] == 0


def test_clean_gradient_total_is_the_mean_times_one_minus_epsilon_n(normal_known_sigma):
    """(1 - epsilon) n times the plain mean is learning rate 1 - epsilon with total n: same chain."""
    y = np.random.default_rng(8).normal(size=30)
    kwargs = dict(estimator="mean", step_size=1e-3, iters=50, warmup=0, chains=2, seed=3, show_progress=False,
                  generated_quantities=False, log_density=False)
    clean = rs.rob_ula(normal_known_sigma, {"y": y}, epsilon=0.2, gradient_total="clean", **kwargs)
    tempered = rs.rob_ula(normal_known_sigma, {"y": y}, epsilon=0.2, learning_rate=0.8, **kwargs)
    plain = rs.rob_ula(normal_known_sigma, {"y": y}, epsilon=0.2, **kwargs)
    np.testing.assert_allclose(clean.draws("mu"), tempered.draws("mu"), rtol=1e-12)
    assert not np.allclose(clean.draws("mu"), plain.draws("mu"))


def test_a_too_large_step_diverges_with_a_warning(normal_known_sigma):
    """eta lam = 30: the chain multiplies its distance to the mean by 29 each step."""
    y = np.random.default_rng(6).normal(size=30)
    with pytest.warns(RuntimeWarning, match="diverged"):
        fit = rs.rob_ula(normal_known_sigma, {"y": y}, epsilon=0.1, step_size=1.0, iters=2000,
                         warmup=0, chains=1, seed=2, show_progress=False)
    assert np.isnan(fit.draws("mu")[0, -1])
    assert fit.diagnostics()["diverged_chains"] == 1


@pytest.mark.parametrize("kwargs,match", [
    ({"epsilon": 0.5}, r"^epsilon: must lie in \[0, 0.5\)"),
    ({"epsilon": -0.1}, r"^epsilon: "),
    ({"epsilon": 0.1, "step_size": 0.0}, r"^step_size: must be positive"),
    ({"epsilon": 0.1, "step_size": -1e-3}, r"^step_size: "),
    ({"epsilon": 0.1, "estimator": "median"}, r"^estimator: unknown estimator 'median'"),
    ({"epsilon": 0.1, "divergence": rs.GammaD(0.3, form="original")}, r"^divergence: the original gamma form"),
    ({"epsilon": 0.1, "iters": 0}, r"^iters: "),
    ({"epsilon": 0.1, "chains": True}, r"^chains: must be an integer >= 1, got True"),
    ({"epsilon": 0.1, "warmup": -1}, r"^warmup: must be an integer >= 0"),
    ({"epsilon": 0.1, "gradient_total": "N"}, r"^gradient_total: must be 'n' or 'clean'"),
])
def test_bad_input(normal_known_sigma, kwargs, match):
    with pytest.raises(rs.RobustStanInputError, match=match):
        rs.rob_ula(normal_known_sigma, {"y": np.zeros(5)}, show_progress=False, **kwargs)


def test_data_failing_the_family_checks():
    model = rs.glm("poisson", engine=ENGINE)
    with pytest.raises(rs.RobustStanInputError, match=r"^y: counts must be >= 0"):
        rs.rob_ula(model, {"X": np.ones((3, 1)), "y": np.array([1, -2, 0])}, epsilon=0.1, show_progress=False)
