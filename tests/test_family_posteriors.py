"""Every family's generalized posterior under NUTS against an independent quadrature.

DESIGN.md section 5: for small models the generalized posterior is computed on a grid, here
from DESIGN.md section 2's losses transcribed in NumPy/SciPy (log densities from scipy.stats,
integral terms by direct sums or by the student_t integral written out below), independently
of the Stan library, with beta 0.5, gamma 0.5 and gamma 0.5 (original form).
- bernoulli, binomial, poisson, exponential, categorical (K = 3): the intercept-only glms
  (X a zero column, so the slope keeps its prior and drops out of the intercept's
  posterior), N = 30 with 3 gross outliers;
- student_t with sigma (nu known) and multi_normal in 2-D (covariance known): location
  models, N = 100 with 10 outliers;
all with standardize=False; and the families rs.robustify alone offers (lognormal, gamma, weibull,
beta, neg_binomial_2, beta_binomial, ordered_logistic, ordered_probit), one intercept each in the
robustified tests/stan_programs/family_intercepts.stan, N = 30 with 3 outliers. NUTS mean within
4 MCSE of the grid's; sd within 10% (at ESS ~ 1000 the sd's own Monte Carlo error is about 2-3%).
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from scipy import special, stats

import robust_stan as rs
from robust_stan.building.divergences import DivergenceCode
from robust_stan.results.arviz_output import scalar_diagnostics

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
    if divergence.code == DivergenceCode.BETA:
        return (-np.exp(a * log_p) / a + np.exp(log_i) / (1 + a)).sum(axis=-1)
    if divergence.code == DivergenceCode.GAMMA:
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
    for k, axis in enumerate(case.axes.values()):  # cell widths, for grids denser near the data
        w *= np.expand_dims(np.gradient(axis), [j for j in range(w.ndim) if j != k])
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


def assert_matches_grid(label: str, draws: dict, reference: dict, record_property) -> None:
    """NUTS mean within 4 MCSE and sd within 10% of the grid's, for each named quantity; the
    z-score and sd error are recorded (``--junitxml`` shows them) for the closing figures."""
    for name, (mean, sd) in reference.items():
        mcse = scalar_diagnostics(draws[name])["mcse_mean"]
        z, sd_error = (draws[name].mean() - mean) / mcse, draws[name].std() / sd - 1
        record_property(f"{label} {name}", f"z {z:.2f} sd_error {sd_error:.3f}")
        assert abs(z) < 4, (label, name, draws[name].mean(), mean, mcse)
        assert abs(sd_error) < 0.10, (label, name, draws[name].std(), sd)


@pytest.mark.stan
@pytest.mark.slow
@pytest.mark.parametrize("divergence", DIVERGENCES, ids=repr)
def test_nuts_matches_grid_for_every_family(family_model, divergence, record_property):
    family, model = family_model
    case = _case(family)
    reference = _grid_moments(case, divergence)
    fit = model.sample(case.data, divergence=divergence, seed=17, **NUTS)
    alpha = fit.draws("alpha")
    draws = {name: alpha if name == "alpha" else alpha[..., case.column[name]] for name in reference}
    assert_matches_grid(family, draws, reference, record_property)


# -- the two families with more than an intercept: student_t (mu, sigma; nu known) and
#    multi_normal in 2-D (mu; covariance known) -------------------------------------------

def _student_t_log_integral(a, sigma, nu):
    """log of the integral of t(y | nu, mu, sigma)^(1+a) dy: with c = Gamma((nu+1)/2) /
    (Gamma(nu/2) sqrt(nu pi)) and m = (nu+1)(1+a)/2, it is c^(1+a) sigma^(-a) sqrt(nu) B(1/2, m - 1/2)."""
    log_c = special.gammaln((nu + 1) / 2) - special.gammaln(nu / 2) - 0.5 * np.log(nu * np.pi)
    m = (nu + 1) * (1 + a) / 2
    return (1 + a) * log_c - a * np.log(sigma) + 0.5 * np.log(nu) + special.betaln(0.5, m - 0.5)


def test_student_t_integral_against_quadrature():
    """The closed form above (used by the grid below) against scipy's quadrature."""
    from scipy import integrate

    for a, sigma, nu in [(0.5, 1.3, 4.0), (0.2, 0.4, 1.5), (2.0, 3.0, 30.0)]:
        value, _ = integrate.quad(lambda y: stats.t.pdf(y, nu, 0.7, sigma) ** (1 + a), -np.inf, np.inf,
                                  epsabs=0, epsrel=1e-12)
        assert _student_t_log_integral(a, sigma, nu) == pytest.approx(np.log(value), rel=1e-9, abs=1e-10)


# N = 100 here: with two free dimensions the bounded losses leave a plateau shaped like the
# prior far from the data, of mass about (prior volume / bump volume) exp(-sum_i p_i^a / a);
# at N = 30 that was 2e-4 beyond 10 units for multi_normal, too rare for 4000 draws to show
# and yet 15% of the variance. At N = 100 it is below 1e-8.
N_WIDE, N_WIDE_OUT = 100, 10


def _student_t_case():
    nu = 4.0
    y = 1.0 + 0.8 * np.random.default_rng(8).standard_t(nu, N_WIDE)
    y[:N_WIDE_OUT] += 15.0
    # bounded losses: far from the data mu's posterior follows its normal(0, 10) prior, so the
    # grid reaches +-60, coarsely outside the data's range
    mu = np.unique(np.concatenate([np.linspace(-60, -4, 113), np.linspace(-4, 6, 801), np.linspace(6, 60, 109)]))
    log_sigma = np.linspace(-3.5, 3.5, 351)

    def log_terms(a, mu, log_sigma):
        sigma = np.exp(log_sigma)[..., None]
        log_p = stats.t.logpdf(y, nu, mu[..., None], sigma)
        return log_p, _student_t_log_integral(a, sigma, nu) + 0 * log_p

    def log_prior(mu, log_sigma):  # mu ~ normal(0, 10), sigma ~ exponential(1), Jacobian sigma
        return stats.norm.logpdf(mu, 0, 10) + stats.expon.logpdf(np.exp(log_sigma)) + log_sigma

    return FamilyCase({"y": y}, {"mu": mu, "log_sigma": log_sigma}, log_terms, log_prior, {}), {"nu": nu}


def _multi_normal_case():
    Sigma = np.array([[1.0, 0.6], [0.6, 2.0]])
    y = np.random.default_rng(9).multivariate_normal([0.5, -1.0], Sigma, N_WIDE)
    y[:N_WIDE_OUT] += [8.0, -8.0]
    d = 2
    log_i_value = lambda a: (-0.5 * d * a * np.log(2 * np.pi) - 0.5 * a * np.linalg.slogdet(Sigma)[1]  # noqa: E731
                             - 0.5 * d * np.log1p(a))
    # dense where the data are, coarse out to +-60 (the prior's tails; see the student_t case)
    grid = np.unique(np.concatenate([np.linspace(-60, -5, 56), np.linspace(-5, 5, 401), np.linspace(5, 60, 56)]))
    precision = np.linalg.inv(Sigma)

    def log_terms(a, m1, m2):
        # (y_n - mu)' P (y_n - mu) = y_n' P y_n - 2 mu' P y_n + mu' P mu, without a (grid, grid, N, 2) array
        py = y @ precision
        quad = (np.sum(py * y, axis=1) - 2 * (m1[..., None] * py[:, 0] + m2[..., None] * py[:, 1])
                + (precision[0, 0] * m1**2 + 2 * precision[0, 1] * m1 * m2 + precision[1, 1] * m2**2)[..., None])
        log_p = -0.5 * quad - 0.5 * d * np.log(2 * np.pi) - 0.5 * np.linalg.slogdet(Sigma)[1]
        return log_p, np.full(log_p.shape, log_i_value(a))

    def log_prior(m1, m2):
        return stats.norm.logpdf(m1, 0, 10) + stats.norm.logpdf(m2, 0, 10)

    return FamilyCase({"y": y, "Sigma": Sigma}, {"m1": grid, "m2": grid}, log_terms, log_prior, {"m1": 0, "m2": 1})


@pytest.mark.stan
@pytest.mark.slow
@pytest.mark.parametrize("divergence", DIVERGENCES, ids=repr)
def test_student_t_with_sigma_matches_grid(divergence, record_property):
    case, known = _student_t_case()
    reference = _grid_moments(case, divergence)
    model = rs.location("student_t", known=known, standardize=False, engine=ENGINE)
    fit = model.sample(case.data, divergence=divergence, seed=19, **NUTS)
    draws = {"mu": fit.draws("mu"), "log_sigma": np.log(fit.draws("sigma"))}
    assert_matches_grid("student_t", draws, reference, record_property)


@pytest.mark.stan
@pytest.mark.slow
@pytest.mark.parametrize("divergence", DIVERGENCES, ids=repr)
def test_multi_normal_2d_matches_grid(divergence, record_property):
    case = _multi_normal_case()
    reference = _grid_moments(case, divergence)
    model = rs.location("multi_normal", covariance="known", engine=ENGINE)
    fit = model.sample(case.data, divergence=divergence, seed=23, **NUTS)
    mu = fit.draws("mu")
    draws = {name: mu[..., case.column[name]] for name in reference}
    assert_matches_grid("multi_normal", draws, reference, record_property)
    # ArviZ output of a matrix outcome: a row's log density has one value, its outcome D
    idata = fit.to_arviz()
    assert idata["model_log_likelihood"]["y"].dims == ("chain", "draw", "obs")  # robust: not for az.loo
    assert idata["observed_data"]["y"].dims == ("obs", "outcome_dim")
    assert idata["posterior_predictive"]["y"].dims == ("chain", "draw", "obs", "outcome_dim")


# -- the families rs.robustify alone offers: one intercept under each likelihood of
#    tests/stan_programs/family_intercepts.stan (one compile), N = 30 with 3 gross outliers ------

def _positive_family(k: int, name: str, rng) -> FamilyCase:
    """lognormal(alpha, 0.8), gamma(3, 3 exp(-alpha)) or weibull(2, exp(alpha)): I_a in closed form
    (DESIGN.md; each checked against quadrature in tests/test_library.py)."""
    y = {"lognormal": lambda: np.exp(1.0 + 0.8 * rng.normal(size=N)),
         "gamma": lambda: rng.gamma(3.0, np.e / 3.0, size=N),
         "weibull": lambda: np.e * rng.weibull(2.0, size=N)}[name]()
    y[:N_OUT] = 60 * np.e

    def log_terms(a, alpha):
        alpha, s = alpha[..., None], 1 + a
        if name == "lognormal":
            sd = 0.8
            log_p = stats.lognorm.logpdf(y, sd, scale=np.exp(alpha))
            log_i = -0.5 * a * np.log(2 * np.pi * sd**2) - 0.5 * np.log(s) - a * alpha + a**2 * sd**2 / (2 * s)
        elif name == "gamma":
            shape, rate = 3.0, 3.0 * np.exp(-alpha)
            log_p = stats.gamma.logpdf(y, shape, scale=1 / rate)
            k_ = s * (shape - 1) + 1
            log_i = a * np.log(rate) - s * special.gammaln(shape) + special.gammaln(k_) - k_ * np.log(s)
        else:
            shape, scale = 2.0, np.exp(alpha)
            log_p = stats.weibull_min.logpdf(y, shape, scale=scale)
            m = s - a / shape
            log_i = a * (np.log(shape) - np.log(scale)) + special.gammaln(m) - m * np.log(s)
        return log_p, log_i + 0 * log_p
    return _intercept_case(k, {"N_pos": N, "y_pos": y}, log_terms)


def _intercept_case(k: int, outcome: dict, log_terms, axis: np.ndarray = WIDE) -> FamilyCase:
    empty = {"N_pos": 0, "y_pos": np.zeros(0), "N_unit": 0, "y_unit": np.zeros(0), "N_count": 0,
             "y_count": np.zeros(0, int), "trials": np.zeros(0, int), "N_ord": 0, "y_ord": np.zeros(0, int),
             "c": ORDINAL_CUTS}
    return FamilyCase({**empty, **outcome, "family": k}, {"alpha": axis}, log_terms,
                      lambda alpha: stats.norm.logpdf(alpha, 0, 2.5), {})


ORDINAL_CUTS = np.array([-1.0, 0.5, 2.0])


def _beta_case(rng) -> FamilyCase:
    """beta(10 mu, 10 (1 - mu)), mu = inv_logit(alpha): I_a = B(x, z) / B(10 mu, 10 (1 - mu))^(1+a)."""
    y = rng.beta(10 * special.expit(1.0), 10 * special.expit(-1.0), size=N)
    y[:N_OUT] = 0.002

    def log_terms(a, alpha):
        u, v = 10 * special.expit(alpha)[..., None], 10 * special.expit(-alpha)[..., None]
        s = 1 + a
        log_i = special.betaln(s * (u - 1) + 1, s * (v - 1) + 1) - s * special.betaln(u, v)
        log_p = stats.beta.logpdf(y, u, v)
        return log_p, log_i + 0 * log_p
    return _intercept_case(4, {"N_unit": N, "y_unit": y}, log_terms)


def _neg_binomial_case(rng) -> FamilyCase:
    """neg_binomial_2_log(alpha, 20): I_a by a direct sum of scipy's pmf over 0 .. mu + 40 sd + 100."""
    phi = 20.0
    y = rng.negative_binomial(phi, phi / (np.e + phi), size=N)
    y[:N_OUT] = 60

    def log_terms(a, alpha):
        mu = np.exp(alpha)
        log_i = np.empty_like(mu)
        for g, m in enumerate(mu):
            k = np.arange(int(m + 40 * np.sqrt(m + m * m / phi)) + 100)
            log_i[g] = special.logsumexp((1 + a) * stats.nbinom.logpmf(k, phi, phi / (m + phi)))
        log_p = stats.nbinom.logpmf(y, phi, phi / (mu[..., None] + phi))
        return log_p, log_i[..., None] + 0 * log_p
    # dense where the data are, coarse out to -10 and 9 (the sums grow with mu: 80000 terms at alpha = 9)
    axis = np.unique(np.concatenate([np.linspace(-10, -4, 61), np.linspace(-4, 4, 1601), np.linspace(4, 9, 51)]))
    return _intercept_case(5, {"N_count": N, "y_count": y, "trials": np.zeros(N, int)}, log_terms, axis)


def _beta_binomial_case(rng) -> FamilyCase:
    """beta_binomial(trials, 8 mu, 8 (1 - mu)), mu = inv_logit(alpha): I_a by a direct sum over 0..trials."""
    trials = rng.integers(3, 12, N)
    y = rng.binomial(trials, rng.beta(8 * 0.3, 8 * 0.7, size=N))
    y[:N_OUT] = trials[:N_OUT]
    k = np.arange(trials.max() + 1)

    def log_terms(a, alpha):
        u, v = 8 * special.expit(alpha), 8 * special.expit(-alpha)
        log_p = stats.betabinom.logpmf(y, trials, u[..., None], v[..., None])
        log_pmf_k = stats.betabinom.logpmf(k, trials[:, None], u[..., None, None], v[..., None, None])  # -inf past n_i
        return log_p, _log_sum_pmf_power(log_pmf_k, a)
    return _intercept_case(6, {"N_count": N, "y_count": y, "trials": trials}, log_terms)


def _ordinal_case(k: int, law, rng) -> FamilyCase:
    """ordered_logistic / ordered_probit(alpha, c), c = (-1, 0.5, 2): p_k = F(c_k - alpha) - F(c_(k-1) - alpha)."""
    latent = 1.0 + law.rvs(size=N, random_state=rng)
    y = 1 + np.sum(latent[:, None] > ORDINAL_CUTS[None, :], axis=1)
    y[:N_OUT] = 1

    def log_terms(a, alpha):
        edges = np.concatenate([[-np.inf], ORDINAL_CUTS, [np.inf]])
        upper, lower = edges[1:] - alpha[..., None], edges[:-1] - alpha[..., None]
        # above the median a difference of survival functions (of cdfs it would cancel)
        log_probs = np.log(np.where(lower > 0, law.sf(lower) - law.sf(upper), law.cdf(upper) - law.cdf(lower)))
        log_p = log_probs[..., y - 1]
        return log_p, _log_sum_pmf_power(log_probs, a)[..., None] + 0 * log_p
    return _intercept_case(k, {"N_ord": N, "y_ord": y}, log_terms)


def _robustify_case(family: str) -> FamilyCase:
    rng = np.random.default_rng(11)
    if family in ("lognormal", "gamma", "weibull"):
        return _positive_family(1 + ["lognormal", "gamma", "weibull"].index(family), family, rng)
    return {"beta": _beta_case, "neg_binomial_2": _neg_binomial_case, "beta_binomial": _beta_binomial_case,
            "ordered_logistic": lambda r: _ordinal_case(7, stats.logistic, r),
            "ordered_probit": lambda r: _ordinal_case(8, stats.norm, r)}[family](rng)


ROBUSTIFY_FAMILIES = ["lognormal", "gamma", "weibull", "beta", "neg_binomial_2", "beta_binomial", "ordered_logistic",
                      "ordered_probit"]


@pytest.fixture(scope="module")
def family_intercepts():
    model = rs.robustify(Path(__file__).parent / "stan_programs" / "family_intercepts.stan", engine=ENGINE)
    model.compile(show_progress=False)
    return model


@pytest.mark.stan
@pytest.mark.slow
@pytest.mark.parametrize("divergence", DIVERGENCES, ids=repr)
@pytest.mark.parametrize("family", ROBUSTIFY_FAMILIES)
def test_nuts_matches_grid_for_every_family_robustify_offers(family_intercepts, family, divergence, record_property):
    """The generalized posterior of one intercept under each family that rs.robustify alone offers,
    NUTS on the robustified family_intercepts.stan against the grid. The chains start in the largest
    mode (inits="mode"): with the outliers at a boundary (beta's y = 0.002) the bounded losses have
    local modes far out where the outliers are explained (beta under GammaD(0.5): alpha = -7.2, density
    e^-19.5 of the main mode's, mass 3e-8 on the grid), in which one of Stan's dispersed starts settled
    (R-hat 1.53)."""
    case = _robustify_case(family)
    reference = _grid_moments(case, divergence)
    fit = family_intercepts.sample(case.data, divergence=divergence, seed=29, inits="mode", **NUTS)
    assert_matches_grid(family, {"alpha": fit.draws("alpha")}, reference, record_property)
