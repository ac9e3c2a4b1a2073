"""Robust Bayesian linear regression (Bhatia et al. 2019, section 6): Rob-ULA against ULA.

theta ~ U[0, 1]^d. Clean rows: x ~ N(0, I_d), y = x' theta + N(0, 1). Corrupted rows
(n_c eps / (1 - eps) of them): every coordinate of x ~ chi-square(1), and
y = x' theta + U[0, 10]. The model is y ~ N(x' theta, 1) with a flat prior on theta
(the paper's update runs in R^d; ``--prior box`` uses U[0, 1]^d instead). The metric is
||mean of the samples - theta||_2 and the held-out average log-likelihood of fresh
clean rows at the posterior mean.

Writes a table (CSV) and a figure (PNG) into --out. The paper's defaults: d = 200,
n_c = 1000, eps = 0.2, 100 burn-in and 300 kept iterations, 10 runs;
``--sweep d|n|eps`` varies one setting around them, ``--nuts-beta B --prior box`` adds
the beta posterior sampled by NUTS (under the flat prior it is improper: the loss is bounded).

    python examples/rob_ula_linear_regression.py [--d 200] [--n-clean 1000] [--eps 0.2] [--runs 10]
        [--sweep d|n|eps] [--prior flat|box] [--nuts-beta 0.2 --prior box] [--jobs 2]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from scipy import stats

import robust_stan as rs

sys.path.insert(0, str(Path(__file__).parent))
import _synthetic_experiment


def model(prior: str = "flat"):
    """y ~ N(X theta, 1); theta flat or, with prior="box", uniform on [0, 1]^d."""
    return rs.custom(
        "normal",
        data="int<lower=1> P; matrix[N, P] X;",
        parameters="vector<lower=0, upper=1>[P] theta;" if prior == "box" else "vector[P] theta;",
        priors="",
        mu="X[n] * theta",
        sigma="1",
        title="robust linear regression (Bhatia et al. 2019)",
    )


def simulate(d: int, n_clean: int, eps: float, rng: np.random.Generator):
    """theta, the data (clean rows, then corrupted ones) and 1000 held-out clean rows."""
    theta = rng.uniform(0, 1, d)
    n_bad = int(round(eps * n_clean / (1 - eps)))
    X_clean = rng.normal(size=(n_clean, d))
    y_clean = X_clean @ theta + rng.normal(size=n_clean)
    X_bad = rng.chisquare(1, size=(n_bad, d))
    y_bad = X_bad @ theta + rng.uniform(0, 10, n_bad)
    X_held = rng.normal(size=(1000, d))
    held_out = (X_held, X_held @ theta + rng.normal(size=1000))
    data = {"P": d, "X": np.vstack([X_clean, X_bad]), "y": np.concatenate([y_clean, y_bad])}
    return theta, data, held_out


def clean_posterior_mean(data: dict, n_clean: int) -> np.ndarray:
    """The exact posterior mean under the flat prior given the clean rows only: least squares."""
    X, y = data["X"][:n_clean], data["y"][:n_clean]
    return np.linalg.solve(X.T @ X, X.T @ y)


def held_out_loglik(held_out, theta_hat: np.ndarray) -> float:
    """Average log N(y | x' theta_hat, 1) over the held-out rows."""
    X, y = held_out
    return float(stats.norm.logpdf(y, X @ theta_hat, 1.0).mean())


if __name__ == "__main__":
    _synthetic_experiment.main(Path(__file__).stem, __doc__, warmup=100, iters=300)
