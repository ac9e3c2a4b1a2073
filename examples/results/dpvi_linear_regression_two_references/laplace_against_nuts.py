"""Noise-aware NUTS against noise-aware Laplace on the same Table 2 releases (issue 22's check of
Laplace's trace-reference miss). Rebuilds data sets k of examples/dpvi_tarp.py's linear regression
(same seeds, same settings) and prints, per coordinate: the Laplace draws of phi* and A = softplus(v)
against NUTS's (mean difference in NUTS sds, sd ratio), and each posterior's theta mean, sd and the
truth's z-score.

    python examples/results/dpvi_linear_regression_two_references/laplace_against_nuts.py EPSILON K [K ...]
"""
import sys
import types
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import dpvi_tarp
import robust_stan as rs

warnings.simplefilter("ignore")
epsilon, datasets = float(sys.argv[1]), [int(a) for a in sys.argv[2:]]
args = types.SimpleNamespace(rows=5000)  # dpvi_tarp's settings for the regression
name = "linear_regression"
np.set_printoptions(precision=2, suppress=True, linewidth=200)
for k in datasets:
    simulated = dpvi_tarp.simulated_release(name, epsilon, 0, k, args)
    release, burn_in, truth = simulated.release, simulated.burn_in, simulated.truth
    nuts = rs.noise_aware(release, burn_in, method="nuts", iter_sampling=2000, iter_warmup=1000, seed=k)
    laplace = rs.noise_aware(release, burn_in, method="laplace", iter_sampling=2000, seed=k)
    print(f"=== epsilon {epsilon}, data set {k} (theta: w_1..w_11, log sigma^2; phi = 12 means, then 12 u's)")
    for part in ("phi_star", "a"):
        by_nuts = nuts.trace_draws[part].reshape(-1, release.iterates.shape[1])
        by_laplace = laplace.trace_draws[part].reshape(-1, release.iterates.shape[1])
        print(f"{part:8s} (Laplace - NUTS) / NUTS sd", (by_laplace.mean(0) - by_nuts.mean(0)) / by_nuts.std(0))
        print(f"{part:8s} Laplace sd / NUTS sd     ", by_laplace.std(0) / by_nuts.std(0))
    truth_u = release.unconstrain(truth)
    print("theta truth          ", truth_u)
    for label, fit in (("NUTS", nuts), ("Laplace", laplace)):
        draws = fit.unconstrained.reshape(-1, truth_u.size)
        print(f"theta {label:8s} mean   ", draws.mean(0))
        print(f"theta {label:8s} sd     ", draws.std(0))
        print(f"theta {label:8s} z(truth)", (truth_u - draws.mean(0)) / draws.std(0))
