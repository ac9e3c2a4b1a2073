"""Is the noise-aware post-processing model calibrated on a trace that follows it exactly?

A check of ``robust_stan.methods.noise_aware`` independent of DP-VI: traces simulated from
the paper's eq. 20 itself (linear gradients g~_{t+1} = kappa A (phi_t - phi*) + noise, noise
sd sigma C / beta, steps lambda_heur beta), with the constants of the Gamma-exponential
TARP at epsilon = 0.1 (N = 5000: a = (N, 1/2) for (mu, u), sigma = 310, C = 10,
beta = (1, 100), kappa = 0.1, T = 10^4, burn-in T / 2). phi* is drawn per replicate; the
z-scores (posterior mean - phi*) / posterior sd of phi* should have sd 1 and the central
90% intervals should cover 90%.

    python examples/dpvi_trace_model_check.py [--method nuts] [--replicates 60]

Writes examples/results/dpvi_exponential_families/trace_model_check_<method>.csv.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from robust_stan.methods.dpvi import DPVIRelease
from robust_stan.methods.noise_aware import sample_trace_model, trace_model_data
from robust_stan.methods.privacy_accounting import PrivacyAccounting

OUT = Path(__file__).parent / "results" / "dpvi_exponential_families"


def linear_trace(phi_star, a, beta, kappa, sigma_c, step, steps, rng):
    phi = np.array([0.0, -8.5])  # where the Gamma-exponential runs start: mu = 0, variance 1 / N
    iterates, gradients = [phi.copy()], []
    for _ in range(steps):
        g = (kappa * a * beta * (phi - phi_star) + sigma_c * rng.standard_normal(phi.size)) / beta
        gradients.append(g)
        phi = phi - step * beta * g
        iterates.append(phi.copy())
    return np.array(iterates), np.array(gradients)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--method", choices=["nuts", "laplace"], default="nuts")
    parser.add_argument("--replicates", type=int, default=60)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    steps, kappa, sigma, clip = 10_000, 0.1, 310.0, 10.0
    a, beta = np.array([5000.0, 0.5]), np.array([1.0, 100.0])
    step = np.sqrt(2) / (sigma * clip * np.sqrt(steps * 2))
    rng = np.random.default_rng(0)
    rows = []
    for r in range(args.replicates):
        phi_star = np.array([rng.normal(0, 0.3), -8.5 + rng.normal(0, 0.3)])
        iterates, gradients = linear_trace(phi_star, a, beta, kappa, sigma * clip, step, steps, rng)
        accounting = PrivacyAccounting(0.1, 1e-5, kappa, steps, sigma, 0.1, "synthetic", "-")
        release = DPVIRelease(iterates, gradients, accounting, clip, step, 1.0, beta, 10, model=None, public_data={})
        out = sample_trace_model(trace_model_data(release, steps // 2), args.method, 1000, 500, 2, r)
        draws, a_draws = out["phi_star"].reshape(-1, 2), out["a"].reshape(-1, 2)
        z = (draws.mean(axis=0) - phi_star) / draws.std(axis=0)
        rows.append({"replicate": r, "z_mu": z[0], "z_u": z[1], "sd_mu": draws[:, 0].std(), "sd_u": draws[:, 1].std(),
                     "a_mu": a_draws[:, 0].mean(), "a_u": a_draws[:, 1].mean()})
    table = pd.DataFrame(rows)
    OUT.mkdir(parents=True, exist_ok=True)
    table.to_csv(OUT / f"trace_model_check_{args.method}.csv", index=False)
    for c in ("mu", "u"):
        z = table[f"z_{c}"]
        print(f"phi*_{c}: z mean {z.mean():.2f}, z sd {z.std():.2f}, 90% central coverage {np.mean(np.abs(z) < 1.645):.2f}, "
              f"posterior mean of a {table[f'a_{c}'].median():.3g} (true {a[0 if c == 'mu' else 1]:g})")


if __name__ == "__main__":
    main()
