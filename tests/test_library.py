"""The Stan function library (stan/robust_stan.stanfunctions) against NumPy/SciPy.

One real Stan program (the "harness", generated below from a small table and
compiled once per machine) `#include`s the library and evaluates, in
`generated quantities`, the functions of the family and overload chosen by data:

- `rs_F_log_density` and `rs_F_log_integral` (per-observation log p and log I_a),
- `betad_F_lpdf/lpmf`, `betad_F_weighted_lpdf/lpmf`, `betad_F_pointwise_loss`
  and the same for `gammad_` and `gammaorig_`,
- `robust_F_weighted_lpdf/lpmf` and `robust_F_pointwise_loss` for the divergence
  codes 0 (KL), 1 (beta), 2 (gamma), 3 (gamma original).

Its model block adds one library term with `~` (or `target +=`) in a single
parameter `theta`, so the same program also checks the autodiff instantiation
and that `~` keeps every constant inside the losses (they are not additive).

The references never retype the library's closed forms:

- log I_a = log of the integral of p(y | theta)^(1 + a), by scipy.integrate.quad
  (dblquad for the bivariate normal) of exp((1 + a) * log p) with log p from
  scipy.stats, or by a direct sum over the support (Poisson: far into the tail,
  in float64 with logsumexp, or in 30-digit mpmath for large means);
- the losses are DESIGN.md section 2 written out in NumPy, on log p from
  scipy.stats and on the *quadrature* log I_a.

One exception: the beta family's grid of edge cases takes log I_a from the
closed form B(x, z) / B(shape1, shape2)^(1 + a) in 40-digit mpmath
(beta_log_integral_mp), because quadrature at each of its points was the
slowest reference here; that closed form is itself checked against 25-digit
quadrature of the density at three shape pairs per a
(test_beta_closed_form_reference_is_the_quadrature_of_the_density), so a wrong
formula fails there, and the grid checks the library's float64 arithmetic
(Stirling's form for large shapes) against an exact evaluation.

Print the harness with `python -c "from tests.test_library import harness_code; print(harness_code())"`.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path

import mpmath
import numpy as np
import pytest
from scipy import integrate, optimize, special, stats
from scipy.special import logsumexp

from robust_stan.building.families import FAMILIES
from robust_stan.common.resources import LIBRARY_FILE, library_code
from robust_stan.engines import compile_program
from tools.stan_library import render_library

from .conftest import ENGINE

A_GRID = (0.05, 0.3, 1.0, 2.0)
DIVERGENCES = {0: "kl", 1: "betad", 2: "gammad", 3: "gammaorig"}

# Tolerances.
# Closed-form integrals: the acceptance criterion, 1e-8 relative. The quadratures
# below ask QUADPACK for 1e-13 and reach ~1e-14, so the bound is all Stan's.
INTEGRAL_RTOL = 1e-8
# Losses: both sides evaluate the same float64 expressions on log densities that
# agree to a few ulps of |log p| (Stan's and SciPy's log-density formulas round
# differently), so a loss agrees to ~1e-15 relative to the size of the terms it
# is built from. 1e-10 leaves room for exp(a * log p) amplifying that error by
# up to a * |log p| and for sums of a dozen terms, and is still tight enough to
# catch any wrong constant, power, weight or sign. Errors are measured relative
# to the magnitude of the summands ("scale"), since the beta loss is a
# difference of O(1/a) terms that can cancel.
LOSS_RTOL = 1e-10

# Largest relative error seen per (check, family); printed at the end with -s.
MAX_ERRORS: dict[tuple[str, str], float] = {}


def record(check: str, family: str, err) -> float:
    err = float(np.max(err)) if np.size(err) else 0.0
    key = (check, family)
    MAX_ERRORS[key] = max(MAX_ERRORS.get(key, 0.0), err)
    return err


@pytest.fixture(scope="module", autouse=True)
def report_max_errors():
    yield
    if MAX_ERRORS:
        print("\nmax relative errors (check, family):")
        for (check, family), err in sorted(MAX_ERRORS.items()):
            print(f"  {check:<18} {family:<22} {err:.2e}")


# ---------------------------------------------------------------------------
# The harness program
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Overload:
    """One call form of a family: the outcome and the argument list, as Stan text."""

    y: str
    args: str
    tail: str = ""  # arguments after the divergence's (and weights'): ", integral_table"


@dataclass(frozen=True)
class HarnessFamily:
    code: int
    stan_name: str
    suffix: str
    core: Overload            # arguments of rs_F_log_density / rs_F_log_integral
    overloads: tuple[Overload, ...]  # variant 0, 1, ... of the public functions


def _family_table() -> list[HarnessFamily]:
    def fam(code, name, suffix, y, *variants):
        overloads = tuple(Overload(y, *v) if isinstance(v, tuple) else Overload(y, v) for v in variants)
        return HarnessFamily(code, name, suffix, overloads[0], overloads)

    return [
        # normal and student_t: every shared/per-observation combination
        fam(1, "normal", "lpdf", "y_real", "loc, scale", "loc_s, scale_s", "loc_s, scale", "loc, scale_s"),
        fam(2, "student_t", "lpdf", "y_real", "nu, loc, scale", "nu, loc_s, scale_s", "nu, loc_s, scale",
            "nu, loc, scale_s"),
        fam(3, "bernoulli_logit", "lpmf", "y_int", "eta", "eta_s"),
        fam(4, "binomial_logit", "lpmf", "y_int", "trials, eta", "trials, eta_s"),
        # variants 2 and 3: the tabled fast path (last argument integral_table)
        fam(5, "poisson_log", "lpmf", "y_int", "eta", "eta_s", ("eta", ", integral_table"),
            ("eta_s", ", integral_table")),
        fam(6, "categorical_logit", "lpmf", "y_int", "eta_mat", "eta_row"),
        fam(7, "multi_normal_cholesky", "lpdf", "y_mv", "mu_mv, L", "mu_mv_s, L"),
        fam(8, "exponential", "lpdf", "y_real", "scale", "scale_s"),
        # two-argument families: the first argument in loc / loc_s, the second in scale / scale_s
        fam(9, "lognormal", "lpdf", "y_real", "loc, scale", "loc_s, scale_s", "loc_s, scale"),
        fam(10, "gamma", "lpdf", "y_real", "loc, scale", "loc_s, scale_s", "loc, scale_s"),
        fam(11, "weibull", "lpdf", "y_real", "loc, scale", "loc_s, scale_s"),
        fam(12, "beta", "lpdf", "y_real", "loc, scale", "loc_s, scale_s"),
        fam(13, "neg_binomial_2_log", "lpmf", "y_int", "eta, scale", "eta_s, scale_s", "eta_s, scale"),
        fam(14, "beta_binomial", "lpmf", "y_int", "trials, loc, scale", "trials, loc_s, scale_s", "trials, loc_s, scale"),
        # ordinal families: cut points per observation (cuts_arr) or shared (cuts)
        fam(15, "ordered_logistic", "lpmf", "y_int", "eta, cuts_arr", "eta_s, cuts", "eta, cuts"),
        fam(16, "ordered_probit", "lpmf", "y_int", "eta, cuts_arr", "eta_s, cuts", "eta, cuts"),
    ]


FAMILY_TABLE = {f.stan_name: f for f in _family_table()}
FAMILIES_WITH_TABLES = {fam.stan_name for fam in FAMILIES.values() if fam.integral_table}

# Model-block checks: `tilde` selects one statement in the parameter theta.
TILDE = {
    1: "y_real ~ betad_normal(theta, scale_s, a);",
    2: "y_int ~ gammad_poisson_log(theta, a);",
    3: "y_real ~ gammaorig_student_t(nu, theta, scale, a);",
    4: "y_int ~ robust_binomial_logit_weighted(trials, theta, divergence, a, w);",
    5: "target += betad_categorical_logit_weighted_lpmf(y_int | eta_row + theta * one_hot_row_vector(K, 1), a, w);",
    6: "y_int ~ betad_poisson_log(eta + theta, a, integral_table);",
}

_HARNESS_HEAD = """\
// Test harness for robust_stan.stanfunctions (tests/test_library.py).
functions {
#include robust_stan.stanfunctions
}
data {
  int<lower=1, upper=16> family;  // 1 normal, 2 student_t, 3 bernoulli_logit, 4 binomial_logit,
                                  // 5 poisson_log, 6 categorical_logit, 7 multi_normal_cholesky, 8 exponential,
                                  // 9 lognormal, 10 gamma, 11 weibull, 12 beta, 13 neg_binomial_2_log,
                                  // 14 beta_binomial, 15 ordered_logistic, 16 ordered_probit
  int<lower=0> variant;          // which overload (argument list) of the public functions
  int<lower=0, upper=6> tilde;   // model-block statement (0: none)
  int<lower=0, upper=3> divergence;  // divergence code of the tilde = 4 statement
  int<lower=1> N;
  real a;
  vector[N] w;
  vector[N] y_real;
  array[N] int y_int;
  array[N] int trials;
  real nu;
  vector[N] loc;
  real loc_s;
  vector[N] scale;
  real scale_s;
  vector[N] eta;
  real eta_s;
  int<lower=1> K;
  matrix[N, K] eta_mat;
  row_vector[K] eta_row;
  vector[K - 1] cuts;
  array[N] vector[K - 1] cuts_arr;
  int<lower=1> D;
  array[N] vector[D] y_mv;
  array[N] vector[D] mu_mv;
  vector[D] mu_mv_s;
  matrix[D, D] L;
}
transformed data {
  // the poisson_log fast path's table of log I_a (a header alone where a is not in (0, 4])
  real table_a = family == 5 && a > 0 ? a : 0;
  matrix[robust_poisson_log_integral_table_rows(table_a), 5] integral_table = robust_poisson_log_integral_table(table_a);
}
parameters {
  real theta;
}
model {
"""


def harness_code() -> str:
    """The harness program: one compile covers every family, overload and function form."""
    lines = [_HARNESS_HEAD]
    for code, statement in TILDE.items():
        lines.append(f"  if (tilde == {code}) {statement}\n")
    lines.append("}\n")
    lines.append("""\
generated quantities {
  vector[N] log_density = rep_vector(not_a_number(), N);
  vector[N] log_integral = rep_vector(not_a_number(), N);
  vector[N] log_integral_tabled = rep_vector(not_a_number(), N);  // poisson_log from integral_table
  vector[3] total = rep_vector(not_a_number(), 3);        // betad, gammad, gammaorig: F_lpdf
  vector[3] weighted = rep_vector(not_a_number(), 3);     // F_weighted_lpdf
  matrix[3, N] pointwise = rep_matrix(not_a_number(), 3, N);  // F_pointwise_loss
  vector[4] dispatch_weighted = rep_vector(not_a_number(), 4);  // robust_F_weighted_lpdf, codes 0..3
  matrix[4, N] dispatch_pointwise = rep_matrix(not_a_number(), 4, N);  // robust_F_pointwise_loss
""")
    for fam in FAMILY_TABLE.values():
        f, s = fam.stan_name, fam.suffix
        lines.append(f"  if (family == {fam.code}) {{\n")
        lines.append(f"    log_density = rs_{f}_log_density({fam.core.y}, {fam.core.args});\n")
        lines.append(f"    log_integral = rs_{f}_log_integral({fam.core.y}, {fam.core.args}, a);\n")
        if f in FAMILIES_WITH_TABLES:
            lines.append(f"    if (a > 0) log_integral_tabled = rs_{f}_log_integral({fam.core.y}, {fam.core.args}, a, "
                         "integral_table);\n")
            # variant 9: a table built for a, called with 2a (must be refused)
            lines.append(f"    if (variant == 9) log_integral_tabled = rs_{f}_log_integral({fam.core.y}, {fam.core.args}, "
                         "2 * a, integral_table);\n")
        for v, o in enumerate(fam.overloads):
            lines.append(f"    if (variant == {v}) {{\n")
            for row, prefix in enumerate(("betad", "gammad", "gammaorig"), start=1):
                lines.append(f"      total[{row}] = {prefix}_{f}_{s}({o.y} | {o.args}, a{o.tail});\n")
                lines.append(f"      weighted[{row}] = {prefix}_{f}_weighted_{s}({o.y} | {o.args}, a, w{o.tail});\n")
                lines.append(f"      pointwise[{row}] = {prefix}_{f}_pointwise_loss({o.y}, {o.args}, a{o.tail})';\n")
            lines.append("      for (d in 0:3) {\n")
            lines.append(f"        dispatch_weighted[d + 1] = robust_{f}_weighted_{s}({o.y} | {o.args}, d, a, w{o.tail});\n")
            lines.append(f"        dispatch_pointwise[d + 1] = robust_{f}_pointwise_loss({o.y}, {o.args}, d, a{o.tail})';\n")
            lines.append("      }\n    }\n")
        lines.append("  }\n")
    lines.append("}\n")
    return "".join(lines)


@pytest.fixture(scope="module")
def harness():
    return compile_program(harness_code(), engine=ENGINE, show_progress=False)


def base_data(n: int, a: float, **overrides) -> dict:
    """Harness data with every input present (dummies), then the overrides."""
    K = int(overrides.get("K", 2))
    D = int(overrides.get("D", 1))
    data = {
        "family": 1, "variant": 0, "tilde": 0, "divergence": 0,
        "N": n, "a": float(a), "w": np.ones(n),
        "y_real": np.zeros(n), "y_int": np.zeros(n, dtype=np.int64), "trials": np.zeros(n, dtype=np.int64),
        "nu": 3.0, "loc": np.zeros(n), "loc_s": 0.0, "scale": np.ones(n), "scale_s": 1.0,
        "eta": np.zeros(n), "eta_s": 0.0,
        "K": K, "eta_mat": np.zeros((n, K)), "eta_row": np.zeros(K),
        "cuts": np.linspace(-1, 1, K - 1), "cuts_arr": np.tile(np.linspace(-1, 1, K - 1), (n, 1)),
        "D": D, "y_mv": np.zeros((n, D)), "mu_mv": np.zeros((n, D)), "mu_mv_s": np.zeros(D), "L": np.eye(D),
    }
    data.update(overrides)
    for key in ("y_int", "trials"):
        data[key] = np.asarray(data[key], dtype=np.int64)
    for key in ("family", "variant", "tilde", "divergence", "N", "K", "D"):
        data[key] = int(data[key])
    return data


def run(harness, data: dict) -> dict:
    """Every generated quantity of the harness at theta = 0."""
    return harness.constrain(data, np.zeros(1))


# ---------------------------------------------------------------------------
# Independent references
# ---------------------------------------------------------------------------


def quad_log_integral(logpdf, a: float, points, lower=-np.inf, upper=np.inf) -> float:
    """log of the integral of exp((1 + a) * logpdf(x)) over (lower, upper), by quad.

    The range is split at ``points`` (mode, and a few scales either side) so that
    QUADPACK sees every piece of mass; infinite ends use its qagi transform.
    """
    s = 1.0 + a
    edges = [lower] + sorted(p for p in points if lower < p < upper) + [upper]
    total = 0.0
    for lo, hi in zip(edges, edges[1:]):
        value, _ = integrate.quad(lambda x: math.exp(s * logpdf(x)), lo, hi, epsabs=0.0, epsrel=1e-13, limit=500)
        total += value
    return math.log(total)


def dblquad_log_integral(logpdf2, a: float, box) -> float:
    """log of the double integral of exp((1 + a) * logpdf2(x1, x2)) over a box."""
    s = 1.0 + a
    (x_lo, x_hi), (y_lo, y_hi) = box
    value, _ = integrate.dblquad(lambda x2, x1: math.exp(s * logpdf2(x1, x2)), x_lo, x_hi, y_lo, y_hi,
                                 epsabs=0.0, epsrel=1e-12)
    return math.log(value)


def log_sum_pmf(logpmf, a: float, support) -> float:
    """log of sum over the support of exp((1 + a) * logpmf(k)), in log space."""
    return float(logsumexp((1.0 + a) * logpmf(np.asarray(support))))


def checked(fast, frozen, points):
    """``fast`` (a scalar log density for QUADPACK's thousands of calls; scipy.stats'
    per-call overhead would make the quadratures take minutes), after checking it
    equals the scipy.stats log density ``frozen.logpdf`` at ``points``."""
    points = np.asarray(points, dtype=float)
    expected = frozen.logpdf(points)
    got = np.array([fast(*np.atleast_1d(x)) for x in points])
    np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-13)
    return fast


@functools.cache
def ref_log_integral(family: str, a: float, *params) -> float:
    """Independent log I_a(theta) = log integral of p(y | theta)^(1 + a), for one theta.

    Continuous families by quad / dblquad of the density, discrete ones by a direct
    sum of scipy.stats pmfs over the support (Poisson: to lambda + 60 sd + 100, far
    beyond any term that matters; large means in 30 digits, see poisson_log_integral_mp).
    """
    if family == "normal":
        m, sd = params
        dist = stats.norm(m, sd)
        c = -math.log(sd) - 0.5 * math.log(2 * math.pi)
        f = checked(lambda x: c - 0.5 * ((x - m) / sd) ** 2, dist, m + sd * np.linspace(-30, 30, 13))
        return quad_log_integral(f, a, [m - 5 * sd, m, m + 5 * sd])
    if family == "student_t":
        nu, m, sd = params
        dist = stats.t(nu, m, sd)
        c = math.lgamma((nu + 1) / 2) - math.lgamma(nu / 2) - 0.5 * math.log(nu * math.pi) - math.log(sd)
        f = checked(lambda x: c - (nu + 1) / 2 * math.log1p(((x - m) / sd) ** 2 / nu), dist,
                    m + sd * np.array([-1e4, -30, -3, -0.5, 0, 0.7, 4, 100, 1e5]))
        return quad_log_integral(f, a, [m - 50 * sd, m - 5 * sd, m - sd, m, m + sd, m + 5 * sd, m + 50 * sd])
    if family == "exponential":
        (rate,) = params
        f = checked(lambda x: math.log(rate) - rate * x, stats.expon(scale=1 / rate), np.array([0, 0.5, 3, 40]) / rate)
        return quad_log_integral(f, a, [0.1 / rate, 1 / rate, 5 / rate, 30 / rate], lower=0.0)
    if family == "bernoulli_logit":
        (eta,) = params
        return log_sum_pmf(lambda k: stats.bernoulli.logpmf(k, special.expit(eta)), a, [0, 1])
    if family == "binomial_logit":
        trials, eta = params
        return log_sum_pmf(lambda k: stats.binom.logpmf(k, trials, special.expit(eta)), a, np.arange(trials + 1))
    if family == "poisson_log":
        (lam,) = params
        if lam > 1000:
            return poisson_log_integral_mp(lam, a)
        return log_sum_pmf(lambda k: stats.poisson.logpmf(k, lam), a, np.arange(0, int(lam + 60 * math.sqrt(lam) + 100)))
    if family == "categorical_logit":
        probs = special.softmax(np.array(params))
        K = len(probs)
        return log_sum_pmf(lambda k: stats.multinomial.logpmf(np.eye(K)[k], 1, probs), a, np.arange(K))
    if family == "multi_normal_cholesky":
        # params: the entries of Sigma (row-major); I_a does not depend on the mean.
        D = int(round(math.sqrt(len(params))))
        cov = np.array(params).reshape(D, D)
        if D == 1:
            return ref_log_integral("normal", a, 0.0, math.sqrt(cov[0, 0]))
        if D != 2:
            raise ValueError("the quadrature reference covers d = 1 and d = 2")
        dist = stats.multivariate_normal(np.zeros(2), cov)
        prec = np.linalg.inv(cov)
        c = -math.log(2 * math.pi) - 0.5 * np.linalg.slogdet(cov)[1]
        f = checked(lambda x1, x2: c - 0.5 * (prec[0, 0] * x1 * x1 + 2 * prec[0, 1] * x1 * x2 + prec[1, 1] * x2 * x2),
                    dist, [[0.0, 0.0], [1.0, -3.0], [4.0, 2.0], [-7.0, 0.5]])
        sds = np.sqrt(np.diag(cov))
        # mean +- 14 marginal sds: the mass of p^(1+a) outside is below 1e-40
        return dblquad_log_integral(f, a, [(-14 * sds[0], 14 * sds[0]), (-14 * sds[1], 14 * sds[1])])
    if family in CONTINUOUS_ON_A_LINE:
        return mp_log_integral(*CONTINUOUS_ON_A_LINE[family](a, *params))
    if family == "neg_binomial_2_log":
        return neg_binomial_2_log_integral(a, *params)
    if family == "beta_binomial":
        return beta_binomial_integral_mp(a, *params)
    if family in ("ordered_logistic", "ordered_probit"):
        return ordinal_integral_mp(family, a, *params)
    raise KeyError(family)


def mp_log_integral(f_mp, f_float) -> float:
    """log of the integral over the real line of exp(f(z)), f concave (a log density of y in a variable
    z on the whole line, times 1 + a, plus the log-Jacobian): the peak and its width h from the float64
    f_float, then 25-digit tanh-sinh quadrature (mpmath) of the 25-digit f_mp between the points where
    f is 90 below its peak (a concave f's tails beyond them hold less than e^-90 of the mass per unit of
    its slope there), split at the peak and 1, 5 and 20 widths either side."""
    grid = np.linspace(-80, 80, 1601)
    values = np.array([f_float(z) for z in grid])
    i = int(np.nanargmax(values))
    z0 = optimize.minimize_scalar(lambda z: -f_float(z), bounds=(grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]),
                                  method="bounded", options={"xatol": 1e-12}).x
    f0, h = f_float(z0), 1e-3
    for _ in range(3):  # the width from the curvature, with a step that follows the width
        curvature = -(f_float(z0 + 0.01 * h) - 2 * f0 + f_float(z0 - 0.01 * h)) / (0.01 * h) ** 2
        h = 1 / math.sqrt(curvature) if curvature > 0 else 1.0
    ends = []
    for sign in (-1, 1):
        step = h
        while f_float(z0 + sign * step) - f0 > -90:
            step *= 2
        ends.append(z0 + sign * step)
    points = sorted({z0 + h * m for m in (-20, -5, -1, 0, 1, 5, 20) if ends[0] < z0 + h * m < ends[1]})
    with mpmath.workdps(25):
        peak = f_mp(mpmath.mpf(z0))
        total = mpmath.quad(lambda z: mpmath.exp(f_mp(z) - peak), [mpmath.mpf(x) for x in [ends[0], *points, ends[1]]])
        return float(peak + mpmath.log(total))


def _log_integrand(a, log_density_mp, log_density, scale, check_points, frozen, size=1.0):
    """(f_mp, f_float) for mp_log_integral: (1 + a) log p(y) + log |dy/dz| as functions of z (z = log y
    for ``scale`` "log", logit y for "logit"); the log densities take z too, so that no y under- or
    overflows. Both are first checked at z in ``check_points`` against scipy.stats' ``frozen.logpdf``:
    to 1e-12 relative, or 1e-13 of ``size``, the magnitude of the terms a float64 log density adds
    (shape * log y, lgamma(shape), ...), since each side rounds at that size."""
    ys = [math.exp(z) if scale == "log" else float(special.expit(z)) for z in check_points]
    expected = frozen.logpdf(ys)
    tolerance = dict(rtol=1e-12, atol=1e-13 * max(1.0, size))
    np.testing.assert_allclose([log_density(z) for z in check_points], expected, **tolerance)
    with mpmath.workdps(25):
        np.testing.assert_allclose([float(log_density_mp(mpmath.mpf(z))) for z in check_points], expected, **tolerance)
    s, s_mp = 1.0 + a, 1 + mpmath.mpf(a)
    if scale == "log":
        return (lambda z: s_mp * log_density_mp(z) + z,
                _float_or_minus_inf(lambda z: s * log_density(z) + z))
    return (lambda z: s_mp * log_density_mp(z) - mpmath.log1p(mpmath.exp(-z)) - mpmath.log1p(mpmath.exp(z)),
            _float_or_minus_inf(lambda z: s * log_density(z) - np.logaddexp(0, -z) - np.logaddexp(0, z)))


def _float_or_minus_inf(f):
    def safe(z):
        try:
            return float(f(z))
        except OverflowError:
            return -math.inf
    return safe


def _lognormal_integrand(a, m, sd):
    with mpmath.workdps(30):
        c_mp = -mpmath.log(sd) - mpmath.log(2 * mpmath.pi) / 2
    c = -math.log(sd) - 0.5 * math.log(2 * math.pi)
    return _log_integrand(
        a, lambda z: c_mp - z - (z - m) ** 2 / (2 * mpmath.mpf(sd) ** 2),
        lambda z: c - z - (z - m) ** 2 / (2 * sd * sd),
        "log", m + sd * np.array([-3.0, 0.0, 2.0]), stats.lognorm(sd, scale=math.exp(m)), size=abs(m) + 1)


def _gamma_integrand(a, shape, rate):
    with mpmath.workdps(30):
        c_mp = shape * mpmath.log(rate) - mpmath.loggamma(shape)
    c = shape * math.log(rate) - math.lgamma(shape)
    mean = shape / rate
    return _log_integrand(
        a, lambda z: c_mp + (shape - 1) * z - rate * mpmath.exp(z),
        lambda z: c + (shape - 1) * z - rate * math.exp(z),
        "log", np.log(mean * np.array([0.5, 1.0, 2.0])), stats.gamma(shape, scale=1 / rate),
        size=abs(c) + shape * (abs(math.log(mean)) + 3))


def _weibull_integrand(a, shape, scale):
    with mpmath.workdps(30):
        c_mp = mpmath.log(shape) - mpmath.log(scale)
        log_scale_mp = mpmath.log(scale)
    c, log_scale = math.log(shape) - math.log(scale), math.log(scale)
    return _log_integrand(
        a, lambda z: c_mp + (shape - 1) * (z - log_scale_mp) - mpmath.exp(shape * (z - log_scale_mp)),
        lambda z: c + (shape - 1) * (z - log_scale) - math.exp(shape * (z - log_scale)),
        "log", log_scale + np.array([-0.3, 0.0, 0.2]) / max(1.0, shape), stats.weibull_min(shape, scale=scale),
        size=abs(c) + shape * (abs(log_scale) + 1))


def _beta_integrand(a, s1, s2):
    with mpmath.workdps(30):
        c_mp = -mpmath.log(mpmath.beta(s1, s2))
    c = -float(special.betaln(s1, s2))
    mean_logit = math.log(s1 / s2)
    return _log_integrand(
        a, lambda z: c_mp - (s1 - 1) * mpmath.log1p(mpmath.exp(-z)) - (s2 - 1) * mpmath.log1p(mpmath.exp(z)),
        lambda z: c - (s1 - 1) * np.logaddexp(0, -z) - (s2 - 1) * np.logaddexp(0, z),
        "logit", mean_logit + np.array([-0.5, 0.0, 0.5]) / max(1.0, math.sqrt(min(s1, s2))), stats.beta(s1, s2),
        size=abs(c) + (s1 + s2) * (abs(mean_logit) + 2))


CONTINUOUS_ON_A_LINE = {"lognormal": _lognormal_integrand, "gamma": _gamma_integrand,
                        "weibull": _weibull_integrand, "beta": _beta_integrand}


def beta_log_integral_mp(a: float, shape1: float, shape2: float) -> float:
    """log I_a for beta(shape1, shape2) in 40 digits from its closed form: the integral of p^s over (0, 1),
    s = 1 + a, is B(x, z) / B(shape1, shape2)^s with x = s (shape1 - 1) + 1 and z = s (shape2 - 1) + 1 (+inf
    unless both are positive). The 25-digit quadrature of the density (mp_log_integral) gives the same
    numbers (test_beta_closed_form_reference_is_the_quadrature_of_the_density); the edge grid uses this
    form because quadrature at each of its points was the slowest reference in this file."""
    with mpmath.workdps(40):
        s, u, v = 1 + mpmath.mpf(a), mpmath.mpf(shape1), mpmath.mpf(shape2)
        x, z = s * (u - 1) + 1, s * (v - 1) + 1
        if x <= 0 or z <= 0:
            return math.inf
        return float(mpmath.log(mpmath.beta(x, z)) - s * mpmath.log(mpmath.beta(u, v)))


def neg_binomial_2_log_integral(a: float, mu: float, phi: float) -> float:
    """log sum_k p_k^(1+a) for neg_binomial_2(mu, phi) by a direct float64 sum of scipy.stats' log pmf
    over k = 0 .. K, K where the terms have fallen below e^-80 of the largest and, beyond it, by a ratio
    of at most rho^(1+a) per step (rho = mu / (mu + phi)) whose geometric tail is also below e^-80."""
    s, rho = 1.0 + a, mu / (mu + phi)
    dist = stats.nbinom(phi, phi / (mu + phi))
    log_ratio = s * math.log(rho)   # the terms' ratio tends to rho^s from either side
    tail = int(100 / -log_ratio) if log_ratio < 0 else 0
    upper = int(mu + 40 * math.sqrt(mu + mu * mu / phi) + 100 + tail)
    k = np.arange(0, upper + 1)
    log_terms = s * dist.logpmf(k)
    assert log_terms[-1] < log_terms.max() - 80, (mu, phi, a)
    return float(logsumexp(log_terms))


def beta_binomial_integral_mp(a: float, trials: float, shape1: float, shape2: float) -> float:
    """log sum_k p_k^(1+a) for beta_binomial(trials, shape1, shape2) by a 40-digit direct sum of its
    pmf C(trials, k) B(k + shape1, trials - k + shape2) / B(shape1, shape2), from log-gamma functions."""
    with mpmath.workdps(40):
        s, u, v, n = 1 + mpmath.mpf(a), mpmath.mpf(shape1), mpmath.mpf(shape2), int(trials)
        log_b = mpmath.loggamma(u) + mpmath.loggamma(v) - mpmath.loggamma(u + v)
        total = mpmath.fsum(mpmath.exp(s * (mpmath.log(mpmath.binomial(n, k)) + mpmath.loggamma(k + u)
                                            + mpmath.loggamma(n - k + v) - mpmath.loggamma(n + u + v) - log_b))
                            for k in range(n + 1))
        return float(mpmath.log(total))


def ordinal_integral_mp(family: str, a: float, eta: float, *cut_points: float) -> float:
    """log sum_k p_k^(1+a) for ordered_logistic or ordered_probit(eta, c) in 30 digits:
    p_k = F(c_k - eta) - F(c_(k-1) - eta), c_0 = -inf, c_K = inf, F the logistic or normal cdf."""
    with mpmath.workdps(30):
        def cdf(x):
            if family == "ordered_logistic":
                return 1 / (1 + mpmath.exp(-x))
            return mpmath.ncdf(x)
        edges = [cdf(mpmath.mpf(c) - mpmath.mpf(eta)) for c in cut_points]
        upper, lower = edges + [mpmath.mpf(1)], [mpmath.mpf(0)] + edges
        total = mpmath.fsum((hi - lo) ** (1 + mpmath.mpf(a)) for hi, lo in zip(upper, lower))
        return float(mpmath.log(total))


def poisson_log_integral_mp(lam: float, a: float) -> float:
    """log sum_k p_k^(1+a) for Poisson(lam) by a 30-digit direct sum over lam +- 14 sd."""
    with mpmath.workdps(30):
        lam_mp, s = mpmath.mpf(lam), 1 + mpmath.mpf(a)
        log_lam = mpmath.log(lam_mp)
        sd = math.sqrt(lam / (1.0 + a))
        lo, hi = max(0, int(lam - 14 * sd) - 20), int(lam + 14 * sd) + 40
        total = mpmath.fsum(mpmath.exp(s * (k * log_lam - lam_mp - mpmath.loggamma(k + 1))) for k in range(lo, hi + 1))
        return float(mpmath.log(total))


def reference_losses(log_p: np.ndarray, log_i: np.ndarray, a: float, w: np.ndarray) -> dict:
    """DESIGN.md section 2 in NumPy: per-observation losses, weighted totals and their scales.

    Returns, for each divergence name, (pointwise l_i, weighted total, unweighted
    total, scale_pointwise, scale_weighted, scale_total); the scales are the
    magnitudes of the summands, against which rounding is judged.
    gamma (original) with weights v, V = sum(v), as the library header defines it:
        L = -(V/gamma) log(sum_i v_i p_i^gamma / V) + (V/(1+gamma)) log(sum_i v_i I_i / V);
    its "pointwise" losses are the gradient-equivalent split, with S_p = sum_j v_j p_j^gamma,
    S_I = sum_j v_j I_j held fixed:  l_i = -(V/gamma) p_i^gamma / S_p + (V/(1+gamma)) I_i / S_I
    (computed with v = 1 for the pointwise form).
    """
    n = len(log_p)
    ones = np.ones(n)
    p_a = np.exp(a * log_p)          # p^a
    integral = np.exp(log_i)         # I_a
    out = {}

    kl = -log_p
    out["kl"] = (kl, w @ kl, kl.sum(), np.abs(kl), np.abs(w) @ np.abs(kl), np.abs(kl).sum())

    beta_terms = (-p_a / a, integral / (1 + a))
    beta = beta_terms[0] + beta_terms[1]
    beta_scale = np.abs(beta_terms[0]) + np.abs(beta_terms[1])
    out["betad"] = (beta, w @ beta, beta.sum(), beta_scale, w @ beta_scale, beta_scale.sum())

    # one exponential, as the formula is written, so a tiny loss does not underflow to 0 early
    gamma = -((1 + a) / a) * np.exp(a * log_p - (a / (1 + a)) * log_i)
    out["gammad"] = (gamma, w @ gamma, gamma.sum(), np.abs(gamma), w @ np.abs(gamma), np.abs(gamma).sum())

    def gamma_original_total(v):
        total_v = v.sum()
        with np.errstate(divide="ignore"):
            term_p = -(total_v / a) * np.log(np.sum(v * p_a) / total_v)
            term_i = (total_v / (1 + a)) * np.log(np.sum(v * integral) / total_v)
        return term_p + term_i, abs(term_p) + abs(term_i) + total_v / a

    split_p = -(n / a) * p_a / p_a.sum()
    split_i = (n / (1 + a)) * integral / integral.sum()
    total_w, scale_w = gamma_original_total(w)
    total_1, scale_1 = gamma_original_total(ones)
    out["gammaorig"] = (split_p + split_i, total_w, total_1, np.abs(split_p) + np.abs(split_i), scale_w, scale_1)
    return out


# Stan's ordered_probit_lpmf takes P(y = k) as a difference of two normal cdfs even where both are near 1,
# so where p is small its log loses about eps / p (5e-5 of log p at p = e^-31 in the cases below). The
# library must use Stan's function (a robustified program's KL density is the program's), so for this
# family the loss formulas are checked on Stan's own log p, which is itself held to the bound of that
# cancellation against an exact reference.
def cancellation_bound(log_p: np.ndarray) -> np.ndarray:
    """The error of log p from a difference of two cdfs each rounded to 2 eps: 8 eps / p (the log's
    error where that is small), plus LOSS_RTOL |log p|."""
    eps = np.finfo(float).eps
    return 8 * eps * np.exp(-np.asarray(log_p)) + LOSS_RTOL * np.abs(log_p)


def stan_ordered_probit_log_p(harness, case: Case, variant: int) -> np.ndarray:
    """Stan's ordered_probit log p of one overload's values (variant 1: eta and cuts shared, 2: cuts
    shared), from the harness's per-observation density, after checking it within cancellation_bound."""
    d, n = case.data, case.data["N"]
    eta = np.full(n, d["eta_s"]) if variant == 1 else d["eta"]
    cuts_arr = d["cuts_arr"] if variant == 0 else np.tile(d["cuts"], (n, 1))
    stan = run(harness, dict(d, eta=eta, cuts_arr=cuts_arr))["log_density"]
    exact = case.log_p[variant]
    assert np.all(np.abs(stan - exact) <= cancellation_bound(exact)), (variant, stan, exact)
    return stan


def rel_err(stan, ref, scale=None) -> np.ndarray:
    """|stan - ref| / max(|ref|, scale, tiny), elementwise."""
    stan, ref = np.asarray(stan, dtype=float), np.asarray(ref, dtype=float)
    denom = np.abs(ref) if scale is None else np.maximum(np.abs(ref), np.asarray(scale, dtype=float))
    # Below ~1e-290 the two sides only differ in how they underflow (Stan may return
    # a subnormal where NumPy returns 0), which says nothing about the formulas.
    return np.abs(stan - ref) / np.maximum(denom, 1e-290)


def log_rel_err(log_stan, log_ref) -> np.ndarray:
    """Relative error of exp(log_stan) as an approximation of exp(log_ref)."""
    return np.abs(np.expm1(np.asarray(log_stan, float) - np.asarray(log_ref, float)))


# ---------------------------------------------------------------------------
# Cases: random parameters per family, with SciPy log densities per overload
# ---------------------------------------------------------------------------


@dataclass
class Case:
    """Harness data for one family, and per overload (variant) the values the
    Stan functions see: SciPy log p per observation and each observation's
    parameter tuple (for ref_log_integral)."""

    family: str
    data: dict
    log_p: list[np.ndarray]       # per variant
    params: list[list[tuple]]     # per variant, per observation

    @property
    def n_variants(self) -> int:
        return len(self.log_p)

    def log_integral(self, variant: int) -> np.ndarray:
        a = self.data["a"]
        return np.array([ref_log_integral(self.family, a, *p) for p in self.params[variant]])


def _rows(n: int, *columns) -> list[tuple]:
    """Per-observation parameter tuples; scalar (shared) columns are repeated."""
    return [tuple(float(np.broadcast_to(c, (n,))[i]) for c in columns) for i in range(n)]


def random_case(family: str, a: float, seed: int, n: int = 9, D: int = 2, K: int = 4) -> Case:
    """Random per-observation parameters, shared values and outcomes (row 0 an outlier)."""
    rng = np.random.default_rng(seed)
    code = FAMILY_TABLE[family].code
    if family in ("normal", "student_t"):
        nu = 3.5
        loc, scale = rng.normal(0, 2, n), rng.uniform(0.3, 3.0, n)
        loc_s, scale_s = 0.7, 1.9
        y = loc + 1.5 * scale * rng.standard_t(5, n)
        y[0] = loc[0] + 12 * scale[0]
        data = base_data(n, a, family=code, y_real=y, loc=loc, scale=scale, loc_s=loc_s, scale_s=scale_s, nu=nu)
        combos = [(loc, scale), (loc_s, scale_s), (loc_s, scale), (loc, scale_s)]  # variants 0..3
        if family == "normal":
            return Case(family, data, [stats.norm.logpdf(y, m, s) for m, s in combos],
                        [_rows(n, m, s) for m, s in combos])
        return Case(family, data, [stats.t.logpdf(y, nu, m, s) for m, s in combos],
                    [_rows(n, nu, m, s) for m, s in combos])
    if family == "exponential":
        rate, rate_s = rng.uniform(0.2, 5.0, n), 1.3
        y = rng.exponential(1 / rate)
        y[0] = 15 / rate[0]
        data = base_data(n, a, family=code, y_real=y, scale=rate, scale_s=rate_s)
        return Case(family, data, [stats.expon.logpdf(y, scale=1 / r) for r in (rate, rate_s)],
                    [_rows(n, r) for r in (rate, rate_s)])
    if family in TWO_ARGUMENT_CONTINUOUS:
        first, second, draw, outlier, frozen = TWO_ARGUMENT_CONTINUOUS[family]
        p1, p2 = first(rng, n), second(rng, n)
        p1_s, p2_s = float(first(rng, 1)[0]), float(second(rng, 1)[0])
        y = np.clip(draw(rng, p1, p2), 1e-300, None)
        y[0] = outlier(p1[0], p2[0])
        if family == "beta":
            y = np.clip(y, 1e-6, 1 - 1e-6)
        data = base_data(n, a, family=code, y_real=y, loc=p1, scale=p2, loc_s=p1_s, scale_s=p2_s)
        combos = [(p1, p2), (p1_s, p2_s), (p1, p2_s) if family == "gamma" else (p1_s, p2)][:len(FAMILY_TABLE[family].overloads)]
        return Case(family, data, [frozen(u, v).logpdf(y) for u, v in combos], [_rows(n, u, v) for u, v in combos])
    if family == "neg_binomial_2_log":
        mu, phi = np.exp(rng.uniform(np.log(0.05), np.log(300), n)), rng.uniform(0.3, 20, n)
        eta_s, phi_s = 1.3, 2.5
        y = rng.negative_binomial(phi, phi / (mu + phi))
        y[0] = int(mu[0] + 8 * np.sqrt(mu[0] + mu[0] ** 2 / phi[0]) + 5)
        data = base_data(n, a, family=code, y_int=y, eta=np.log(mu), scale=phi, eta_s=eta_s, scale_s=phi_s)
        combos = [(np.log(mu), phi), (eta_s, phi_s), (eta_s, phi)]
        log_p = [stats.nbinom.logpmf(y, f, f / (np.exp(e) + f)) for e, f in combos]
        return Case(family, data, log_p, [_rows(n, np.exp(e), f) for e, f in combos])
    if family in ("bernoulli_logit", "binomial_logit", "poisson_log"):
        if family == "bernoulli_logit":
            eta, eta_s = rng.normal(0, 2.5, n), -0.8
            y = rng.integers(0, 2, n)
            y[0] = 1 if eta[0] < 0 else 0
            data = base_data(n, a, family=code, y_int=y, eta=eta, eta_s=eta_s)
            return Case(family, data, [stats.bernoulli.logpmf(y, special.expit(e)) for e in (eta, eta_s)],
                        [_rows(n, e) for e in (eta, eta_s)])
        if family == "binomial_logit":
            trials = rng.integers(0, 40, n)
            trials[1] = 0
            eta, eta_s = rng.normal(0, 1.5, n), 0.4
            y = rng.binomial(trials, special.expit(eta))
            y[0] = trials[0] if eta[0] < 0 else 0
            data = base_data(n, a, family=code, y_int=y, trials=trials, eta=eta, eta_s=eta_s)
            return Case(family, data, [stats.binom.logpmf(y, trials, special.expit(e)) for e in (eta, eta_s)],
                        [[(int(t), e_i) for t, (e_i,) in zip(trials, _rows(n, e))] for e in (eta, eta_s)])
        lam = np.exp(rng.uniform(np.log(0.05), np.log(400), n))
        lam[1] = 0.01
        eta, eta_s = np.log(lam), 1.7
        y = rng.poisson(lam)
        y[0] = int(lam[0] + 6 * np.sqrt(lam[0]) + 6)
        data = base_data(n, a, family=code, y_int=y, eta=eta, eta_s=eta_s)
        rates = (np.exp(eta), np.exp(eta_s)) * 2  # what Stan sees; variants 2, 3 repeat 0, 1 with the table
        return Case(family, data, [stats.poisson.logpmf(y, r) for r in rates], [_rows(n, r) for r in rates])
    if family == "categorical_logit":
        eta_mat, eta_row = rng.normal(0, 1.5, (n, K)), rng.normal(0, 1.5, K)
        y = rng.integers(1, K + 1, n)
        y[0] = int(np.argmin(eta_mat[0])) + 1
        data = base_data(n, a, family=code, y_int=y, K=K, eta_mat=eta_mat, eta_row=eta_row)
        log_p, params = [], []
        for e in (eta_mat, np.tile(eta_row, (n, 1))):
            probs = special.softmax(e, axis=1)
            log_p.append(np.array([stats.multinomial.logpmf(np.eye(K)[y[i] - 1], 1, probs[i]) for i in range(n)]))
            params.append([tuple(row) for row in e])
        return Case(family, data, log_p, params)
    if family == "multi_normal_cholesky":
        A = rng.normal(size=(D, D))
        cov = A @ A.T + 0.5 * np.eye(D)
        L = np.linalg.cholesky(cov)
        mu, mu_s = rng.normal(0, 1, (n, D)), rng.normal(0, 1, D)
        y = mu + 1.3 * rng.normal(size=(n, D)) @ L.T
        y[0] = mu[0] + 6 * np.sqrt(np.diag(cov))
        data = base_data(n, a, family=code, D=D, y_mv=y, mu_mv=mu, mu_mv_s=mu_s, L=L)
        log_p = [np.array([stats.multivariate_normal.logpdf(y[i], m[i], cov) for i in range(n)])
                 for m in (mu, np.tile(mu_s, (n, 1)))]
        sigma = tuple((L @ L.T).ravel())
        return Case(family, data, log_p, [[sigma] * n, [sigma] * n])
    if family == "beta_binomial":
        trials = rng.integers(0, 40, n)
        trials[1] = 0
        p1, p2 = rng.uniform(0.3, 8.0, n), rng.uniform(0.3, 8.0, n)
        p1_s, p2_s = 2.5, 0.7
        y = rng.binomial(trials, rng.beta(p1, p2))
        y[0] = trials[0] if p1[0] < p2[0] else 0
        data = base_data(n, a, family=code, y_int=y, trials=trials, loc=p1, scale=p2, loc_s=p1_s, scale_s=p2_s)
        combos = [(p1, p2), (p1_s, p2_s), (p1_s, p2)]
        return Case(family, data, [stats.betabinom.logpmf(y, trials, u, v) for u, v in combos],
                    [[(int(t), *uv) for t, uv in zip(trials, _rows(n, u, v))] for u, v in combos])
    if family in ("ordered_logistic", "ordered_probit"):
        eta, eta_s = rng.normal(0, 2, n), -0.6
        cuts_arr = np.sort(rng.normal(0, 1.5, (n, K - 1)), axis=1)
        cuts = np.sort(rng.normal(0, 1.5, K - 1))
        y = rng.integers(1, K + 1, n)
        y[0] = 1 if eta[0] > 0 else K
        data = base_data(n, a, family=code, K=K, y_int=y, eta=eta, eta_s=eta_s, cuts=cuts, cuts_arr=cuts_arr)
        combos = [(eta, cuts_arr), (np.full(n, eta_s), np.tile(cuts, (n, 1))), (eta, np.tile(cuts, (n, 1)))]
        law = stats.logistic if family == "ordered_logistic" else stats.norm
        log_p, params = [], []
        for e, c in combos:
            edges = np.column_stack([np.full(n, -np.inf), c, np.full(n, np.inf)])
            rows = np.arange(n)
            lower, upper = edges[rows, y - 1] - e, edges[rows, y] - e
            # above the median a difference of survival functions (of cdfs it would cancel)
            log_p.append(np.log(np.where(lower > 0, law.sf(lower) - law.sf(upper), law.cdf(upper) - law.cdf(lower))))
            params.append([(float(e[i]), *map(float, c[i])) for i in range(n)])
        return Case(family, data, log_p, params)
    raise KeyError(family)


# family -> (draw of the first argument, of the second, of y, the outlier y of row 0, the scipy.stats law)
TWO_ARGUMENT_CONTINUOUS = {
    "lognormal": (lambda rng, n: rng.normal(0, 1.5, n), lambda rng, n: rng.uniform(0.3, 2.0, n),
                  lambda rng, m, sd: np.exp(m + sd * rng.standard_t(5, m.size)), lambda m, sd: math.exp(m + 8 * sd),
                  lambda m, sd: stats.lognorm(sd, scale=np.exp(m))),
    "gamma": (lambda rng, n: rng.uniform(0.6, 8.0, n), lambda rng, n: rng.uniform(0.3, 3.0, n),
              lambda rng, k, r: rng.gamma(k, 1 / r), lambda k, r: 25 * k / r,
              lambda k, r: stats.gamma(k, scale=1 / r)),
    "weibull": (lambda rng, n: rng.uniform(0.7, 4.0, n), lambda rng, n: rng.uniform(0.5, 3.0, n),
                lambda rng, k, sc: sc * rng.weibull(k), lambda k, sc: 6 * sc,
                lambda k, sc: stats.weibull_min(k, scale=sc)),
    "beta": (lambda rng, n: rng.uniform(0.8, 6.0, n), lambda rng, n: rng.uniform(0.8, 6.0, n),
             lambda rng, u, v: rng.beta(u, v), lambda u, v: 0.999 if u < v else 0.001,
             lambda u, v: stats.beta(u, v)),
}

FAMILY_NAMES = list(FAMILY_TABLE)


# ---------------------------------------------------------------------------
# 0. The committed library is current; the harness covers every family
# ---------------------------------------------------------------------------


def test_committed_library_is_current():
    """stan/robust_stan.stanfunctions is what the template and family table render to."""
    assert library_code() == render_library(), (
        f"stan/{LIBRARY_FILE} is stale: run `python -m tools.stan_library --write`")


def test_harness_covers_every_family_and_overload():
    from robust_stan.building.families import FAMILIES

    assert {f.stan_name for f in FAMILIES.values()} == set(FAMILY_TABLE)
    for fam in FAMILIES.values():
        overloads = {sig["args_decl"] for sig in fam.signatures}
        harness_fam = FAMILY_TABLE[fam.stan_name]
        # every family: its all-per-observation overload and an all-shared one
        assert len(harness_fam.overloads) >= 2
        if fam.stan_name in ("normal", "student_t"):
            assert len(harness_fam.overloads) == len(overloads) == 4


# ---------------------------------------------------------------------------
# 1. Closed-form integral terms against quadrature and direct sums
# ---------------------------------------------------------------------------


def check_integrals(harness, family: str, a: float, inputs: dict, params: list[tuple], reference=None):
    """rs_F_log_integral on ``inputs`` (one theta per observation) against the reference."""
    if reference is None:
        reference = np.array([ref_log_integral(family, a, *p) for p in params])
    data = base_data(len(reference), a, family=FAMILY_TABLE[family].code, **inputs)
    out = run(harness, data)
    err = record("integral", family, log_rel_err(out["log_integral"], reference))
    assert err < INTEGRAL_RTOL, (family, a, out["log_integral"], reference)
    return out


@pytest.mark.stan
@pytest.mark.parametrize("a", A_GRID)
def test_normal_integral(harness, a):
    mu = np.array([-3.0, 0.0, 0.4, 7.5, 0.0])
    sigma = np.array([0.05, 0.3, 1.0, 2.5, 40.0])
    check_integrals(harness, "normal", a, {"loc": mu, "scale": sigma}, _rows(len(mu), mu, sigma))


@pytest.mark.stan
@pytest.mark.parametrize("nu", [1.0, 2.5, 7.0, 60.0])
@pytest.mark.parametrize("a", A_GRID)
def test_student_t_integral(harness, a, nu):
    mu = np.array([-2.0, 0.0, 3.3])
    sigma = np.array([0.2, 1.0, 6.0])
    check_integrals(harness, "student_t", a, {"nu": nu, "loc": mu, "scale": sigma}, _rows(len(mu), nu, mu, sigma))


@pytest.mark.stan
@pytest.mark.parametrize("a", A_GRID)
def test_exponential_integral(harness, a):
    rate = np.array([0.01, 0.3, 1.0, 4.0, 250.0])
    check_integrals(harness, "exponential", a, {"scale": rate, "y_real": np.ones(5)}, _rows(len(rate), rate))


@pytest.mark.stan
@pytest.mark.parametrize("a", A_GRID)
def test_bernoulli_integral(harness, a):
    eta = np.array([-30.0, -4.0, -0.5, 0.0, 1.2, 6.0, 35.0])
    check_integrals(harness, "bernoulli_logit", a, {"eta": eta}, _rows(len(eta), eta))


@pytest.mark.stan
@pytest.mark.parametrize("a", A_GRID)
def test_binomial_integral(harness, a):
    trials = np.array([0, 1, 5, 30, 200, 200])
    eta = np.array([0.3, -1.0, 2.0, 0.0, -3.0, 0.7])
    check_integrals(harness, "binomial_logit", a, {"trials": trials, "eta": eta},
                    [(int(t), float(e)) for t, e in zip(trials, eta)])


POISSON_LAMBDAS = np.array([0.01, 0.1, 0.5, 1.0, 1.0 + 1e-9, 3.7, 10.0, 49.5, 50.0, 200.0, 500.0])


@pytest.mark.stan
@pytest.mark.parametrize("a", A_GRID)
def test_poisson_integral(harness, a):
    """lambda from 0.01 to 500: float64 direct sums over k = 0 .. lambda + 60 sd + 100."""
    eta = np.log(POISSON_LAMBDAS)
    check_integrals(harness, "poisson_log", a, {"eta": eta}, _rows(len(eta), np.exp(eta)))


@pytest.mark.stan
@pytest.mark.parametrize("a", (0.05, 1.0, 2.0, 20.0))
def test_poisson_integral_large_mean(harness, a):
    """Large means, both sides of the library's switch to its asymptotic series at
    lambda = max(1e3, 1e2 (1 + a)), against 30-digit direct sums (a float64 direct
    sum loses about (1 + a) lambda log(lambda) 1e-16 in each log-pmf term here)."""
    switch = max(1e3, 1e2 * (1.0 + a))
    lam = np.array([0.9 * switch, 1.1 * switch, 3 * switch, 2e5, 1e6])
    ref = np.array([poisson_log_integral_mp(x, a) for x in lam])
    check_integrals(harness, "poisson_log", a, {"eta": np.log(lam)}, [], reference=ref)


@pytest.mark.stan
def test_poisson_integral_huge_mean_is_finite_and_gaussian(harness):
    """exp(eta) beyond the int range must neither hang nor overflow (the summation
    index is an int); the Gaussian limit (2 pi lambda)^(-a/2) (1+a)^(-1/2) holds
    there to O(1/lambda)."""
    a = 0.5
    eta = np.array([20.0, 25.0, 40.0, 200.0])
    gaussian = -0.5 * a * (np.log(2 * np.pi) + eta) - 0.5 * np.log1p(a)
    out = check_integrals(harness, "poisson_log", a, {"eta": eta}, [], reference=gaussian)
    assert np.all(np.isfinite(out["log_integral"]))


def _poisson_table_step(a: float) -> float:
    """The library's grid step for log I_a (its comment derives it from the error bound)."""
    return (3.84e-9 / (0.15 * (1 + a) ** 4)) ** 0.25


@pytest.mark.stan
@pytest.mark.parametrize("a", (1e-6, 0.05, 0.3, 1.0, 2.0, 4.0, 6.0))
def test_poisson_tabled_integral_matches_direct_sums(harness, a):
    """The fast path's table (cubic pieces through exact values and slopes) against 30-digit
    direct sums: at pieces' midpoints (where the interpolation error peaks), at random eta,
    at the grid's ends and outside it (there the sum runs). The library bounds the error of a
    piece by 1e-11; the float64 sums at the nodes add up to (1 + a) lambda log(lambda) 1e-16,
    at most 3.5e-12 at lambda = 1000, so 2e-11 (the table's own midpoint check) is the bound.
    At a = 6 the table is its header alone and every row takes the sum."""
    rng = np.random.default_rng(int(a * 1000) + 7)
    lo, hi = -10.0, math.log(1e3)
    h = _poisson_table_step(a)
    pieces = rng.integers(0, int((hi - lo) / h), 40)
    eta = np.concatenate([lo + (pieces + 0.5) * h, rng.uniform(lo, hi, 40),
                          [lo, lo + 1e-9, hi - 1e-9, hi + 0.05, lo - 0.5, -12.0, 7.5]])
    reference = np.array([poisson_log_integral_mp(math.exp(e), a) for e in eta])
    out = run(harness, base_data(len(eta), a, family=FAMILY_TABLE["poisson_log"].code, eta=eta))
    err = np.abs(out["log_integral_tabled"] - reference)
    record("tabled integral", "poisson_log", err / np.maximum(1.0, np.abs(reference)))
    assert err.max() < 2e-11, (a, eta[np.argmax(err)], err.max())
    # and the series the table replaces agrees with the same sums (its own 1e-12 relative bound)
    assert log_rel_err(out["log_integral"], reference).max() < INTEGRAL_RTOL


@pytest.mark.stan
def test_poisson_table_built_for_another_a_is_refused(harness):
    data = base_data(3, 0.3, family=FAMILY_TABLE["poisson_log"].code, variant=9, eta=np.zeros(3))
    with pytest.raises(Exception, match=r"integral_table was built for a = 0.3, not for the divergence parameter 0.6"):
        run(harness, data)


def _in_a_forked_child(function, *args, timeout=120):
    """``function(*args)`` in a forked process (it inherits the compiled harness; nothing is
    pickled but the result), so that a loop that never ends fails the test after
    ``timeout`` s instead of hanging the suite."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def child():
        try:
            send.send(("ok", function(*args)))
        except Exception as exc:  # handed to the parent as text
            send.send(("error", repr(exc)))

    process = context.Process(target=child)
    process.start()
    try:
        if not receive.poll(timeout):
            raise AssertionError(f"no answer within {timeout} s: the call did not end")
        status, value = receive.recv()
    finally:
        process.kill()
        process.join()
    assert status == "ok", value
    return value


def _poisson_integrals_at(harness, a, lam):
    return run(harness, base_data(len(lam), a, family=FAMILY_TABLE["poisson_log"].code,
                                  eta=np.log(lam)))["log_integral"]


@pytest.mark.stan
@pytest.mark.parametrize("a", [1e6, 1e308])
def test_poisson_integral_with_a_huge_divergence_parameter_ends(harness, a):
    """(1 + a) times a log-pmf overflows to -inf away from the mode; the series loops end
    anyway (they used to spin forever at a = 1e308) and give the direct sum of the
    float64 terms, which at such a is the mode's term alone or its nearest neighbours."""
    lam = np.array([0.5, 3.7, 50.0, 2e4])
    out = _in_a_forked_child(_poisson_integrals_at, harness, a, lam)
    for value, rate in zip(out, lam):
        k = np.arange(0, int(rate + 60 * np.sqrt(rate) + 100))
        with np.errstate(over="ignore"):
            terms = (1 + a) * stats.poisson.logpmf(k, rate)
        reference = special.logsumexp(terms)
        # at a = 1e308 every term past |log-pmf| > 1.8 is -inf in float64, so -inf can be the exact answer
        assert value == reference or value == pytest.approx(reference, rel=1e-9), (a, rate, value, reference)


@pytest.mark.stan
def test_normal_shared_sigma_loss_takes_the_limit_where_a_row_underflows(harness):
    """With a tiny shared sigma, a * (y - mu)^2 / sigma^2 overflows for every row but one:
    those rows' p^a is 0, not an error (log_mix used to throw "lambda[2] is -inf")."""
    a, sigma = 0.5, 1e-150
    case = random_case("normal", a, seed=3)
    n = case.data["N"]
    loc = case.data["loc"]
    y = loc + 1e5
    y[0] = loc[0]  # the one row at the mean: p^a = (2 pi sigma^2)^(-a/2), finite
    w = np.linspace(0.5, 1.5, n)
    out = run(harness, dict(case.data, variant=3, y_real=y, scale_s=sigma, w=w))
    with np.errstate(over="ignore"):
        log_p = stats.norm.logpdf(y, loc, sigma)
    log_i = np.full(n, a * (-np.log(sigma) - 0.5 * np.log(2 * np.pi)) - 0.5 * np.log1p(a))
    ref = reference_losses(log_p, log_i, a, w)
    for row, name in enumerate(("betad", "gammad", "gammaorig")):
        expected = ref[name][1]
        assert np.isfinite(out["weighted"][row]), (name, out["weighted"][row])
        assert -out["weighted"][row] == pytest.approx(expected, rel=1e-10), (name, out["weighted"][row], expected)


@pytest.mark.stan
@pytest.mark.parametrize("K", [2, 5])
@pytest.mark.parametrize("a", A_GRID)
def test_categorical_integral(harness, a, K):
    rng = np.random.default_rng(K)
    eta = rng.normal(0, 3, (6, K))
    eta[0] = 0.0
    eta[1, 0] = 40.0
    check_integrals(harness, "categorical_logit", a, {"K": K, "eta_mat": eta, "eta_row": np.zeros(K), "y_int": np.ones(6)},
                    [tuple(row) for row in eta])


@pytest.mark.stan
@pytest.mark.parametrize("a", A_GRID)
def test_multi_normal_integral_d1(harness, a):
    for sd in (0.2, 1.0, 3.0):
        check_integrals(harness, "multi_normal_cholesky", a,
                        {"D": 1, "y_mv": np.zeros((3, 1)), "mu_mv": np.array([[0.0], [-2.0], [5.0]]),
                         "mu_mv_s": np.zeros(1), "L": np.array([[sd]])},
                        [(sd * sd,)] * 3)


@pytest.mark.stan
@pytest.mark.parametrize("a", A_GRID)
def test_multi_normal_integral_d2(harness, a):
    """d = 2 by scipy's dblquad of the bivariate density (see ref_log_integral)."""
    for cov in (np.eye(2), np.array([[2.0, 1.2], [1.2, 1.0]]), np.array([[0.3, -0.25], [-0.25, 4.0]])):
        L = np.linalg.cholesky(cov)
        check_integrals(harness, "multi_normal_cholesky", a,
                        {"D": 2, "y_mv": np.zeros((2, 2)), "mu_mv": np.array([[0.5, -1.0], [3.0, 0.0]]),
                         "mu_mv_s": np.zeros(2), "L": L},
                        [tuple(cov.ravel())] * 2)


# The new families' grids: every a from 1e-4 to 4, parameters out to the edges (tiny and huge locations,
# scales and shapes; shapes just above the finiteness bound a / (1 + a) and both sides of the library's
# switch to Stirling's form at 100). References: 25-digit quadrature (mp_log_integral), direct sums, and for
# beta the closed form in 40 digits (beta_log_integral_mp; see the module's docstring).
EDGE_A = (1e-4, 0.05, 0.3, 1.0, 2.0, 4.0)


def _shapes_near_the_bound(a):
    bound = a / (1 + a)
    return [bound + 1e-3, bound + 0.05]


def _new_family_grid(family: str, a: float) -> list[tuple[float, float]]:
    if family == "lognormal":
        return [(m, sd) for m in (-30.0, -2.0, 0.0, 3.0, 30.0) for sd in (1e-3, 0.1, 1.0, 4.0)]
    shapes = _shapes_near_the_bound(a) + [0.9, 1.0, 3.0, 99.9, 100.0, 150.0, 1e4, 1e6]
    if family == "gamma":
        return [(k, r) for k in (*shapes, 1e8) for r in (1e-6, 1.0, 1e6)]
    if family == "weibull":
        # (the weibull formula has no cancellation at any shape; beyond 1e6 the density's width in log y,
        # 1 / shape, is too narrow for the float64 peak search of the quadrature reference)
        return [(k, sc) for k in shapes for sc in (1e-6, 1.0, 1e6)]
    if family == "beta":
        small = _shapes_near_the_bound(a) + [0.9, 1.0, 3.0, 99.9]
        return ([(u, v) for u in small for v in small]
                + [(u, v) for u in (100.0, 150.0, 1e4, 1e6, 1e8) for v in (*small, 100.0, 1e4, 1e8)])
    # neg_binomial_2_log: (mu, phi); the sum runs about 30 mu / ((1 + a) phi) terms where mu >> phi,
    # and the library caps it at 10^5, so mu / phi stays within 3e3 here (the cap is checked below)
    return [(m, f) for m in (1e-6, 0.1, 3.0, 50.0, 300.0, 1e3, 1e5) for f in (0.1, 1.0, 30.0, 1e6) if m / f <= 3e3]


@pytest.mark.stan
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference's peak search meets exp overflow (-inf)
@pytest.mark.parametrize("a", EDGE_A)
@pytest.mark.parametrize("family", ["lognormal", "gamma", "weibull", "beta", "neg_binomial_2_log"])
def test_new_family_integrals_over_a_grid_with_edges(harness, family, a):
    grid = _new_family_grid(family, a)
    first, second = (np.array(column) for column in zip(*grid))
    n = len(grid)
    if family == "neg_binomial_2_log":
        inputs = {"eta": np.log(first), "scale": second, "y_int": np.zeros(n)}
    else:
        inputs = {"loc": first, "scale": second, "y_real": np.full(n, 0.5)}
    reference = np.array([beta_log_integral_mp(a, *shapes) for shapes in grid]) if family == "beta" else None
    check_integrals(harness, family, a, inputs, grid, reference=reference)


def test_beta_closed_form_reference_is_the_quadrature_of_the_density():
    """The beta edge grid's reference (beta_log_integral_mp, the closed form in 40 digits) against 25-digit
    quadrature of the density (mp_log_integral) at three shape pairs per a of that grid: near the finiteness
    bound, both shapes below the library's switch to Stirling's form at 100, and both above it. Both are
    exact to far below the 1e-12 asked here (the library is held to 1e-8)."""
    for a in EDGE_A:
        for shapes in ((_shapes_near_the_bound(a)[1], 3.0), (0.9, 99.9), (150.0, 1e4)):
            closed_form = beta_log_integral_mp(a, *shapes)
            quadrature = mp_log_integral(*_beta_integrand(a, *shapes))
            assert log_rel_err(closed_form, quadrature) < 1e-12, (a, shapes, closed_form, quadrature)


# Finite sums: trials from 0 to 150 with shapes from 1e-3 to 1e8 (beta_binomial: where lbeta differences
# would cancel, the library's rising factorials do not); linear predictors to +-40 and cut points from
# 2e-6 apart to 40 apart (ordinal families)
BETA_BINOMIAL_GRID = [(t, u, v) for t in (0, 1, 7, 150) for u in (1e-3, 0.5, 3.0, 1e4, 1e8)
                      for v in (1e-3, 0.5, 3.0, 1e4, 1e8)]
ORDINAL_CUTS = (np.array([-1e-6, 0.0, 1e-6]), np.array([-20.0, 0.0, 20.0]), np.array([-1.0, 0.5, 2.0]))
ORDINAL_GRID = [(eta, cuts) for eta in (-40.0, -3.0, 0.0, 2.5, 40.0) for cuts in ORDINAL_CUTS]


@pytest.mark.stan
@pytest.mark.parametrize("a", EDGE_A)
@pytest.mark.parametrize("family", ["beta_binomial", "ordered_logistic", "ordered_probit"])
def test_finite_sum_integrals_over_a_grid_with_edges(harness, family, a):
    if family == "beta_binomial":
        trials, shape1, shape2 = (np.array(column) for column in zip(*BETA_BINOMIAL_GRID))
        n = len(BETA_BINOMIAL_GRID)
        check_integrals(harness, family, a, {"trials": trials, "loc": shape1, "scale": shape2, "y_int": np.zeros(n)},
                        BETA_BINOMIAL_GRID)
        return
    eta = np.array([e for e, _ in ORDINAL_GRID])
    cuts = np.array([c for _, c in ORDINAL_GRID])
    check_integrals(harness, family, a, {"K": 4, "eta": eta, "cuts_arr": cuts, "cuts": cuts[0],
                                          "y_int": np.ones(eta.size)},
                    [(e, *c) for e, c in ORDINAL_GRID])


@pytest.mark.stan
@pytest.mark.parametrize("family", ["gamma", "weibull", "beta"])
def test_an_infinite_integral_makes_every_robust_loss_infinite(harness, family):
    """I_a = +inf where a shape is at or below a / (1 + a) (here a = 1: shape 0.5 on the bound, 0.3 below):
    log I_a is +inf, that row's beta, gamma and original-gamma losses are +inf, so the target is -inf (the
    point is rejected as one of zero density); KL is untouched, the other rows keep finite losses (gamma
    original: its integral term is 0 there, I_i / sum_j I_j), and a row of weight 0 does not count."""
    a = 1.0
    shape = np.array([0.5, 0.3, 2.0, 3.0])
    other = np.array([2.0, 1.5, 1.0, 4.0])
    if family == "beta":
        inputs = {"loc": other, "scale": shape, "y_real": np.array([0.3, 0.6, 0.5, 0.2])}
    else:
        inputs = {"loc": shape, "scale": other, "y_real": np.array([0.3, 1.6, 0.5, 2.0])}
    data = base_data(4, a, family=FAMILY_TABLE[family].code, w=np.ones(4), **inputs)
    out = run(harness, data)
    assert np.all(out["log_integral"][:2] == np.inf) and np.all(np.isfinite(out["log_integral"][2:]))
    assert np.all(out["pointwise"][:, :2] == np.inf), out["pointwise"]
    assert np.all(np.isfinite(out["pointwise"][:, 2:])), out["pointwise"]
    assert np.all(out["total"] == -np.inf) and np.all(out["weighted"] == -np.inf)
    assert np.all(out["dispatch_pointwise"][1:, :2] == np.inf) and np.isfinite(out["dispatch_weighted"][0])
    assert np.all(np.isfinite(out["dispatch_pointwise"][0]))
    # weights 0 on the two rows with I_a = +inf: the weighted losses are those of the other rows alone
    w = np.array([0.0, 0.0, 1.0, 1.0])
    dropped = run(harness, dict(data, w=w))
    kept = run(harness, base_data(2, a, family=FAMILY_TABLE[family].code, **{k: v[2:] for k, v in inputs.items()}))
    np.testing.assert_allclose(dropped["weighted"], kept["weighted"], rtol=1e-14)


@pytest.mark.stan
def test_neg_binomial_sum_that_would_run_away_is_rejected(harness):
    """mu / phi = 1e8: the geometric tail bound would need far more than the cap of 10^5 terms, and the
    row is rejected naming mu and phi instead of summing forever or returning a truncated sum."""
    data = base_data(1, 0.5, family=FAMILY_TABLE["neg_binomial_2_log"].code, eta=np.array([math.log(1e6)]),
                     scale=np.array([0.01]))
    with pytest.raises(Exception, match=r"neg_binomial_2 integral I_a needs more than 100000 terms at mu = 1e\+06"):
        _in_a_forked_child(run, harness, data)


@pytest.mark.stan
@pytest.mark.parametrize("family", ["poisson_log", "normal"])
@pytest.mark.parametrize("a", [0.0, -0.5, float("nan")])
def test_nonpositive_divergence_parameter_is_rejected(harness, family, a):
    """a <= 0 (or NaN) is a clear Stan error, never a hang (the Poisson series loops) or a NaN."""
    case = random_case(family, 0.5, seed=1)
    with pytest.raises(Exception, match="must be positive"):
        run(harness, dict(case.data, a=a))


BAD_OUTCOMES = {"bernoulli_logit": ("y_int", 2), "binomial_logit": ("y_int", 10**6), "poisson_log": ("y_int", -1),
                "categorical_logit": ("y_int", 0), "normal": ("y_real", float("inf")),
                "student_t": ("y_real", float("nan")), "exponential": ("y_real", -1.0),
                "lognormal": ("y_real", 0.0), "gamma": ("y_real", -1.0), "weibull": ("y_real", float("inf")),
                "beta": ("y_real", 1.0), "neg_binomial_2_log": ("y_int", -1), "beta_binomial": ("y_int", 10**6),
                "ordered_logistic": ("y_int", 0), "ordered_probit": ("y_int", 5)}


@pytest.mark.stan
@pytest.mark.parametrize("family", sorted(BAD_OUTCOMES))
def test_outcome_outside_the_support_is_rejected(harness, family):
    """An outcome outside the family's support is a Stan error naming the row, not a wrong loss (the
    binomial, categorical, neg_binomial_2_log, beta_binomial and ordinal harness rows meet Stan's own checks
    of the internal density first)."""
    case = random_case(family, 0.5, seed=1)
    key, value = BAD_OUTCOMES[family]
    y = np.array(case.data[key], dtype=float if key == "y_real" else np.int64)
    y[1] = value
    with pytest.raises(Exception, match=r"robust_stan: outcome 2|Successes variable is 1000000|index 0 out of range|"
                                        r"Failures variable is -1|Random variable is [05]"):
        run(harness, dict(case.data, **{key: y}))


def test_reference_page_is_current():
    """docs/stan-functions.md is what the library's doc comments generate, and covers every family."""
    from robust_stan.building.families import FAMILIES
    from tools.library_docs import library_reference

    page = (Path(__file__).resolve().parents[1] / "docs" / "stan-functions.md").read_text()
    assert page == library_reference(), "docs/stan-functions.md is stale: run " \
        "`python -m tools.library_docs --write`"
    for family in FAMILIES.values():
        assert f"## {family.stan_name}" in page
        for prefix in ("robust", "betad", "gammad", "gammaorig"):
            assert f"`{prefix}_{family.stan_name}_pointwise_loss`" in page
    # every public function the library defines, whatever it returns, has its row in a table
    library = render_library()
    public = set(re.findall(r"^\s*(?:int|real|vector|row_vector|matrix|void|array\[[, ]*\] \w+)\s+"
                            r"((?:robust|betad|gammad|gammaorig)_\w+)\(", library, re.MULTILINE))
    assert len(public) > 80
    unlisted = sorted(name for name in public if f"| `{name}` |" not in page)
    assert not unlisted, f"public library functions missing from docs/stan-functions.md: {unlisted}"


# ---------------------------------------------------------------------------
# 2. Every public loss function against DESIGN.md's formulas
# ---------------------------------------------------------------------------

LOSS_CASES = [(family, a, seed) for family in FAMILY_NAMES for a, seed in zip(A_GRID, (11, 12, 13, 14))]


@pytest.mark.stan
@pytest.mark.parametrize("family,a,seed", LOSS_CASES, ids=[f"{f}-a{a}" for f, a, _ in LOSS_CASES])
def test_public_losses_match_design_formulas(harness, family, a, seed):
    """betad_/gammad_/gammaorig_ F_lpdf, F_weighted_lpdf, F_pointwise_loss and the
    robust_F dispatch (codes 0-3), for every overload in the harness, against NumPy."""
    case = random_case(family, a, seed, D=1 + seed % 2)
    rng = np.random.default_rng(seed + 100)
    n = case.data["N"]
    w = rng.uniform(0.0, 2.0, n)
    w[2] = 0.0  # a zero weight (coresets drop points this way)
    for variant in range(case.n_variants):
        data = dict(case.data, variant=variant, w=w)
        out = run(harness, data)
        log_p, log_i = case.log_p[variant], case.log_integral(variant)
        if family == "ordered_probit":
            log_p = stan_ordered_probit_log_p(harness, case, variant)
        ref = reference_losses(log_p, log_i, a, w)
        where = (family, a, variant)

        if variant == 0:  # the per-observation building blocks themselves
            err = record("log_density", family, rel_err(out["log_density"], log_p, 1.0))
            assert err < LOSS_RTOL, (where, out["log_density"], log_p)
            err = record("integral", family, log_rel_err(out["log_integral"], log_i))
            assert err < INTEGRAL_RTOL, where

        for row, name in enumerate(("betad", "gammad", "gammaorig")):
            pointwise, total_w, total_1, scale_pw, scale_w, scale_1 = ref[name]
            # F_lpdf and F_weighted_lpdf return MINUS the (weighted) total loss
            err = record(f"{name} total", family, rel_err(-out["total"][row], total_1, scale_1))
            assert err < LOSS_RTOL, (where, name, "total", out["total"][row], -total_1)
            err = record(f"{name} weighted", family, rel_err(-out["weighted"][row], total_w, scale_w))
            assert err < LOSS_RTOL, (where, name, "weighted", out["weighted"][row], -total_w)
            err = record(f"{name} pointwise", family, rel_err(out["pointwise"][row], pointwise, scale_pw))
            assert err < LOSS_RTOL, (where, name, "pointwise", out["pointwise"][row], pointwise)

        for code, name in DIVERGENCES.items():
            pointwise, total_w, _, scale_pw, scale_w, _ = ref[name]
            err = record(f"dispatch {name}", family, rel_err(-out["dispatch_weighted"][code], total_w, scale_w))
            assert err < LOSS_RTOL, (where, code, out["dispatch_weighted"][code], -total_w)
            err = record(f"dispatch {name}", family, rel_err(out["dispatch_pointwise"][code], pointwise, scale_pw))
            assert err < LOSS_RTOL, (where, code, out["dispatch_pointwise"][code], pointwise)

        # Unit weights: the weighted forms equal the plain ones.
        out_1 = run(harness, dict(data, w=np.ones(n)))
        np.testing.assert_allclose(out_1["weighted"], out_1["total"], rtol=1e-14, atol=0)
        # Every weight zero: no data, so every weighted total is exactly 0 (not NaN).
        out_0 = run(harness, dict(data, w=np.zeros(n)))
        assert np.all(out_0["weighted"] == 0) and np.all(out_0["dispatch_weighted"] == 0), (where, out_0)


def test_gamma_original_split_is_gradient_equivalent():
    """The gamma-original "pointwise" split used above (what the library documents) has
    the gradient of the total loss: d/dmu sum_i l_i(mu; S_p, S_I fixed) = dL/dmu, here by
    central differences for a normal location model with a heavy outlier."""
    rng = np.random.default_rng(0)
    y, sigma, a = rng.normal(size=12), 1.3, 0.4
    y[0] += 8
    n = len(y)

    def parts(mu):
        return stats.norm.logpdf(y, mu, sigma), np.full(n, ref_log_integral("normal", a, mu, sigma))

    def total(mu):
        return reference_losses(*parts(mu), a, np.ones(n))["gammaorig"][2]

    mu0, h = 0.3, 1e-5
    log_p0, log_i0 = parts(mu0)
    s_p, s_i = np.exp(a * log_p0).sum(), np.exp(log_i0).sum()

    def split_sum(mu):
        log_p, log_i = parts(mu)
        return (-(n / a) * np.exp(a * log_p) / s_p + (n / (1 + a)) * np.exp(log_i) / s_i).sum()

    d_total = (total(mu0 + h) - total(mu0 - h)) / (2 * h)
    d_split = (split_sum(mu0 + h) - split_sum(mu0 - h)) / (2 * h)
    assert d_split == pytest.approx(d_total, rel=1e-6)


# ---------------------------------------------------------------------------
# 2b. The model block: `~` statements, log density and gradient in theta
# ---------------------------------------------------------------------------


def _tilde_case(tilde: int):
    """(data, thetas, function theta -> reference total loss) for a model-block statement."""
    rng = np.random.default_rng(40 + tilde)
    n, a = 7, 0.35
    ones = np.ones(n)
    if tilde == 1:  # y ~ betad_normal(theta, scale_s, a)
        y = rng.normal(0, 1, n)
        y[0] = 9.0
        data = base_data(n, a, tilde=1, y_real=y, scale_s=1.4)

        def loss(theta):
            log_i = np.full(n, ref_log_integral("normal", a, theta, 1.4))
            return reference_losses(stats.norm.logpdf(y, theta, 1.4), log_i, a, ones)["betad"][2]
        return data, (-0.7, 0.2, 1.1), loss
    if tilde == 2:  # y ~ gammad_poisson_log(theta, a); exp(8) is on the asymptotic branch
        y = rng.poisson(30.0, n)
        y[0] = 400
        data = base_data(n, a, tilde=2, y_int=y)

        def loss(theta):
            lam = math.exp(theta)
            log_i = np.full(n, poisson_log_integral_mp(lam, a))
            return reference_losses(stats.poisson.logpmf(y, lam), log_i, a, ones)["gammad"][2]
        return data, (-1.0, 3.4, 8.0), loss
    if tilde == 3:  # y ~ gammaorig_student_t(nu, theta, scale, a)
        scale = rng.uniform(0.5, 2.0, n)
        y = rng.normal(0, 1, n)
        y[0] = 12.0
        data = base_data(n, a, tilde=3, y_real=y, scale=scale, nu=4.0)

        def loss(theta):
            log_i = np.array([ref_log_integral("student_t", a, 4.0, theta, s) for s in scale])
            return reference_losses(stats.t.logpdf(y, 4.0, theta, scale), log_i, a, ones)["gammaorig"][2]
        return data, (-0.7, 0.2, 1.1), loss
    if tilde == 4:  # y ~ robust_binomial_logit_weighted(trials, theta, divergence = 1, a, w)
        trials = rng.integers(1, 25, n)
        y = rng.binomial(trials, 0.4)
        y[0] = trials[0]
        w = rng.uniform(0.1, 2.0, n)
        data = base_data(n, a, tilde=4, divergence=1, y_int=y, trials=trials, w=w)

        def loss(theta):
            log_i = np.array([ref_log_integral("binomial_logit", a, int(t), theta) for t in trials])
            return reference_losses(stats.binom.logpmf(y, trials, special.expit(theta)), log_i, a, w)["betad"][1]
        return data, (-0.7, 0.2, 1.1), loss
    if tilde == 6:  # y ~ betad_poisson_log(eta + theta, a, integral_table): rows on and off the table
        eta = np.array([-11.0, -3.2, -0.4, 0.9, 2.3, 4.1, 6.95])
        y = rng.poisson(np.exp(eta))
        y[2] = 25
        data = base_data(n, a, tilde=6, family=FAMILY_TABLE["poisson_log"].code, y_int=y, eta=eta)

        def loss(theta):
            lam = np.exp(eta + theta)
            log_i = np.array([poisson_log_integral_mp(x, a) for x in lam])
            return reference_losses(stats.poisson.logpmf(y, lam), log_i, a, ones)["betad"][2]
        return data, (-0.3, 0.0, 0.2), loss
    # target += betad_categorical_logit_weighted_lpmf(y | eta_row + theta * e_1, a, w)
    K = 3
    eta_row = np.array([0.0, 1.0, -0.5])
    y = rng.integers(1, K + 1, n)
    w = rng.uniform(0.1, 2.0, n)
    data = base_data(n, a, tilde=5, K=K, y_int=y, eta_row=eta_row, w=w)

    def loss(theta):
        eta = eta_row + theta * np.eye(K)[0]
        probs = special.softmax(eta)
        log_p = np.array([stats.multinomial.logpmf(np.eye(K)[k - 1], 1, probs) for k in y])
        log_i = np.full(n, ref_log_integral("categorical_logit", a, *eta))
        return reference_losses(log_p, log_i, a, w)["betad"][1]
    return data, (-0.7, 0.2, 1.1), loss


@pytest.mark.stan
@pytest.mark.parametrize("tilde", sorted(TILDE))
def test_model_block_log_density_and_gradient(harness, tilde):
    """`~` / `target +=` with the library keep every constant (the losses are not
    additive in log p) and their autodiff gradients match the reference's slope."""
    data, thetas, loss = _tilde_case(tilde)
    label = TILDE[tilde].split("(")[0].split()[-1]
    for theta in thetas:
        lp, grad = harness.log_density_gradient(data, np.array([theta]), jacobian=False)
        ref = -loss(theta)
        err = record("model block", label, rel_err(lp, ref))
        assert err < LOSS_RTOL, (tilde, theta, lp, ref)
        h = 1e-5
        slope = -(loss(theta + h) - loss(theta - h)) / (2 * h)
        assert grad[0] == pytest.approx(slope, rel=1e-6, abs=1e-7 * (1 + abs(ref))), (tilde, theta, grad, slope)


# ---------------------------------------------------------------------------
# 3. The small-beta (and small-gamma) limit
# ---------------------------------------------------------------------------


def entropy(case: Case) -> np.ndarray:
    """scipy's entropy of p(. | theta_i), per observation (variant 0)."""
    d = case.data
    fam = case.family
    if fam == "normal":
        return stats.norm(d["loc"], d["scale"]).entropy()
    if fam == "student_t":
        return stats.t(d["nu"], d["loc"], d["scale"]).entropy()
    if fam == "exponential":
        return stats.expon(scale=1 / d["scale"]).entropy()
    if fam == "bernoulli_logit":
        return stats.bernoulli(special.expit(d["eta"])).entropy()
    if fam == "binomial_logit":
        return np.array([stats.binom(t, special.expit(e)).entropy() for t, e in zip(d["trials"], d["eta"])])
    if fam == "poisson_log":
        return np.array([stats.poisson(lam).entropy() for lam in np.exp(d["eta"])])
    if fam == "categorical_logit":
        return np.array([stats.entropy(special.softmax(row)) for row in d["eta_mat"]])
    if fam in TWO_ARGUMENT_CONTINUOUS:
        return np.array([TWO_ARGUMENT_CONTINUOUS[fam][4](u, v).entropy() for u, v in zip(d["loc"], d["scale"])])
    if fam == "neg_binomial_2_log":
        mu, phi = np.exp(d["eta"]), d["scale"]
        return np.array([-stats.nbinom(f, f / (m + f)).expect(lambda k, f=f, m=m: stats.nbinom.logpmf(k, f, f / (m + f)))
                         for m, f in zip(mu, phi)])
    if fam == "beta_binomial":
        return np.array([stats.betabinom(t, u, v).entropy() for t, u, v in zip(d["trials"], d["loc"], d["scale"])])
    if fam in ("ordered_logistic", "ordered_probit"):
        cdf = stats.logistic.cdf if fam == "ordered_logistic" else stats.norm.cdf
        edges = np.column_stack([np.full(d["N"], -np.inf), d["cuts_arr"], np.full(d["N"], np.inf)])
        p = np.diff(cdf(edges - d["eta"][:, None]), axis=1)
        return -np.sum(special.xlogy(p, p), axis=1)
    return np.full(d["N"], stats.multivariate_normal(np.zeros(d["D"]), d["L"] @ d["L"].T).entropy())


@pytest.mark.stan
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_small_beta_and_gamma_limit(harness, family):
    """At beta = 1e-6, from the Stan beta loss with the constant and the integral removed,
        r_i = -(1+beta) l_i + I_beta - (1+beta)/beta = ((1+beta)/beta) expm1(beta log p_i)
            = log p_i + beta (log p_i + log p_i^2 / 2) + O(beta^2),
    so r_i matches minus the KL loss (Stan's code 0, and SciPy's log p) to ~1e-5 relative
    and its O(beta) gap is the predicted one. Likewise for gamma,
        g_i = (-(gamma/(1+gamma)) l_i - 1) / gamma = log p_i + gamma (log p_i^2 / 2 + H_i) + O(gamma^2),
    with H_i the entropy of p(. | theta_i), since log I_gamma = -gamma H + O(gamma^2)."""
    small = 1e-6
    case = random_case(family, small, seed=7, D=2)
    out = run(harness, case.data)
    log_p = case.log_p[0] if family != "ordered_probit" else stan_ordered_probit_log_p(harness, case, 0)
    kl = out["dispatch_pointwise"][0]
    np.testing.assert_allclose(-kl, log_p, rtol=1e-12, atol=1e-12)
    # |r - log p| ~ beta |log p| (1 + |log p| / 2): below 1e-5 relative wherever |log p| <= 18;
    # the outlier rows (log p down to about -75) are held to the first-order bound.
    moderate = np.abs(log_p) <= 18
    assert moderate.sum() >= 5

    r = -(1 + small) * out["pointwise"][0] + np.exp(out["log_integral"]) - (1 + small) / small
    err = record("beta -> KL", family, rel_err(r, -kl, 1.0)[moderate])
    assert err < 1e-5, (r, -kl)
    assert np.all(np.abs(r + kl) <= 1.01 * small * (np.abs(kl) + kl**2 / 2) + 1e-9), (r, -kl)
    gap = (r - log_p) / small
    np.testing.assert_allclose(gap, log_p + log_p**2 / 2, rtol=1e-3, atol=1e-3 * (1 + np.abs(log_p).max()))

    g = (-(small / (1 + small)) * out["pointwise"][1] - 1) / small
    err = record("gamma -> KL", family, rel_err(g, -kl, 1.0)[moderate])
    assert err < 1e-5, (g, -kl)
    H = np.asarray(entropy(case), dtype=float)
    np.testing.assert_allclose(-out["log_integral"] / small, H, rtol=1e-4, atol=1e-5)
    gap = (g - log_p) / small
    np.testing.assert_allclose(gap, log_p**2 / 2 + H, rtol=1e-3, atol=1e-3 * (1 + np.abs(log_p).max()))
