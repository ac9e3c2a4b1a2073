"""Where the noise-aware posterior of phi* centres, against the noise-free VI optimum, for Table 1's
models with the authors' settings (dpvi_tarp.py's data sets 0..K-1 at epsilon 0.1).

The noise-aware model (paper eq. 20) takes the expected gradient to be linear in phi, so its phi*
sits where the iterates' own stationary mean puts it: summing the updates, the post-burn-in noisy
gradients average to about 0, and the model's phi* is then about phi_bar, the post-burn-in mean
of the iterates. The true optimum phi_VI solves G(phi) = 0 for the full-data expected gradient G.
Where G is curved over the range the DP noise makes the iterates wander (variance V), the two
differ, by Jensen's inequality, by about -G''/(2 G') V per coordinate. This script measures, per
data set and coordinate of mu:

- phi_VI: the root of G (all N rows, 64 antithetic common draws of q; scipy's root finder);
- phi_bar and the iterates' post-burn-in sd;
- the noise-aware NUTS posterior of phi* (mean and sd; rs.noise_aware, as dpvi_tarp.py runs it);
- (phi_bar - phi_VI) and (E[phi*] - phi_VI) in posterior sds of phi*, and the Jensen prediction
  -G''/(2 G') V in the same unit (G' and G'' by central differences of G at phi_VI);
- mean_G_over_trace: the noise-free G averaged over 200 post-burn-in iterates, in units of G' times
  the posterior sd (about 0 if the iterates are stationary around phi_bar).

    python examples/results/dpvi_exponential_families_authors_marginals/stationary_bias.py dirichlet_categorical 10
"""
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import optimize

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import dpvi_tarp
import robust_stan as rs
from robust_stan.methods.dpvi.mechanism import PerExampleObjective
from robust_stan.methods.dpvi.noise_aware import burn_in_steps

EPSILON = 0.1
args = types.SimpleNamespace(settings="authors", rows=5000)


def full_gradient(objective: PerExampleObjective, phi: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """G(phi): the sum over all rows of the per-example negative-ELBO phi-gradients at draws eps."""
    return objective.gradients(phi, eps, np.arange(objective.n_rows)).sum(axis=0)


def one_data_set(name: str, k: int) -> list[dict]:
    simulated = dpvi_tarp.simulated_release(name, EPSILON, 0, k, args)
    release, model = simulated.release, simulated.model
    stan_data = model.prepare(simulated.data, rs.KL()).stan_data
    objective = PerExampleObjective.of_program(model, stan_data, args.rows, release.q_scale)
    n = objective.dimension
    half = np.random.default_rng(1000 + k).standard_normal((32, n))
    eps = np.concatenate([half, -half])
    trace = release.iterates[burn_in_steps(simulated.burn_in, release.steps):release.steps]
    phi_bar, trace_sd = trace.mean(axis=0), trace.std(axis=0)
    solved = optimize.root(lambda phi: full_gradient(objective, phi, eps), phi_bar, method="hybr")
    if not solved.success:
        raise RuntimeError(f"{name} data set {k}: the root of G was not found ({solved.message})")
    phi_vi = solved.x
    noise_aware = rs.noise_aware(release, simulated.burn_in, method="nuts", iter_sampling=2000, iter_warmup=1000,
                                 seed=k)
    phi_star = noise_aware.trace_draws["phi_star"].reshape(-1, 2 * n)
    na_mean, na_sd = phi_star.mean(axis=0), phi_star.std(axis=0)
    along_trace = np.array([full_gradient(objective, phi, eps[::4]) for phi in trace[::len(trace) // 200][:200]])
    theta = noise_aware.unconstrained.reshape(-1, n)
    truth = release.unconstrain(simulated.truth)
    rows = []
    for j in range(n):
        step = np.zeros(2 * n)
        step[j] = trace_sd[j]
        g_plus, g_0, g_minus = (full_gradient(objective, phi_vi + s * step, eps)[j] for s in (1, 0, -1))
        slope = (g_plus - g_minus) / (2 * trace_sd[j])
        curvature = (g_plus - 2 * g_0 + g_minus) / trace_sd[j] ** 2
        rows.append({"model": name, "k": k, "coordinate": j, "phi_vi": phi_vi[j], "phi_bar": phi_bar[j],
                     "trace_sd": trace_sd[j], "na_mean": na_mean[j], "na_sd": na_sd[j],
                     "bar_minus_vi_in_sd": (phi_bar[j] - phi_vi[j]) / na_sd[j],
                     "na_minus_vi_in_sd": (na_mean[j] - phi_vi[j]) / na_sd[j],
                     "jensen_prediction_in_sd": -curvature / (2 * slope) * trace_sd[j] ** 2 / na_sd[j],
                     "mean_G_over_trace": along_trace[:, j].mean() / (slope * na_sd[j]),
                     "z_truth": (truth[j] - theta[:, j].mean()) / theta[:, j].std()})
    return rows


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    name, datasets = sys.argv[1], int(sys.argv[2])
    rows = []
    for k in range(datasets):
        rows += one_data_set(name, k)
        print(pd.DataFrame(rows[-2:]).round(3).to_string(index=False), flush=True)
    table = pd.DataFrame(rows)
    out = Path(__file__).parent / f"stationary_bias_{name}.csv"
    table.to_csv(out, index=False)
    columns = ["bar_minus_vi_in_sd", "na_minus_vi_in_sd", "jensen_prediction_in_sd", "mean_G_over_trace", "z_truth"]
    summary = table.groupby("coordinate")[columns].agg(["mean", "sem"])
    print(summary.round(3).to_string())
