"""Is the noise-aware post-processing model calibrated on a trace that follows it exactly?

A check of ``robust_stan.methods.dpvi.noise_aware`` independent of DP-VI: traces simulated from
the paper's eq. 20 itself (linear gradients g~_{t+1} = kappa A (phi_t - phi*) + noise, noise
sd sigma C / beta, steps lambda_heur beta), so that any miscalibration is the trace model's
own, not a departure of DP-VI's gradients from it. Two sets of constants:

``--experiment gamma_exponential`` (default): the Gamma-exponential TARP at epsilon = 0.1
(N = 5000: a = (N, 1/2) for (mu, u), sigma = 310, C = 10, beta = (1, 100), kappa = 0.1,
T = 10^4, burn-in T / 2). phi* is drawn per replicate and its posterior sampled by
``--method`` (NUTS or Laplace); the z-scores (posterior mean - phi*) / posterior sd should
have sd 1 and the central 90% intervals should cover 90%.

``--experiment regression_w``: Table 2's coefficients w (``dpvi_tarp.py``'s regression
settings: N = 5000, C = 260, lambda_c = 4, d = 24, kappa = 0.1, T = 10^4, burn-in 20%, sigma
from the accountant at epsilon = 0.1, 0.3 and 1) with a = N / sigma^2 at the prior mean
sigma^2 = 0.5 / 19. Each replicate is one coordinate, started in its stationary
distribution. phi*'s posterior is computed exactly: given v it is normal (the likelihood is
quadratic in phi*), so it is a mixture of normals over a grid of v (``phi_star_posterior``);
the posterior of ``--nuts-check`` replicates is also sampled by the library's NUTS as a
check of that computation. The result is set beside the PITs of w's coordinates in the
Table 2 run (``../dpvi_linear_regression_k100_non_centred/marginals.csv``).

    python examples/dpvi_trace_model_check.py [--method nuts] [--replicates 60]
    python examples/dpvi_trace_model_check.py --experiment regression_w --replicates 10000

Writes examples/results/dpvi_exponential_families/trace_model_check_<method>.csv, or for
``regression_w`` examples/results/dpvi_trace_model_check_regression/{table.csv, nuts_check.csv, pit.png}.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from robust_stan.methods.dpvi.accounting import PrivacyAccounting, solve_noise_multiplier
from robust_stan.methods.dpvi.mechanism import DPVIRelease, heuristic_step_size, softplus
from robust_stan.methods.dpvi.noise_aware import sample_trace_model, trace_model_data, trace_statistics

OUT = Path(__file__).parent / "results"
TABLE2_MARGINALS = OUT / "dpvi_linear_regression_k100_non_centred" / "marginals.csv"
# Table 2's regression (dpvi_tarp.SETTINGS["linear_regression"]): w's means have beta = 1 and lambda_c = 4
REGRESSION = {"rows": 5000, "clip": 260.0, "lambda_c": 4.0, "d": 24, "kappa": 0.1, "steps": 10_000, "burn_in": 2000,
              "delta": 1e-5, "prior_mean_sigma2": 0.5 / 19}
THREE_SIGMA = stats.norm.cdf(-3.0)  # a PIT this close to 0 or 1 is a miss beyond 3 sds


def linear_trace(phi_star, a, beta, kappa, sigma_c, step, steps, rng):
    phi = np.array([0.0, -8.5])  # where the Gamma-exponential runs start: mu = 0, variance 1 / N
    iterates, gradients = [phi.copy()], []
    for _ in range(steps):
        g = (kappa * a * beta * (phi - phi_star) + sigma_c * rng.standard_normal(phi.size)) / beta
        gradients.append(g)
        phi = phi - step * beta * g
        iterates.append(phi.copy())
    return np.array(iterates), np.array(gradients)


def gamma_exponential_check(args) -> None:
    """The Gamma-exponential constants: NUTS or Laplace on each replicate (module docstring)."""
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
        traced = sample_trace_model(trace_model_data(release, steps // 2), args.method, 1000, 500, 2, r)
        draws, a_draws = traced["phi_star"].reshape(-1, 2), traced["a"].reshape(-1, 2)
        z = (draws.mean(axis=0) - phi_star) / draws.std(axis=0)
        rows.append({"replicate": r, "z_mu": z[0], "z_u": z[1], "sd_mu": draws[:, 0].std(), "sd_u": draws[:, 1].std(),
                     "a_mu": a_draws[:, 0].mean(), "a_u": a_draws[:, 1].mean()})
    table = pd.DataFrame(rows)
    out = OUT / "dpvi_exponential_families"
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / f"trace_model_check_{args.method}.csv", index=False)
    for c in ("mu", "u"):
        z = table[f"z_{c}"]
        print(f"phi*_{c}: z mean {z.mean():.2f}, z sd {z.std():.2f}, 90% central coverage {np.mean(np.abs(z) < 1.645):.2f}, "
              f"posterior mean of a {table[f'a_{c}'].median():.3g} (true {a[0 if c == 'mu' else 1]:g})")


def stationary_linear_traces(a, noise_sd, step, kappa, steps, burn_in, replicates, rng):
    """Post-burn-in pairs (phi_t, g~_{t+1}), arrays (steps - burn_in, replicates): each replicate one
    coordinate following eq. 20 with phi* = 0, started in the stationary distribution."""
    c = kappa * a
    rho = 1 - step * c
    phi = rng.normal(0, step * noise_sd / np.sqrt(1 - rho**2), replicates)
    phis, grads = np.empty((steps - burn_in, replicates)), np.empty((steps - burn_in, replicates))
    for t in range(steps):
        g = c * phi + noise_sd * rng.standard_normal(replicates)
        if t >= burn_in:
            phis[t - burn_in], grads[t - burn_in] = phi, g
        phi = phi - step * g
    return phis, grads


PHI_STAR_GRID = np.linspace(-12, 12, 1201)


def phi_star_posterior(data: dict, grid=PHI_STAR_GRID):
    """The trace model's exact posterior of phi*_j for every coordinate j of ``data`` (the Stan data
    of ``trace_statistics``): given v_j it is N(phi_bar_j + m(v), 1 / P(v)), P = 1 + n (kappa a)^2 /
    noise_sd^2, so it is a mixture over a grid of v in H.3 prior sds. Returns (weights, means,
    precisions, a), each (d, len(grid)), a = softplus(v) at the grid's points."""
    kappa, n = data["kappa"], data["n_obs"]
    s2 = np.broadcast_to(data["noise_sd"], data["phi_bar"].shape)[:, None] ** 2
    v = data["v_prior_mean"][:, None] + data["v_prior_sd"][:, None] * grid
    a = softplus(v)
    c = kappa * a
    precision = 1 + n * c**2 / s2
    m = -(c * data["sum_g"][:, None] / s2) / precision  # phi* - phi_bar: the prior N(0, 1) times eq. 20
    log_w = (-0.5 * grid**2 + (c * data["sum_gd"][:, None] - 0.5 * c**2 * data["sum_dd"][:, None]) / s2
             + 0.5 * precision * m**2 - 0.5 * np.log(precision))
    weights = np.exp(log_w - log_w.max(axis=1, keepdims=True))
    return weights / weights.sum(axis=1, keepdims=True), data["phi_bar"][:, None] + m, precision, a


def mixture_summary(weights, means, precisions, truth=0.0) -> pd.DataFrame:
    """Mean, sd, the truth's PIT and z of each row's normal mixture; the posterior mean of a is added by the caller."""
    mean = np.sum(weights * means, axis=1)
    sd = np.sqrt(np.sum(weights * (1 / precisions + means**2), axis=1) - mean**2)
    pit = np.sum(weights * stats.norm.cdf((truth - means) * np.sqrt(precisions)), axis=1)
    return pd.DataFrame({"mean": mean, "sd": sd, "pit": pit, "z": (truth - mean) / sd})


def calibration_row(pit: np.ndarray, z: np.ndarray) -> dict:
    """z's sd, the shares of |z| > 3 and of PITs beyond 3 sds, and the central 90% intervals' coverage."""
    beyond = (pit < THREE_SIGMA) | (pit > 1 - THREE_SIGMA)
    central = (pit > 0.05) & (pit < 0.95)
    return {"pairs": len(pit), "z_sd": np.std(z), "share_abs_z_above_3": np.mean(np.abs(z) > 3),
            "share_pit_beyond_3_sds": beyond.mean(), "se_pit_beyond": np.sqrt(beyond.mean() * (1 - beyond.mean()) / len(pit)),
            "central_90_coverage": central.mean(), "se_central": np.sqrt(central.mean() * (1 - central.mean()) / len(pit))}


def regression_w_check(args) -> None:
    """Table 2's w constants at each epsilon: exact posteriors of many replicates, a NUTS check, and
    Table 2's own w coordinates beside them (module docstring)."""
    warnings.simplefilter("ignore")
    c = REGRESSION
    out = OUT / "dpvi_trace_model_check_regression"
    out.mkdir(parents=True, exist_ok=True)
    table2 = pd.read_csv(TABLE2_MARGINALS) if TABLE2_MARGINALS.exists() else None
    rng = np.random.default_rng(args.seed)
    a_true = c["rows"] / c["prior_mean_sigma2"]  # w's curvature N E[1 / sigma^2], x ~ N(0, I)
    rows, checks, pits = [], [], {}
    for epsilon in (0.1, 0.3, 1.0):
        sigma = solve_noise_multiplier(epsilon, c["delta"], c["kappa"], c["steps"]).noise_multiplier
        noise_sd = sigma * c["clip"]
        step = heuristic_step_size(c["lambda_c"], sigma, c["clip"], c["steps"], c["d"])
        summaries, a_means = [], []
        chunks = np.array_split(np.arange(args.replicates), max(1, args.replicates // 1000))
        for i, chunk in enumerate(chunks):
            phis, grads = stationary_linear_traces(a_true, noise_sd, step, c["kappa"], c["steps"], c["burn_in"],
                                                   len(chunk), rng)
            data = trace_statistics(phis, grads, c["kappa"], np.full(len(chunk), noise_sd))
            weights, means, precisions, a = phi_star_posterior(data)
            summaries.append(mixture_summary(weights, means, precisions))
            a_means.append(np.sum(weights * a, axis=1))
            if i == 0:  # the first replicates, by NUTS too
                checks += nuts_check(data, summaries[-1], args.nuts_check, epsilon, args.seed)
        summary = pd.concat(summaries, ignore_index=True)
        pits[("eq. 20 traces", epsilon)] = summary["pit"].to_numpy()
        relaxation = 1 / (step * c["kappa"] * a_true)
        rows.append({"epsilon": epsilon, "source": "eq. 20 traces", "noise_sd": noise_sd, "relaxation_steps": relaxation,
                     "relaxation_times_in_trace": (c["steps"] - c["burn_in"]) / relaxation,
                     "posterior_mean_a_over_a": float(np.median(np.concatenate(a_means)) / a_true),
                     **calibration_row(summary["pit"].to_numpy(), summary["z"].to_numpy())})
        if table2 is not None:
            w = table2[(table2.method == "noise-aware NUTS") & (table2.coordinate < 11) & np.isclose(table2.epsilon, epsilon)]
            pits[("Table 2, w", epsilon)] = w["pit"].to_numpy()
            rows.append({"epsilon": epsilon, "source": "Table 2, w", "noise_sd": noise_sd,
                         **calibration_row(w["pit"].to_numpy(), w["z"].to_numpy())})
    table = pd.DataFrame(rows)
    table.to_csv(out / "table.csv", index=False)
    pd.DataFrame(checks).to_csv(out / "nuts_check.csv", index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.round(4).to_string(index=False))
        print(pd.DataFrame(checks).round(4).to_string(index=False))
    if table2 is not None:
        print(recurring_misses(table2))
    plot_pits(pits, out / "pit.png")


def nuts_check(data: dict, exact: pd.DataFrame, count: int, epsilon: float, seed: int) -> list[dict]:
    """The library's NUTS on the trace model of the first ``count`` replicates, against the exact posterior."""
    if count == 0:
        return []
    first = {key: (value[:count] if isinstance(value, np.ndarray) and value.ndim == 1 else value)
             for key, value in data.items()}
    first["d"] = count
    draws = sample_trace_model(first, "nuts", 4000, 1000, 2, seed)["phi_star"].reshape(-1, count)
    return [{"epsilon": epsilon, "replicate": j, "exact_mean": exact["mean"][j], "nuts_mean": draws[:, j].mean(),
             "exact_sd": exact["sd"][j], "nuts_sd": draws[:, j].std(), "exact_pit": exact["pit"][j],
             "nuts_pit": np.mean(draws[:, j] < 0)} for j in range(count)]


def recurring_misses(marginals: pd.DataFrame) -> str:
    """How many (data set, coordinate) pairs of w miss beyond 3 sds at more than one epsilon: DP-VI's
    seed is the data set's k at every epsilon, so its noise draws are the same there, up to scale."""
    w = marginals[(marginals.method == "noise-aware NUTS") & (marginals.coordinate < 11)].copy()
    w["miss"] = (w.pit < THREE_SIGMA) | (w.pit > 1 - THREE_SIGMA)
    per_pair = w.groupby(["k", "coordinate"]).miss.sum()
    return (f"pairs of w missing beyond 3 sds: {int((per_pair >= 1).sum())} at some epsilon, "
            f"{int((per_pair >= 2).sum())} at two or three")


def plot_pits(pits: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4), sharey=True)
    for ax, epsilon in zip(axes, (0.1, 0.3, 1.0)):
        for (source, eps), pit in pits.items():
            if eps == epsilon:
                ax.hist(pit, bins=20, range=(0, 1), density=True, histtype="step", lw=1.5, label=f"{source} ({len(pit)})")
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_title(f"epsilon {epsilon:g}")
        ax.set_xlabel("PIT of the truth")
    axes[0].set_ylabel("density")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experiment", choices=["gamma_exponential", "regression_w"], default="gamma_exponential")
    parser.add_argument("--method", choices=["nuts", "laplace"], default="nuts", help="gamma_exponential only")
    parser.add_argument("--replicates", type=int, default=None, help="default 60 (gamma_exponential), 10000 (regression_w)")
    parser.add_argument("--nuts-check", type=int, default=4, help="regression_w: replicates per epsilon also sampled by NUTS")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.experiment == "gamma_exponential":
        args.replicates = args.replicates or 60
        gamma_exponential_check(args)
    else:
        args.replicates = args.replicates or 10_000
        regression_w_check(args)


if __name__ == "__main__":
    main()
