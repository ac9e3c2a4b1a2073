"""q's sd along the DP-VI trace against the exact posterior's sd, data sets 0-3 of repeat 0 (Table 1's
Dirichlet-categorical, the authors' settings, epsilon 0.1), with q's scale in either form. The exact
posterior's sd is the Laplace approximation's at its mode, from the model's own gradient. Run from
the repository root:

    python examples/results/dpvi_exponential_families_authors_dirichlet_sd_scale/q_sd_along_the_trace.py [--q-scale sd]
"""

import argparse
import sys
import types
import warnings

import numpy as np
from scipy import optimize

sys.path.insert(0, "examples")
warnings.simplefilter("ignore")
import dpvi_tarp  # noqa: E402
from robust_stan.methods.dpvi.mechanism import q_sd  # noqa: E402


def exact_sd(model, data, n: int) -> np.ndarray:
    def objective(x):
        value, gradient = model.log_density_gradient(data, x)
        return -value, -np.asarray(gradient)

    mode = optimize.minimize(objective, np.zeros(n), jac=True, method="BFGS").x
    hessian = np.array([(objective(mode + 1e-5 * e)[1] - objective(mode - 1e-5 * e)[1]) / 2e-5 for e in np.eye(n)])
    return np.sqrt(np.diag(np.linalg.inv((hessian + hessian.T) / 2)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--q-scale", choices=("variance", "sd"), default="variance")
    q_scale = parser.parse_args().q_scale
    args = types.SimpleNamespace(settings="authors", rows=5000, steps=10_000, kappa=0.1, q_scale=q_scale)
    for k in range(4):
        simulated = dpvi_tarp.simulated_release("dirichlet_categorical", 0.1, 0, k, args)
        iterates = simulated.release.iterates
        n = iterates.shape[1] // 2
        sd = q_sd(iterates[:, n:], q_scale)
        burn_in = int(simulated.burn_in * (len(iterates) - 1))
        print(f"{q_scale} form, data set {k}: q's sd at the start {np.round(sd[0], 4)}, post-burn-in mean "
              f"{np.round(sd[burn_in:].mean(axis=0), 4)}, last {np.round(sd[-1], 4)}; "
              f"exact {np.round(exact_sd(simulated.model, simulated.data, n), 4)}")


if __name__ == "__main__":
    main()
