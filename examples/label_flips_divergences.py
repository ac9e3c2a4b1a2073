"""Random label flips against every divergence robust-stan offers: does any minimum-divergence
estimate remove the flips' attenuation? (Issue 24's ``logistic_flips`` case.)

The case of ``examples/select_divergence.py``: y ~ Bernoulli(logit^-1(0.3 + X b)), X ~ N(0, I_2),
b = (1.5, -1), and the labels of a tenth of the rows, chosen at random, flipped. Four parts (``--parts``):

- ``population``: the minimiser of each divergence's expected loss (N -> infinity). The expectation
  over y is exact (P(y = 1 | x) = 0.1 + 0.8 logit^-1(eta), the share of flipped rows being fixed at a
  tenth); the one over x is a mean over ``--x-rows`` draws, done twice with independent draws so that
  the difference shows its Monte Carlo error. KL, beta, gamma (decomposable, Futami eq. 15) and gamma
  in Fujisawa and Eguchi's original form, written here in NumPy from DESIGN.md section 2 (an
  implementation independent of the library's Stan code).
- ``finite``: the minimum-loss estimate's coefficient error on ``--replicates`` data sets of N = 200
  and 2000 rows (the same NumPy losses, BFGS from the truth and from zero, the lower optimum kept).
- ``flip_model``: the candidate fix, a model of the flips rather than a divergence:
  P(y = 1 | x) = e + (1 - 2 e) logit^-1(alpha + x b), e ~ Uniform(0, 0.5), alpha, b ~ N(0, 2.5), by
  rs.custom with KL (ordinary Bayes), beside rs.glm("bernoulli") with KL, on ``--flip-datasets`` data
  sets of N = 200 (the example's size) and a tenth as many of N = 2000: the posterior mean's error,
  and the share of coefficients whose central 90% interval holds b.
- ``library``: robust-stan's own posterior (rs.glm("bernoulli"), NUTS 4 x (500 + 1000), w = 1) at KL,
  beta 0.5 and gamma 4 (original form) on the first ``--library-datasets`` data sets of 2000 rows:
  the posterior mean's error, its distance to the NumPy minimiser (the cross-check), and the share of
  coefficients whose central 90% interval holds b.

    python examples/label_flips_divergences.py [--x-rows 400000] [--replicates 200] [--library-datasets 10]
        [--flip-datasets 100]

Writes examples/results/select_divergence/label_flips_{population,finite,library,flip_model}.csv.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import minimize
from scipy.special import expit, log_expit
from scipy.stats import norm

import robust_stan as rs
from select_divergence import DISCRETE, LOGISTIC_INTERCEPT, discrete_data

OUT = Path(__file__).parent / "results" / "select_divergence"
_FAMILY, TRUE_B = DISCRETE["logistic_flips"]
FLIPPED = 0.1  # as simulate_discrete flips them: n // 10 labels

# (kind, value): beta beyond the selection's default grid (0.05-1) and decomposable gamma up to 100
POPULATION_GRID = ([("KL", 0.0)] + [("beta", v) for v in (0.1, 0.3, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)]
                   + [("gamma", v) for v in (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 100.0)]
                   + [("gamma original", v) for v in (0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)])
FINITE_GRID = [("KL", 0.0), ("beta", 0.5), ("beta", 1.0)] + [("gamma original", v) for v in (1.0, 2.0, 3.0, 4.0, 5.0)]
# (name, the library's divergence, the same as (kind, value) of expected_loss)
LIBRARY_GRID = [("KL", rs.KL(), "KL", 0.0), ("beta 0.5", rs.BetaD(0.5), "beta", 0.5),
                ("gamma 4 (original)", rs.GammaD(4.0, form="original"), "gamma original", 4.0)]
DENSITY_CHECKS = 5  # posterior draws at which the library's log density is compared with NumPy's


def expected_loss(theta: np.ndarray, X: np.ndarray, p_one: np.ndarray, kind: str, g: float) -> float:
    """The mean over rows of the loss's expectation over y ~ Bernoulli(p_one) (DESIGN.md section 2;
    for data, p_one is y itself), for the divergence ``kind`` with parameter ``g`` (beta or gamma).
    ``theta`` = (intercept, b)."""
    eta = theta[0] + X @ theta[1:]
    log_p1, log_p0 = log_expit(eta), log_expit(-eta)
    if kind == "KL":
        return float(-np.mean(p_one * log_p1 + (1 - p_one) * log_p0))
    p1, p0 = np.exp(log_p1), np.exp(log_p0)
    integral = p1 ** (1 + g) + p0 ** (1 + g)
    if kind == "beta":
        return float(np.mean(-(p_one * p1 ** g + (1 - p_one) * p0 ** g) / g + integral / (1 + g)))
    if kind == "gamma":
        return float(-(1 + g) / g * np.mean((p_one * p1 ** g + (1 - p_one) * p0 ** g) / integral ** (g / (1 + g))))
    # original form: -(1/g) log mean p^g + (1/(1+g)) log mean I (per row)
    return float(-np.log(np.mean(p_one * p1 ** g + (1 - p_one) * p0 ** g)) / g + np.log(np.mean(integral)) / (1 + g))


def minimiser(X: np.ndarray, p_one: np.ndarray, kind: str, value: float) -> np.ndarray:
    """The lower of two BFGS optima (from the truth and from zero). Where the loss decreases without
    bound (the original gamma form on some small data sets), this is wherever BFGS stopped."""
    starts = (np.array([LOGISTIC_INTERCEPT, *TRUE_B]), np.zeros(1 + TRUE_B.size))
    found = [minimize(expected_loss, s, args=(X, p_one, kind, value), method="BFGS", options={"gtol": 1e-9})
             for s in starts]
    return min(found, key=lambda r: r.fun).x


def population_sample(x_rows: int, draw: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """x-sample ``draw`` of the population part (``x_rows`` rows of X) and P(y = 1 | x) under the flips."""
    X = np.random.default_rng([draw, 77]).normal(size=(x_rows, TRUE_B.size))
    return X, FLIPPED + (1 - 2 * FLIPPED) * expit(LOGISTIC_INTERCEPT + X @ TRUE_B)


def population(x_rows: int) -> pd.DataFrame:
    samples = [population_sample(x_rows, draw) for draw in (0, 1)]  # independent, to show the Monte Carlo error
    rows = []
    for kind, value in POPULATION_GRID:
        estimates = [minimiser(X, p_one, kind, value) for X, p_one in samples]
        b_hat = estimates[0][1:]
        rows.append({"divergence": kind, "value": value, "intercept": estimates[0][0], "b1": b_hat[0], "b2": b_hat[1],
                     "coefficient error": float(np.linalg.norm(b_hat - TRUE_B)),
                     "largest x-sample difference (intercept and b)": float(np.max(np.abs(estimates[0] - estimates[1])))})
        print(pd.Series(rows[-1]).to_string(), flush=True)
    return pd.DataFrame(rows)


def finite(replicates: int) -> pd.DataFrame:
    rows = []
    for n in (200, 2000):
        for seed in range(1, replicates + 1):
            data = discrete_data("logistic_flips", n, seed)
            for kind, value in FINITE_GRID:
                b_hat = minimiser(data["X"], data["y"].astype(float), kind, value)[1:]
                rows.append({"rows": n, "seed": seed, "divergence": kind, "value": value,
                             "coefficient error": float(np.linalg.norm(b_hat - TRUE_B))})
        table = pd.DataFrame(rows)
        print(summarise_finite(table[table["rows"] == n]).to_string(), flush=True)
    return pd.DataFrame(rows)


def summarise_finite(table: pd.DataFrame) -> pd.DataFrame:
    """Median error and the shares above 2 and 100 (a mean would depend on where BFGS stopped on the
    data sets whose loss decreases without bound)."""
    grouped = table.groupby(["rows", "divergence", "value"])["coefficient error"]
    return pd.DataFrame({"median": grouped.median(), "share above 2": grouped.apply(lambda e: float(np.mean(e > 2))),
                         "share above 100": grouped.apply(lambda e: float(np.mean(e > 100)))}).round(3)


def scores(b: np.ndarray) -> dict:
    """The posterior draws of b (draws x coefficients) against the truth: the posterior mean's error,
    the mean posterior sd, and the share of coefficients whose central 90% interval holds b."""
    low, high = np.quantile(b, [0.05, 0.95], axis=0)
    return {"coefficient error": float(np.linalg.norm(b.mean(axis=0) - TRUE_B)),
            "posterior sd (mean over b)": float(b.std(axis=0).mean()),
            "90% intervals holding b": float(np.mean((low <= TRUE_B) & (TRUE_B <= high)))}


def log_density_gap(model, data: dict, divergence, kind: str, value: float, fit) -> float:
    """The largest difference, over DENSITY_CHECKS posterior draws spread over the fit, between the
    library's log density and the NumPy one (the glm's normal priors minus N times the loss), both
    taken relative to the first of them (the library's may carry a constant)."""
    stan_data = model.stan_data(data, divergence=divergence)
    every = np.column_stack([np.asarray(fit.posterior["alpha"]).reshape(-1),
                             np.asarray(fit.posterior["b"]).reshape(-1, TRUE_B.size)])
    draws = every[np.linspace(0, len(every) - 1, DENSITY_CHECKS).astype(int)]
    library_values = np.array([model.log_density(data, theta, divergence=divergence) for theta in draws])
    numpy_values = np.array([norm.logpdf(theta[0], 0, 2.5) + norm.logpdf(theta[1:], 0, stan_data["prior_scale_b"]).sum()
                             - len(data["y"]) * expected_loss(theta, data["X"], data["y"].astype(float), kind, value)
                             for theta in draws])
    return float(np.max(np.abs((library_values - library_values[0]) - (numpy_values - numpy_values[0]))))


def library(datasets: int) -> pd.DataFrame:
    model = rs.glm("bernoulli")
    rows = []
    for seed in range(1, datasets + 1):
        data = discrete_data("logistic_flips", 2000, seed)
        for name, divergence, kind, value in LIBRARY_GRID:
            start = time.perf_counter()
            fit = model.sample(data, divergence=divergence, seed=seed, chains=4, iter_warmup=500,
                               iter_sampling=1000, show_progress=False)
            seconds = time.perf_counter() - start
            b = np.asarray(fit.posterior["b"]).reshape(-1, TRUE_B.size)
            b_numpy = minimiser(data["X"], data["y"].astype(float), kind, value)[1:]
            rows.append({"seed": seed, "divergence": name, "sampling seconds": seconds, **scores(b),
                         "largest |posterior mean - NumPy minimiser|": float(np.max(np.abs(b.mean(axis=0) - b_numpy))),
                         "|posterior mean| - |NumPy minimiser| (norms of b)":
                             float(np.linalg.norm(b.mean(axis=0)) - np.linalg.norm(b_numpy)),
                         "posterior mean - median (mean over b)": float(np.mean(b.mean(axis=0) - np.median(b, axis=0))),
                         "log density vs NumPy": log_density_gap(model, data, divergence, kind, value, fit)})
            print(pd.Series(rows[-1]).to_string(), flush=True)
    return pd.DataFrame(rows)


def flip_model() -> rs.Model:
    """The flips as part of the model: logit P(y = 1) = logit(e + (1 - 2 e) logit^-1(alpha + X b))."""
    return rs.custom("bernoulli", data="int<lower=1> P; matrix[N, P] X;",
                     parameters="real alpha; vector[P] b; real<lower=0, upper=0.5> e;",
                     priors="alpha ~ normal(0, 2.5); b ~ normal(0, 2.5);",
                     eta="logit(e + (1 - 2 * e) * inv_logit(alpha + X[n] * b))",
                     title="logistic regression with randomly flipped labels")


def flip_model_coverage(datasets: int) -> pd.DataFrame:
    # name: (model, data it needs beyond X and y)
    models = {"flip model (KL)": (flip_model(), {"P": TRUE_B.size}), "glm (KL)": (rs.glm("bernoulli"), {})}
    rows = []
    for n, seed in [(200, s) for s in range(1, datasets + 1)] + [(2000, s) for s in range(1, datasets // 10 + 1)]:
        data = discrete_data("logistic_flips", n, seed)
        for name, (model, extra) in models.items():
            fit = model.sample({**data, **extra}, seed=seed, chains=4, iter_warmup=500, iter_sampling=1000,
                               show_progress=False)
            rows.append({"rows": n, "seed": seed, "model": name,
                         **scores(np.asarray(fit.posterior["b"]).reshape(-1, TRUE_B.size)),
                         "e (posterior mean)": float(np.mean(fit.posterior["e"])) if "e" in fit.posterior else np.nan,
                         "largest R-hat": float(fit.summary()["r_hat"].max())})
        print(pd.Series(rows[-2]).to_string(), flush=True)
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", nargs="+", choices=["population", "finite", "library", "flip_model"],
                        default=["population", "finite", "library", "flip_model"])
    parser.add_argument("--x-rows", type=int, default=400_000)
    parser.add_argument("--replicates", type=int, default=200)
    parser.add_argument("--library-datasets", type=int, default=10)
    parser.add_argument("--flip-datasets", type=int, default=100)
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    if "population" in args.parts:
        population(args.x_rows).to_csv(OUT / "label_flips_population.csv", index=False)
    if "finite" in args.parts:
        finite(args.replicates).to_csv(OUT / "label_flips_finite.csv", index=False)
    if "library" in args.parts:
        table = library(args.library_datasets)
        table.to_csv(OUT / "label_flips_library.csv", index=False)
        print(table.groupby("divergence").mean(numeric_only=True).round(3).to_string())
    if "flip_model" in args.parts:
        table = flip_model_coverage(args.flip_datasets)
        table.to_csv(OUT / "label_flips_flip_model.csv", index=False)
        print(table.groupby(["rows", "model"]).mean(numeric_only=True).round(3).to_string())


if __name__ == "__main__":
    main()
