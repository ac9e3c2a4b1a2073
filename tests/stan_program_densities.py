"""Log densities of the textbook programs in tests/stan_programs/, written in NumPy and SciPy
from each .stan file, independently of Stan: the reference that tests/test_robustify.py compares
the robustified programs (under KL) and some of the programs as written against.

Each density is a function of the data (as the tests pass it to Stan) and of theta, a point on
Stan's unconstrained scale: the parameters in declaration order, each matrix column-major, each
constrained parameter mapped as Stan maps it, with the log-Jacobian Stan adds:

- ``<lower=a>``: x = a + exp(u), log-Jacobian u;
- ``<lower=0, upper=1>``: x = inv_logit(u), log-Jacobian log x + log(1 - x);
- ``cholesky_factor_corr[2]``: one value u, the canonical partial correlation z = tanh(u),
  L = [[1, 0], [z, sqrt(1 - z^2)]], log-Jacobian log(1 - z^2).

Terms that do not depend on theta may differ from Stan's (Stan drops them under ``~`` and
``_lupdf``; SciPy keeps them), so the densities equal Stan's up to one constant per data set.
"""

import contextvars

import numpy as np
from scipy import stats
from scipy.special import log_expit

_COUNTING = contextvars.ContextVar("counting", default=False)


class _Counted(Exception):
    """Raised by a density read in counting mode, with the number of values it read."""

    def __init__(self, size):
        super().__init__(size)
        self.size = size


class _Unconstrained:
    """Reads theta's parameters in declaration order and adds each constraint's log-Jacobian."""

    def __init__(self, theta):
        self._theta = np.asarray(theta, dtype=float)
        self._at = 0
        self.log_jacobian = 0.0

    def _take(self, size):
        assert self._at + size <= self._theta.size, f"theta has {self._theta.size} values, the program more"
        values = self._theta[self._at:self._at + size]
        self._at += size
        return values

    def real(self):
        return self._take(1)[0]

    def vector(self, size):
        return self._take(size)

    def matrix(self, rows, columns):
        return self._take(rows * columns).reshape((rows, columns), order="F")

    def positive(self, size=None, lower=0.0):
        u = self._take(1 if size is None else size)
        self.log_jacobian += u.sum()
        x = lower + np.exp(u)
        return x[0] if size is None else x

    def unit(self, size=None):
        """``<lower=0, upper=1>``: x = inv_logit(u), log-Jacobian log x + log(1 - x)."""
        u = self._take(1 if size is None else size)
        self.log_jacobian += np.sum(log_expit(u) + log_expit(-u))
        x = 1 / (1 + np.exp(-u))
        return x[0] if size is None else x

    def cholesky_factor_corr_2(self):
        z = np.tanh(self.real())
        self.log_jacobian += np.log1p(-z**2)
        return np.array([[1.0, 0.0], [z, np.sqrt(1 - z**2)]])

    def done(self, log_density):
        """The log density plus the log-Jacobians, once every value of theta has been read."""
        if _COUNTING.get():
            raise _Counted(self._at)
        assert self._at == self._theta.size, f"theta has {self._theta.size} values, the program {self._at}"
        return log_density + self.log_jacobian


def _normal(x, mu, sigma):
    return np.sum(stats.norm.logpdf(x, mu, sigma))


def _exponential(x, rate):
    return np.sum(stats.expon.logpdf(x, scale=1 / rate))


def _bernoulli_logit(y, eta):
    return np.sum(np.where(np.asarray(y) == 1, log_expit(eta), log_expit(-eta)))


def _lkj_corr_cholesky_2(L, eta):
    """lkj_corr_cholesky(eta) for 2 x 2: the LKJ density of the correlation L L' (det^(eta - 1))
    times the Jacobian of L -> L L' (L[1, 1]^(K - 2) with K = 2, that is 1)."""
    return (eta - 1) * np.log(np.linalg.det(L @ L.T))


def linear_regression(data, theta):
    p = _Unconstrained(theta)
    alpha, beta, sigma = p.real(), p.vector(data["K"]), p.positive()
    return p.done(_normal(alpha, 0, 2.5) + _normal(beta, 0, data["prior_scale_b"]) + stats.expon.logpdf(sigma)
                  + _normal(data["y"], alpha + data["X"] @ beta, sigma))


def logistic_regression(data, theta):
    p = _Unconstrained(theta)
    alpha, beta = p.real(), p.vector(data["K"])
    return p.done(_normal(alpha, 0, 2.5) + _normal(beta, 0, 1)
                  + _bernoulli_logit(data["y"], alpha + data["X"] @ beta))


def poisson_offset(data, theta):
    p = _Unconstrained(theta)
    alpha, beta = p.real(), p.vector(data["K"])
    rate = data["exposure"] * np.exp(alpha + data["X"] @ beta)
    return p.done(_normal(alpha, 0, 2) + _normal(beta, 0, 1) + np.sum(stats.poisson.logpmf(data["y"], rate)))


def group_intercepts(data, theta):
    p = _Unconstrained(theta)
    mu, tau, z, beta, sigma = p.real(), p.positive(), p.vector(data["J"]), p.real(), p.positive()
    a = mu + tau * z
    return p.done(_normal(mu, 0, 5) + _normal(tau, 0, 2) + _normal(z, 0, 1) + _normal(beta, 0, 2)
                  + _exponential(sigma, 1)
                  + _normal(data["y"], a[data["group"] - 1] + beta * data["x"], sigma))


def varying_slopes(data, theta):
    p = _Unconstrained(theta)
    gamma, tau, L_Omega = p.vector(2), p.positive(2), p.cholesky_factor_corr_2()
    z, sigma = p.matrix(2, data["J"]), p.positive()
    coef = gamma + (np.diag(tau) @ L_Omega @ z).T   # J x 2: each group's intercept and slope
    rows = coef[data["group"] - 1]
    return p.done(_normal(gamma, 0, 5) + _exponential(tau, 1) + _lkj_corr_cholesky_2(L_Omega, 2)
                  + _normal(z, 0, 1) + _exponential(sigma, 1)
                  + _normal(data["y"], rows[:, 0] + rows[:, 1] * data["x"], sigma))


def multi_normal_location(data, theta):
    p = _Unconstrained(theta)
    mu, tau, L = p.vector(data["D"]), p.positive(data["D"]), p.cholesky_factor_corr_2()
    covariance = np.diag(tau) @ L @ L.T @ np.diag(tau)
    return p.done(_normal(mu, 0, 10) + np.sum(stats.lognorm.logpdf(tau, 1)) + _lkj_corr_cholesky_2(L, 3)
                  + np.sum(stats.multivariate_normal.logpdf(data["y"], mu, covariance)))


def student_t_regression(data, theta):
    p = _Unconstrained(theta)
    alpha, beta, sigma, nu = p.real(), p.real(), p.positive(), p.positive(lower=1.0)
    return p.done(_normal(alpha, 0, 5) + _normal(beta, 0, 2) + _exponential(sigma, 1)
                  + stats.gamma.logpdf(nu, 2, scale=1 / 0.1)
                  + np.sum(stats.t.logpdf(data["y"], nu, alpha + beta * data["x"], sigma)))


def two_outcomes(data, theta):
    p = _Unconstrained(theta)
    a, b, sigma, c, d = p.real(), p.real(), p.positive(), p.real(), p.real()
    return p.done(_normal(a, 0, 5) + _normal(b, 0, 2) + _exponential(sigma, 1) + _normal(c, 0, 2)
                  + _normal(d, 0, 2) + _normal(data["y"], a + b * data["x"], sigma)
                  + _bernoulli_logit(data["flag"], c + d * data["x"]))


def target_lupdf(data, theta):
    p = _Unconstrained(theta)
    mu, sigma = p.real(), p.positive()
    return p.done(_normal(mu, 0, 10) + _exponential(sigma, 1) + _normal(data["y"], mu, sigma))


def loop_likelihood(data, theta):
    p = _Unconstrained(theta)
    alpha, beta, sigma = p.real(), p.real(), p.positive()
    return p.done(_normal(alpha, 0, 5) + _normal(beta, 0, 2) + _exponential(sigma, 1)
                  + _normal(data["y"], alpha + beta * np.asarray(data["x"]), sigma))


def eight_schools(data, theta):
    p = _Unconstrained(theta)
    mu, tau, theta_tilde = p.real(), p.positive(), p.vector(data["J"])
    return p.done(_normal(mu, 0, 5) + stats.cauchy.logpdf(tau, 0, 5) + _normal(theta_tilde, 0, 1)
                  + _normal(data["y"], mu + tau * theta_tilde, data["sigma"]))


def target_sum(data, theta):
    p = _Unconstrained(theta)
    alpha, beta, sigma = p.real(), p.real(), p.positive()
    return p.done(_normal(alpha, 0, 5) + _normal(beta, 0, 2) + _exponential(sigma, 1)
                  + _normal(data["y"], alpha + beta * data["x"], sigma))


def if_else_trend(data, theta):
    p = _Unconstrained(theta)
    a, b, s = p.real(), p.real(), p.positive()
    trend = 1 / (1 + np.exp(-data["t"])) if data["logistic"] == 1 else data["t"]
    return p.done(_normal(a, 0, 5) + _normal(b, 0, 2) + _exponential(s, 1) + _normal(data["y"], a + b * trend, s))


def two_binomials(data, theta):
    p = _Unconstrained(theta)
    p_control, p_treated = p.unit(), p.unit()
    return p.done(stats.beta.logpdf(p_control, 2, 2) + stats.beta.logpdf(p_treated, 2, 2)
                  + stats.binom.logpmf(data["y_control"], data["n_control"], p_control)
                  + stats.binom.logpmf(data["y_treated"], data["n_treated"], p_treated))


def log_outcome(data, theta):
    p = _Unconstrained(theta)
    alpha, beta, sigma = p.real(), p.real(), p.positive()
    return p.done(_normal(alpha, 0, 5) + _normal(beta, 0, 2) + _exponential(sigma, 1)
                  + _normal(np.log(data["y"]), alpha + beta * data["x"], sigma))


def irt_by_element(data, theta):
    p = _Unconstrained(theta)
    ability, difficulty, sigma = p.vector(data["I"]), p.vector(data["J"]), p.positive()
    eta = ability[:, None] - difficulty[None, :]
    return p.done(_normal(ability, 0, sigma) + _normal(difficulty, 0, 2) + _exponential(sigma, 1)
                  + _bernoulli_logit(np.asarray(data["y"]), eta))


irt_by_person = irt_by_element  # the same density, written by row


def ragged_groups(data, theta):
    p = _Unconstrained(theta)
    mu, sigma = p.vector(data["K"]), p.positive()
    group = np.repeat(np.arange(data["K"]), data["s"])
    return p.done(_normal(mu, 0, 5) + _exponential(sigma, 1) + _normal(data["y"], mu[group], sigma))


def regional_counts(data, theta):
    p = _Unconstrained(theta)
    log_rate = p.vector(data["R"])
    cases, total = np.asarray(data["cases"]), _normal(log_rate, 0, 3)
    for r, first in enumerate(np.asarray(data["start"]) - 1):
        total += stats.poisson.logpmf(cases[first, r], np.exp(log_rate[r] - 1))
        total += np.sum(stats.poisson.logpmf(cases[first + 1:, r], np.exp(log_rate[r])))
    return p.done(total)


def gp_one_observation(data, theta):
    p = _Unconstrained(theta)
    rho, alpha, sigma = p.positive(), p.positive(), p.positive()
    x = np.asarray(data["x"])
    covariance = alpha**2 * np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / rho**2) + sigma * np.eye(x.size)
    return p.done(stats.gamma.logpdf(rho, 25, scale=1 / 4) + stats.norm.logpdf(alpha, 0, 2)
                  + stats.norm.logpdf(sigma, 0, 1)
                  + stats.multivariate_normal.logpdf(data["y"], np.zeros(x.size), covariance))


def _regression_on_x(data, theta, lower_third=0.0):
    """alpha, beta and a positive third parameter (the programs of the families below), with alpha + beta x."""
    p = _Unconstrained(theta)
    alpha, beta, third = p.real(), p.real(), p.positive(lower=lower_third)
    return p, alpha, beta, third, alpha + beta * np.asarray(data["x"])


def lognormal_regression(data, theta):
    p, alpha, beta, sigma, eta = _regression_on_x(data, theta)
    return p.done(_normal(alpha, 0, 5) + _normal(beta, 0, 2) + _exponential(sigma, 1)
                  + np.sum(stats.lognorm.logpdf(data["y"], sigma, scale=np.exp(eta))))


def gamma_regression(data, theta):
    p, alpha, beta, shape, eta = _regression_on_x(data, theta)
    return p.done(_normal(alpha, 0, 5) + _normal(beta, 0, 2) + stats.gamma.logpdf(shape, 2, scale=2.0)
                  + np.sum(stats.gamma.logpdf(data["y"], shape, scale=np.exp(eta) / shape)))


def weibull_survival(data, theta):
    p, alpha, beta, k, eta = _regression_on_x(data, theta)
    return p.done(_normal(alpha, 0, 5) + _normal(beta, 0, 2) + stats.gamma.logpdf(k, 2, scale=1.0)
                  + np.sum(stats.weibull_min.logpdf(data["y"], k, scale=np.exp(eta))))


def beta_proportions(data, theta):
    p, alpha, beta, kappa, eta = _regression_on_x(data, theta)
    mu = 1 / (1 + np.exp(-eta))
    return p.done(_normal(alpha, 0, 2.5) + _normal(beta, 0, 2) + stats.gamma.logpdf(kappa, 2, scale=10.0)
                  + np.sum(stats.beta.logpdf(data["y"], mu * kappa, (1 - mu) * kappa)))


def _neg_binomial_2(y, mu, phi):
    return np.sum(stats.nbinom.logpmf(y, phi, phi / (mu + phi)))


def neg_binomial_2_counts(data, theta):
    p, alpha, beta, phi, eta = _regression_on_x(data, theta)
    return p.done(_normal(alpha, 0, 2) + _normal(beta, 0, 1) + _exponential(phi, 0.1)
                  + _neg_binomial_2(data["y"], data["exposure"] * np.exp(eta), phi))


def beta_binomial_trials(data, theta):
    p, alpha, beta, kappa, eta = _regression_on_x(data, theta)
    mu = 1 / (1 + np.exp(-eta))
    return p.done(_normal(alpha, 0, 2) + _normal(beta, 0, 2) + stats.gamma.logpdf(kappa, 2, scale=10.0)
                  + np.sum(stats.betabinom.logpmf(data["y"], data["n"], mu * kappa, (1 - mu) * kappa)))


def matrix_outcome(data, theta):
    p = _Unconstrained(theta)
    R, t = data["R"], np.asarray(data["t"])
    a, b, sigma, c0, c1 = p.vector(R), p.real(), p.positive(), p.real(), p.real()
    mu = a[:, None] + b * t[None, :]
    return p.done(_normal(a, 0, 5) + _normal(b, 0, 2) + _exponential(sigma, 1) + _normal(c0, 0, 2)
                  + _normal(c1, 0, 1) + _normal(data["Y"], mu, sigma)
                  + np.sum(stats.poisson.logpmf(data["counts"], np.exp(c0 + c1 * t)[None, :])))


REFERENCE_LOG_DENSITIES = {f.__name__: f for f in (
    linear_regression, logistic_regression, poisson_offset, group_intercepts, varying_slopes,
    multi_normal_location, student_t_regression, two_outcomes, target_lupdf, loop_likelihood,
    eight_schools, target_sum, if_else_trend, two_binomials, log_outcome, irt_by_element, ragged_groups,
    regional_counts, gp_one_observation, lognormal_regression, gamma_regression, weibull_survival,
    beta_proportions, neg_binomial_2_counts, beta_binomial_trials,
    matrix_outcome)}
REFERENCE_LOG_DENSITIES["irt_by_person"] = irt_by_person


def reference_dimension(name, data, most=10_000):
    """The number of unconstrained values REFERENCE_LOG_DENSITIES[name] reads for ``data`` (read from
    a theta of zeros, at most ``most`` long)."""
    token = _COUNTING.set(True)
    try:
        REFERENCE_LOG_DENSITIES[name](data, np.zeros(most))
    except _Counted as counted:
        return counted.size
    finally:
        _COUNTING.reset(token)
    raise AssertionError(f"{name}: the density never reached done()")


def central_difference_gradient(log_density, theta, step):
    """The gradient of log_density at theta by central differences of the given step."""
    theta = np.asarray(theta, dtype=float)
    return np.array([(log_density(theta + step * e) - log_density(theta - step * e)) / (2 * step)
                     for e in np.eye(theta.size)])
