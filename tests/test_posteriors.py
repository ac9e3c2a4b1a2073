"""NUTS on the generalized posteriors against quadrature grids, limits and robustness.

The references are computed here in NumPy/SciPy from DESIGN.md's formulas,
independently of the Stan library. Agreement is judged in Monte Carlo
standard errors reported by ArviZ (4 MCSE), never by a fixed tolerance.
"""

import arviz as az
import numpy as np
import pytest
from scipy import stats
from scipy.special import logsumexp

import robust_stan as rs
from robust_stan.building.divergences import DivergenceCode
from robust_stan.results import arviz_output

from .conftest import ENGINE

N_CLEAN, N_OUT = 36, 4  # 10% gross outliers
NUTS = dict(chains=4, iter_warmup=1000, iter_sampling=1000, show_progress=False)


def contaminated_sample(seed=3):
    rng = np.random.default_rng(seed)
    y = rng.normal(0.0, 1.0, size=N_CLEAN + N_OUT)
    y[:N_OUT] += 10.0
    return y


# --- independent NumPy losses (DESIGN.md section 2), normal family -------------

def total_loss(y, mu, sigma, divergence):
    """Total loss sum_i l_i for a normal model; mu, sigma broadcast (grids)."""
    y = y.reshape((-1,) + (1,) * np.ndim(mu))
    log_p = stats.norm.logpdf(y, mu, sigma)
    if divergence.code == DivergenceCode.KL:
        return -log_p.sum(axis=0)
    a = divergence.param
    log_i = -0.5 * a * np.log(2 * np.pi * sigma**2) - 0.5 * np.log1p(a)
    if divergence.code == DivergenceCode.BETA:
        return (-np.exp(a * log_p) / a + np.exp(log_i) / (1 + a)).sum(axis=0)
    if divergence.code == DivergenceCode.GAMMA:
        return (-((1 + a) / a) * np.exp(a * log_p - a / (1 + a) * log_i)).sum(axis=0)
    n = len(y)  # original gamma form; I is the same for every observation here
    return -(n / a) * (logsumexp(a * log_p, axis=0) - np.log(n)) + (n / (1 + a)) * log_i


def grid_moments_known_sigma(y, divergence, sigma=1.0):
    """Posterior mean and sd of mu (prior normal(0, 10)) on a fine grid."""
    coarse = np.linspace(-30, 30, 6001)
    log_post = stats.norm.logpdf(coarse, 0, 10) - total_loss(y, coarse, sigma, divergence)
    keep = coarse[log_post > log_post.max() - 40]
    mu = np.linspace(keep.min() - 0.1, keep.max() + 0.1, 20001)
    log_post = stats.norm.logpdf(mu, 0, 10) - total_loss(y, mu, sigma, divergence)
    w = np.exp(log_post - log_post.max())
    w /= w.sum()
    mean = (w * mu).sum()
    return {"mu": (mean, np.sqrt((w * (mu - mean) ** 2).sum()))}


def grid_moments_mu_sigma(y, divergence):
    """Posterior moments of mu and sigma (priors normal(0, 10), exponential(1)),
    on a grid over (mu, log sigma) with the Jacobian sigma."""

    def log_post(mu, log_sigma):
        sigma = np.exp(log_sigma)
        return (stats.norm.logpdf(mu, 0, 10) + stats.expon.logpdf(sigma) + log_sigma
                - total_loss(y, mu, sigma, divergence))

    mu_c, ls_c = np.meshgrid(np.linspace(-10, 20, 301), np.linspace(-5, 4, 301), indexing="ij")
    lp = log_post(mu_c, ls_c)
    inside = lp > lp.max() - 40
    mu_lo, mu_hi = mu_c[inside].min() - 0.2, mu_c[inside].max() + 0.2
    ls_lo, ls_hi = ls_c[inside].min() - 0.1, ls_c[inside].max() + 0.1
    mu_g, ls_g = np.meshgrid(np.linspace(mu_lo, mu_hi, 801), np.linspace(ls_lo, ls_hi, 801), indexing="ij")
    lp = log_post(mu_g, ls_g)
    w = np.exp(lp - lp.max())
    w /= w.sum()
    out = {}
    for name, values in (("mu", mu_g), ("sigma", np.exp(ls_g))):
        mean = (w * values).sum()
        out[name] = (mean, np.sqrt((w * (values - mean) ** 2).sum()))
    return out


def assert_matches_grid(fit, reference):
    for name, (mean, sd) in reference.items():
        draws = fit.draws(name)
        mcse_mean = float(az.mcse(draws, method="mean"))
        mcse_sd = arviz_output.mcse_sd(draws)  # the same on both ArviZ lines (see its docstring)
        assert abs(draws.mean() - mean) < 4 * mcse_mean, (name, draws.mean(), mean, mcse_mean)
        assert abs(draws.std(ddof=1) - sd) < 4 * mcse_sd, (name, draws.std(ddof=1), sd, mcse_sd)


@pytest.fixture(scope="module")
def location_known_sigma():
    model = rs.location("normal", known={"sigma": 1.0}, standardize=False, engine=ENGINE)
    model.compile(show_progress=False)
    return model


@pytest.fixture(scope="module")
def location_normal():
    model = rs.location("normal", standardize=False, engine=ENGINE)
    model.compile(show_progress=False)
    return model


DIVERGENCES = [rs.KL(), rs.BetaD(0.5), rs.GammaD(0.5)]


@pytest.mark.stan
@pytest.mark.parametrize("divergence", DIVERGENCES, ids=repr)
def test_one_parameter_posterior_matches_grid(location_known_sigma, divergence):
    y = contaminated_sample()
    fit = location_known_sigma.sample({"y": y}, divergence=divergence, seed=11, **NUTS)
    assert_matches_grid(fit, grid_moments_known_sigma(y, divergence))


@pytest.mark.stan
@pytest.mark.parametrize("divergence", DIVERGENCES + [rs.GammaD(0.5, form="original")], ids=repr)
def test_two_parameter_posterior_matches_grid(location_normal, divergence):
    y = contaminated_sample()
    fit = location_normal.sample({"y": y}, divergence=divergence, seed=12, **NUTS)
    assert fit.diagnostics()["max_r_hat"] < 1.01
    assert_matches_grid(fit, grid_moments_mu_sigma(y, divergence))


def test_grid_posterior_tends_to_kl_as_beta_and_gamma_vanish():
    """The exact (grid) generalized posterior converges to the KL posterior, at rate O(beta)."""
    y = contaminated_sample()
    kl = grid_moments_known_sigma(y, rs.KL())["mu"]
    for make in (rs.BetaD, rs.GammaD):
        gaps = [abs(grid_moments_known_sigma(y, make(a))["mu"][0] - kl[0]) for a in (1e-2, 1e-3, 1e-4, 1e-5)]
        # linear convergence: each tenfold smaller beta/gamma shrinks the gap about tenfold
        for larger, smaller in zip(gaps, gaps[1:]):
            assert 0.05 < smaller / larger < 0.2
        assert gaps[-1] < 0.01 * kl[1]  # at 1e-5 far below the posterior sd


@pytest.mark.stan
@pytest.mark.parametrize("divergence", [rs.BetaD(1e-5), rs.GammaD(1e-5)], ids=repr)
def test_small_beta_gamma_nuts_matches_kl_posterior(location_normal, divergence):
    y = contaminated_sample()
    # Seed 13 (used until the library's normal fast path changed the floating-point
    # path and so the NUTS trajectories) gave z = -4.7 for sd(mu) at beta = 1e-5, with
    # ArviZ 0.x's mcse(method="sd"), which underestimates the sd's Monte Carlo error
    # (z-scores of sd ~1.7 over 32 runs; arviz_output.mcse_sd, used now, gives ~1.0-1.3).
    # Seed 21 is fixed here once, not tuned.
    fit = location_normal.sample({"y": y}, divergence=divergence, seed=21, **NUTS)
    assert_matches_grid(fit, grid_moments_mu_sigma(y, rs.KL()))


# --- robustness (default, standardised models) --------------------------------

@pytest.mark.stan
def test_normal_location_is_robust_and_scores_flag_outliers():
    """10% outliers at +10 sd. 'sd' is the clean outcome's standard deviation."""
    rng = np.random.default_rng(5)
    y_clean = rng.normal(3.0, 2.0, size=200)
    y = y_clean.copy()
    y[:20] += 10 * y_clean.std()
    model = rs.location("normal", engine=ENGINE)
    settings = dict(seed=21, **NUTS)
    clean = model.sample({"y": y_clean}, **settings).draws("mu").mean()
    kl = model.sample({"y": y}, **settings).draws("mu").mean()
    beta_fit = model.sample({"y": y}, divergence=rs.BetaD(0.3), **settings)
    sd = y_clean.std()
    assert abs(beta_fit.draws("mu").mean() - clean) < 0.2 * sd
    assert abs(kl - clean) > 0.8 * sd
    scores = beta_fit.outlier_scores()
    assert set(scores.nsmallest(20).index) == set(range(20))


@pytest.mark.stan
def test_glm_coefficient_is_robust_and_scores_flag_outliers(glm_normal_standardized):
    """Outliers at +10 sd on the 10% of rows with the largest x_1 (they lever the slope)."""
    rng = np.random.default_rng(6)
    n = 200
    X = rng.normal(size=(n, 2))
    y_clean = 0.5 + X @ np.array([1.0, -0.5]) + rng.normal(size=n)
    planted = np.argsort(X[:, 0])[-20:]
    y = y_clean.copy()
    y[planted] += 10 * y_clean.std()
    settings = dict(seed=22, **NUTS)
    model = glm_normal_standardized
    clean = model.sample({"X": X, "y": y_clean}, **settings).draws("b")[..., 0].mean()
    kl = model.sample({"X": X, "y": y}, **settings).draws("b")[..., 0].mean()
    beta_fit = model.sample({"X": X, "y": y}, divergence=rs.BetaD(0.3), **settings)
    sd = y_clean.std()
    assert abs(beta_fit.draws("b")[..., 0].mean() - clean) < 0.2 * sd
    assert abs(kl - clean) > 0.8 * sd
    assert set(beta_fit.outlier_scores().nsmallest(20).index) == set(planted)
