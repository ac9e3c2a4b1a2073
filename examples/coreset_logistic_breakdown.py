"""Why beta-Cores cannot keep its accuracy at F = 30% on Adult: its target has already broken down.

beta-Cores approximates the full-data beta posterior (the paper's eq. 9). This
script checks that target directly, with NumPy only (the paper's eq. 24-25 for the
gains, SciPy's L-BFGS for the posterior mode, same priors as the examples):

1. robust-stan's gains (one generated-quantities call) against the NumPy gains at
   the same 100 prior draws and 1000 rows (centred, as the algorithm uses them);
2. the balanced test accuracy of the all-rows posterior mode (KL, beta 0.5, beta 1)
   for each fraction F, noise sd (the issue's 5, and sqrt(5) if the paper's
   "N(0, 5)" is a variance) and corruption kind (both, feature noise only, flipped
   labels only);
3. which rows the selection criterion (eq. 14) ranks first, at prior draws and at
   draws near the clean rows' beta mode.

Writes examples/results/coreset_logistic_breakdown/{accuracy_of_the_target.csv, checks.txt}.

    python examples/coreset_logistic_breakdown.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy import optimize

import robust_stan as rs
from _coreset_data import balanced, contaminate, load_adult
from robust_stan.methods.coresets.targets import CoresetTarget

OUT = Path(__file__).parent / "results" / "coreset_logistic_breakdown"


def log_p(Z, y, theta):
    """log p(1), log p(0) and log p(y) of every row (rows of theta: draws)."""
    eta = np.atleast_2d(theta) @ Z.T
    lp1, lp0 = -np.logaddexp(0, -eta), -np.logaddexp(0, eta)
    return lp1, lp0, np.where(y == 1, lp1, lp0)


def gains(Z, y, theta, beta):
    """The paper's eq. 24-25: (1/beta) p_y^beta - (p1^(1+beta) + p0^(1+beta)) / (1 + beta); log p_y if beta = 0."""
    lp1, lp0, lpy = log_p(Z, y, theta)
    if beta == 0:
        return lpy
    return np.exp(beta * lpy) / beta - (np.exp((1 + beta) * lp1) + np.exp((1 + beta) * lp0)) / (1 + beta)


def posterior_mode(Z, y, beta, weights=None):
    """Mode of prior * exp(sum w f): alpha ~ N(0, 2.5^2), b ~ N(0, 1) (the examples' priors)."""
    weights = np.ones(len(y)) if weights is None else weights

    def negative(t):
        return -(weights @ gains(Z, y, t, beta)[0]) + 0.5 * (t[0] ** 2 / 6.25 + t[1:] @ t[1:])

    return optimize.minimize(negative, np.zeros(Z.shape[1]), method="L-BFGS-B").x


def top_corrupted_share(Z, y, theta, batch, bad, beta, top=20):
    """Share of corrupted rows among the ``top`` of eq. 14's correlation on a batch, empty coreset."""
    g = gains(Z, y, theta, beta)[:, batch]
    g = g - g.mean(axis=0)
    residual = (len(y) / batch.size) * g.sum(axis=1)
    corr = (g * residual[:, None]).mean(axis=0) / np.sqrt((g**2).mean(axis=0))
    return float(bad[batch[np.argsort(-corr)[:top]]].mean())


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    X0, y0, X_test, y_test = load_adult()
    X_eval, y_eval = balanced(X_test, y_test, np.random.default_rng(0))
    Z_eval = np.column_stack([np.ones(len(y_eval)), X_eval])
    lines = []

    rng = np.random.default_rng(30)
    X, y, bad = contaminate(X0, y0, 0.3, rng)
    Z = np.column_stack([np.ones(len(y)), X])
    model = rs.glm("bernoulli", standardize=False)
    prepared = model.prepare({"X": X, "y": y, "prior_scale_b": np.ones(10)}, rs.BetaD(0.5))
    target = CoresetTarget(model, prepared.stan_data, rs.BetaD(0.5), "beta", "laplace")
    prior_draws = target.draw(np.zeros(0, dtype=int), np.zeros(0), 100, np.random.default_rng(1))
    batch = rng.choice(len(y), 1000, replace=False)
    ours = target.gains(batch, prior_draws)["beta"]
    theirs = gains(Z, y, prior_draws, 0.5)[:, batch]
    difference = np.abs((ours - ours.mean(0)) - (theirs - theirs.mean(0))).max()
    lines.append(f"F = 0.3: robust-stan's centred gains against NumPy's eq. 24-25, 100 prior draws x 1000 rows: "
                 f"largest difference {difference:.2e}")
    clean_mode = posterior_mode(Z, y, 0.5, (~bad).astype(float))
    near_clean = clean_mode + 0.05 * np.random.default_rng(2).standard_normal((100, Z.shape[1]))
    lines.append(f"F = 0.3: corrupted rows are {bad.mean():.1%} of the training rows; among the 20 best correlations "
                 f"(eq. 14) at prior draws {top_corrupted_share(Z, y, prior_draws, batch, bad, 0.5):.0%}, at draws "
                 f"near the clean rows' beta mode {top_corrupted_share(Z, y, near_clean, batch, bad, 0.5):.0%}")

    rows = []
    for fraction in (0.1, 0.2, 0.3):
        for sd in (5.0, float(np.sqrt(5))):
            for kind in ("both", "features only", "labels only"):
                rng = np.random.default_rng(30)
                X, y = X0.copy(), y0.copy()
                count = int(round(fraction * len(y)))
                columns = rng.choice(10, 5, replace=False)
                noisy, flipped = rng.choice(len(y), count, replace=False), rng.choice(len(y), count, replace=False)
                if kind != "labels only":
                    X[np.ix_(noisy, columns)] = rng.normal(0, sd, (count, columns.size))
                if kind != "features only":
                    y[flipped] = 1 - y[flipped]
                Z = np.column_stack([np.ones(len(y)), X])
                for beta in (0.0, 0.5, 1.0):
                    mode = posterior_mode(Z, y, beta)
                    accuracy = float(np.mean(((Z_eval @ mode) > 0) == y_eval))
                    rows.append({"F": fraction, "noise_sd": sd, "corruption": kind,
                                 "posterior": "KL" if beta == 0 else f"beta {beta}", "accuracy_of_mode": accuracy})
                print(rows[-3:], flush=True)
    table = pd.DataFrame(rows).pivot_table(index=["F", "noise_sd", "corruption"], columns="posterior",
                                           values="accuracy_of_mode")
    table.to_csv(OUT / "accuracy_of_the_target.csv")
    clean = posterior_mode(np.column_stack([np.ones(len(y0)), X0]), y0, 0.5)
    lines.append(f"uncorrupted data: beta 0.5 mode accuracy {np.mean(((Z_eval @ clean) > 0) == y_eval):.3f}")
    (OUT / "checks.txt").write_text("\n".join(lines) + "\n\n" + table.round(3).to_string() + "\n")
    print("\n".join(lines))
    print(table.round(3).to_string())


if __name__ == "__main__":
    main()
