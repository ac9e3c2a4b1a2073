"""Share of rows whose preconditioned phi-gradient exceeds C, at the post-burn-in mean of phi, for
Table 1's models with the authors' settings (data sets 0-2 of dpvi_tarp.py's seeds).

    python examples/results/dpvi_exponential_families_authors_marginals/clipped_share.py dirichlet_categorical beta_bernoulli
"""
import sys
import types
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import dpvi_tarp as dt
import robust_stan as rs
from robust_stan.methods.dpvi.mechanism import PerExampleObjective
from robust_stan.methods.dpvi.noise_aware import burn_in_steps

warnings.simplefilter("ignore")
args = types.SimpleNamespace(settings="authors", rows=5000)
for name in sys.argv[1:]:
    for k in range(3):
        simulated = dt.simulated_release(name, 0.1, 0, k, args)
        model, data, rel, burn_in = simulated.model, simulated.data, simulated.release, simulated.burn_in
        settings = dt.settings_of(name, args)
        phi = rel.iterates[burn_in_steps(burn_in, rel.steps):rel.steps].mean(axis=0)
        stan_data = model.prepare(data, rs.KL()).stan_data
        obj = PerExampleObjective.of_program(model, stan_data, 5000, rel.q_scale)
        n = obj.dimension
        beta = np.concatenate([np.ones(n), np.full(n, settings["precondition"])])
        shares, norms = [], []
        for s in range(20):
            eps = np.random.default_rng(s).standard_normal((10, n))
            g = obj.gradients(phi, eps, np.arange(5000)) * beta
            norm = np.linalg.norm(g, axis=1)
            shares.append(np.mean(norm > settings["clip"]))
            norms.append(np.quantile(norm, [0.5, 0.99]))
        print(f"{name} k={k}: C={settings['clip']:.3g}  clipped share {np.mean(shares):.4f}  "
              f"norm median / q99 {np.mean(norms, axis=0).round(3)}", flush=True)
