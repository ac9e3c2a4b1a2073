"""q's sd along the DP-VI trace against the exact posterior sd, data sets 0-3 of repeat 0 (Dirichlet,
authors' settings, epsilon 0.1); with PYTHONPATH=sd_scale_patch for the sd form. Run from the repository root:

    python examples/results/dpvi_exponential_families_authors_dirichlet_sd_scale/q_sd_along_the_trace.py
"""
import sys
import types
import warnings

import numpy as np
from scipy import optimize

sys.path.insert(0, "examples")
warnings.simplefilter("ignore")
import dpvi_tarp  # noqa: E402

import robust_stan.methods.dpvi as dpvi  # noqa: E402
form = "sd" if getattr(dpvi, "SD_SCALE_PATCH", False) else "variance"
args = types.SimpleNamespace(settings="authors", rows=5000, steps=10_000, kappa=0.1, precondition=None, lambda_c=None,
                             burn_in=None, clip=None)
for k in range(4):
    s = dpvi_tarp.simulated_release("dirichlet_categorical", 0.1, 0, k, args)
    it = s.release.iterates; n = it.shape[1] // 2
    u = it[:, n:]
    sd = dpvi.softplus(u) if form == "sd" else np.sqrt(dpvi.softplus(u))
    f = lambda x: tuple(-np.asarray(v) for v in s.model.log_density_gradient(s.data, x))
    mode = optimize.minimize(f, np.zeros(n), jac=True, method="BFGS").x
    H = np.array([(f(mode + 1e-5 * e)[1] - f(mode - 1e-5 * e)[1]) / 2e-5 for e in np.eye(n)])
    exact = np.sqrt(np.diag(np.linalg.inv((H + H.T) / 2)))
    b = int(0.2 * (len(it) - 1))
    print(form, k, "q sd: start", np.round(sd[0], 4), "post-burn-in mean", np.round(sd[b:].mean(0), 4), "last", np.round(sd[-1], 4),
          "exact", np.round(exact, 4))
