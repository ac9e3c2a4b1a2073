"""Robust Bayesian mean estimation (Bhatia et al. 2019, section 6): Rob-ULA against ULA.

theta ~ U[0, 1]^d; n_c clean points z ~ N(theta, I) and n_c eps / (1 - eps) corrupted
points z ~ N(theta + t, I), t ~ U[0, 10]^d drawn per point. Both samplers run on the
same generated program (a custom multi_normal location with known identity
covariance); the metric is
||mean of the samples - theta||_2, averaged over runs, and the held-out average
log-likelihood of fresh clean points at the posterior mean.

The prior is flat by default: the paper's update runs in R^d with the likelihood's
gradient alone (U[0, 1]^d is how theta is drawn). ``--prior box`` uses U[0, 1]^d as
the prior instead (theta's bounds), which caps how far ULA can be pulled.

``--nuts-beta B --prior box`` adds the beta posterior sampled by NUTS. The beta loss
weights a row by p(z | theta)^B, and a d-dimensional N(theta, I) density is of order
exp(-d / 2) at a typical clean point: B must shrink like 1/d or every row's weight
vanishes and the posterior is as wide as the prior. B = 0.5 / d keeps the clean rows'
weights within a factor of about e of each other while the corrupted rows (squared
distance about 34 d) get weights below exp(-8).

Writes a table (CSV) and a figure (PNG) into --out. The paper's defaults are
d = 200, n_c = 1000, eps = 0.2, 300 burn-in and 1000 kept iterations, 10 runs
(about 45 minutes on two cores); ``--sweep d|n|eps`` varies one setting around them.

    python examples/rob_ula_mean_estimation.py [--d 200] [--n-clean 1000] [--eps 0.2] [--runs 10]
        [--sweep d|n|eps] [--prior flat|box] [--nuts-beta 0.02 --prior box] [--jobs 2]
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
    """theta's prior: "flat" (the paper's update runs in R^d with the likelihood's gradient
    alone) or "box" (U[0, 1]^d, the law theta is drawn from, as the parameter's bounds)."""
    return rs.custom(
        "multi_normal",
        data="cov_matrix[D] Sigma;",
        transformed_data="matrix[D, D] L_Sigma = cholesky_decompose(Sigma);",
        parameters="vector<lower=0, upper=1>[D] theta;" if prior == "box" else "vector[D] theta;",
        priors="",  # flat, or uniform on the box: the bounds say it
        mu="theta",
        L="L_Sigma",
        title="robust mean estimation (Bhatia et al. 2019)",
    )


def simulate(d: int, n_clean: int, eps: float, rng: np.random.Generator):
    """theta, the data (n_clean clean rows, then the corrupted ones) and 1000 held-out clean rows."""
    theta = rng.uniform(0, 1, d)
    n_bad = int(round(eps * n_clean / (1 - eps)))
    clean = rng.normal(theta, 1.0, (n_clean, d))
    bad = rng.normal(theta + rng.uniform(0, 10, (n_bad, d)), 1.0)
    held_out = rng.normal(theta, 1.0, (1000, d))
    return theta, {"y": np.vstack([clean, bad]), "Sigma": np.eye(d)}, held_out


def clean_posterior_mean(data: dict, n_clean: int) -> np.ndarray:
    """The exact posterior mean under the flat prior given the clean rows only: their mean."""
    return data["y"][:n_clean].mean(axis=0)


def held_out_loglik(held_out: np.ndarray, theta_hat: np.ndarray) -> float:
    """Average log N(z | theta_hat, I) over the held-out rows."""
    return float(stats.norm.logpdf(held_out, theta_hat, 1.0).sum(axis=1).mean())


if __name__ == "__main__":
    _synthetic_experiment.main(Path(__file__).stem, __doc__, warmup=300, iters=1000)


