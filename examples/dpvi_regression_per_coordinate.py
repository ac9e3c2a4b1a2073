"""Where Table 2's noise-aware posterior goes wrong: each coordinate against the exact posterior.

Table 2 (``../shared/papers/noise-aware-dpvi.txt``; examples/dpvi_tarp.py, results in
examples/results/dpvi_linear_regression_authors_settings) found the noise-aware posteriors
of the 10-dimensional linear regression too wide as a whole: TARP scores all 12
coordinates (w's 11 and log sigma^2) at once. Here, on the same simulated data sets and
DP-VI settings (dpvi_tarp.py's ``build`` and ``SETTINGS``), each coordinate of the
noise-aware NUTS posterior (rs.noise_aware) is compared with

- the truth: z = (posterior mean - truth) / posterior sd;
- the exact, non-private posterior on the same data (the normal-inverse-gamma prior is
  conjugate: sigma^2 | y ~ inv_gamma, w | sigma^2, y ~ normal; 20,000 independent draws):
  the ratio of the posterior sds, and the two parts of the noise-aware sd, the spread of
  phi*'s means (the trace model's uncertainty) and q's own sd at phi* (the mean over draws
  of q's sd at u*, sqrt(softplus(u*)) in the default variance form).

    python examples/dpvi_regression_per_coordinate.py --epsilons 0.1 1 --datasets 3

Writes examples/results/dpvi_linear_regression_per_coordinate/per_coordinate.csv (``--csv`` names
another file), with each release's w wander (the sum over w's means of the post-burn-in iterates'
variances) and sigma^2's post-burn-in iterate mean. ``--q-scale sd`` runs q's scale in the authors'
sd form; ``--w-step-scale`` multiplies the step constant lambda_c of w's means.

``--experiment coupling`` asks whether a trace model could learn the coupling that biases
log sigma^2 (w's wander enters sigma^2's gradient as residual variance) from the release
alone. The loss -log N(y | x'w, sigma) makes the noisy gradient of log sigma^2's mean depend
on w's iterates through D = (w_t - w_hat)' S (w_t - w_hat), S = Z'Z / N for the design
Z = [X, 1], with slope -(kappa N / 2) E_q[exp(-log sigma^2)]. On each release the post-burn-in gradients of log
sigma^2's mean are regressed on (1, log sigma^2's iterate, D); the slope on D, its standard
error, and the slope the loss implies are written to coupling.csv, with the shift the
coupling makes in the point where log sigma^2's gradient vanishes, log(1 + mean D / sigma_hat^2).

    python examples/dpvi_regression_per_coordinate.py --experiment coupling --epsilons 0.1 0.3 1 --datasets 10

``--experiment slope_bias`` (after ``coupling``) checks by simulation why the least-squares slope of
log sigma^2's gradients on its iterate (the curvature a the trace model's H.3 prior is centred on)
comes out far above the curvature the loss implies: a trace s_{t+1} = s_t - lambda g_{t+1},
g_{t+1} = a s_t + push + N(0, noise_sd^2), with each epsilon's median a, push (the coupling's
mean, b times mean D), noise sd and DP-VI's step for log sigma^2's mean from coupling.csv, 400
replicates; writes slope_bias.csv.

    python examples/dpvi_regression_per_coordinate.py --experiment slope_bias

``--experiment structural`` asks what a trace model built for the normal likelihood could learn
about log sigma^2: its gradient's mean is then kappa N / 2 [1 - exp(phi*_s - s_t) - D_t exp(-s_t)]
(the coupling and the curvature fixed by the loss; prior and q-variance terms, about 1% here,
left out), with D_t = sum_j S_jj (w_tj - mean w_j)^2 (S's diagonal from the data, as w's A would
give it, and w's trace mean for phi*_w). phi*_s's posterior under a flat prior is computed on a
grid; writes structural.csv (its mean and sd against the truth and the exact posterior).

    python examples/dpvi_regression_per_coordinate.py --experiment structural --epsilons 1 0.1 0.3 --datasets 10
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
import robust_stan as rs
from dpvi_tarp import OUT, settings_of, simulated_release
from robust_stan.methods.dpvi.mechanism import heuristic_step_size, q_sd
from robust_stan.methods.dpvi.noise_aware import burn_in_steps

NAME = "linear_regression"


def exact_posterior_draws(data: dict, rng: np.random.Generator, draws: int = 20_000) -> np.ndarray:
    """Independent draws of (w, log sigma^2) from the exact posterior under dpvi_tarp's prior
    sigma^2 ~ inv_gamma(20, 0.5), w | sigma^2 ~ N(0, 4 sigma^2 I), with design [X, 1]."""
    design = np.c_[data["X"], np.ones(len(data["y"]))]
    y = data["y"]
    precision = design.T @ design + np.eye(design.shape[1]) / 4
    covariance = np.linalg.inv(precision)
    mean = covariance @ design.T @ y
    shape, rate = 20 + len(y) / 2, 0.5 + (y @ y - mean @ precision @ mean) / 2
    sigma2 = 1 / rng.gamma(shape, 1 / rate, draws)
    w = mean + np.sqrt(sigma2)[:, None] * (rng.standard_normal((draws, len(mean))) @ np.linalg.cholesky(covariance).T)
    return np.c_[w, np.log(sigma2)]


def one_data_set(epsilon: float, k: int, args) -> list[dict]:
    """DP-VI on dpvi_tarp's data set k (repeat 0) and the per-coordinate comparison."""
    simulated = simulated_release(NAME, epsilon, 0, k, args)  # dpvi_tarp's data sets
    release, burn_in, data = simulated.release, simulated.burn_in, simulated.data
    true_point = release.unconstrain(simulated.truth)
    exact = exact_posterior_draws(data, np.random.default_rng(1))
    n = exact.shape[1]
    noise_aware = rs.noise_aware(release, burn_in, method="nuts", iter_sampling=2000, iter_warmup=1000, seed=k)
    theta = noise_aware.unconstrained.reshape(-1, n)
    phi_star = noise_aware.trace_draws["phi_star"].reshape(-1, 2 * n)
    # the post-burn-in iterates: w's wander (the sum of its means' variances) and sigma^2's iterate
    iterates = release.iterates[burn_in_steps(burn_in, release.steps):release.steps]
    trace = {"w_wander": iterates[:, :n - 1].var(axis=0).sum(),
             "sigma2_trace_mean": np.exp(iterates[:, n - 1]).mean()}
    rows = []
    for j in range(n):
        rows.append({"epsilon": epsilon, "k": k, "coordinate": j, "name": "log sigma2" if j == n - 1 else f"w[{j + 1}]",
                     "truth": true_point[j], "exact_mean": exact[:, j].mean(), "exact_sd": exact[:, j].std(),
                     "na_mean": theta[:, j].mean(), "na_sd": theta[:, j].std(),
                     "phi_star_mean_sd": phi_star[:, j].std(),
                     "q_sd_at_phi_star": q_sd(phi_star[:, n + j], release.q_scale).mean(),
                     "last_iterate_q_sd": float(q_sd(release.iterates[-1][n + j], release.q_scale)),
                     "exact_sigma2": np.exp(exact[:, n - 1]).mean(), **trace})
    return rows


def log_sigma2_trace(epsilon: float, k: int, args) -> tuple:
    """dpvi_tarp's data set k and DP-VI's release on it (a SimulatedRelease), the post-burn-in iterates,
    log sigma^2's noisy gradients there, and the design [X, 1]."""
    simulated = simulated_release(NAME, epsilon, 0, k, args)
    release = simulated.release
    start = burn_in_steps(simulated.burn_in, release.steps)
    design = np.c_[simulated.data["X"], np.ones(len(simulated.data["y"]))]
    return (simulated, release.iterates[start:release.steps],
            release.noisy_gradients[start:, release.dimension - 1], design)


def coupling_of_one_release(epsilon: float, k: int, args) -> dict:
    """The regression of log sigma^2's noisy gradients on w's squared wander D (module docstring) on
    dpvi_tarp's data set k, against the slope the loss implies (from kappa, N and the iterates); the data
    are used for D only (w_hat and S), to say how large the coupling is."""
    simulated, phi, gradient, design = log_sigma2_trace(epsilon, k, args)
    release, data = simulated.release, simulated.data
    n = release.dimension
    w_hat, residuals, *_ = np.linalg.lstsq(design, data["y"], rcond=None)
    sigma2_hat = residuals[0] / len(data["y"])
    deviation = phi[:, :n - 1] - w_hat
    wander = np.einsum("ti,ij,tj->t", deviation, design.T @ design / len(data["y"]), deviation)
    log_sigma2 = phi[:, n - 1]
    regressors = np.c_[np.ones(len(gradient)), log_sigma2 - log_sigma2.mean(), wander - wander.mean()]
    slopes, *_ = np.linalg.lstsq(regressors, gradient, rcond=None)
    noise = gradient - regressors @ slopes
    standard_errors = np.sqrt(np.diag(np.linalg.inv(regressors.T @ regressors)) * noise.var(ddof=3))
    q_variance = q_sd(phi[:, 2 * n - 1], release.q_scale) ** 2
    implied = -(args.kappa * len(data["y"]) / 2) * np.mean(np.exp(-log_sigma2 + q_variance / 2))
    return {"epsilon": epsilon, "k": k, "slope_on_wander": slopes[2], "slope_se": standard_errors[2],
            "implied_slope": implied, "implied_over_se": implied / standard_errors[2],
            "mean_wander": wander.mean(), "sd_wander": wander.std(), "sigma2_hat": sigma2_hat,
            "shift_in_log_sigma2": np.log1p(wander.mean() / sigma2_hat),
            "slope_on_log_sigma2": slopes[1], "slope_on_log_sigma2_se": standard_errors[1],
            "gradient_noise_sd": release.noise_sd[n - 1], "residual_sd": noise.std()}


def slope_bias(coupling: pd.DataFrame, args, replicates: int = 400) -> pd.DataFrame:
    """The least-squares slope of g on s, on simulated traces of a linear drift with each epsilon's
    median constants from ``coupling`` (module docstring), against the true a."""
    rng = np.random.default_rng(1)
    settings = settings_of(NAME, args)
    lambda_c = settings["lambda_c"][11]  # log sigma^2's mean, the entry after w's 11 means
    d = len(settings["lambda_c"])  # phi's dimension, in DP-VI's step rule
    rows = []
    # log sigma^2's curvature the loss implies: (kappa N / 2) E_q[exp(-log sigma^2)] (sigma_hat^2 + D)
    implied_a = coupling.implied_slope.abs() * (coupling.sigma2_hat + coupling.mean_wander)
    for epsilon, sub in coupling.assign(implied_a=implied_a).groupby("epsilon"):
        a = float(sub.implied_a.median())
        push = float((sub.implied_slope * sub.mean_wander).median())
        noise = float(sub.gradient_noise_sd.median())  # sigma C (beta is 1 for the means)
        step = heuristic_step_size(lambda_c, noise / settings["clip"], settings["clip"], args.steps, d)
        s = np.zeros(replicates)
        trace, gradients = [], []
        for _ in range(args.steps):
            g = a * s + push + noise * rng.standard_normal(replicates)
            trace.append(s)
            gradients.append(g)
            s = s - step * g
        start = burn_in_steps(settings["burn_in"], args.steps)
        x = np.array(trace[start:]) - np.mean(trace[start:], axis=0)
        y = np.array(gradients[start:])
        slope = (x * y).sum(axis=0) / (x * x).sum(axis=0)
        residual = y - y.mean(axis=0) - slope * x
        se = np.sqrt(residual.var(axis=0) / (x * x).sum(axis=0))
        rows.append({"epsilon": epsilon, "true_a": a, "push": push, "noise_sd": noise, "step": step,
                     "relaxation_steps": 1 / (step * a), "median_slope": np.median(slope), "mean_slope": slope.mean(),
                     "median_slope_over_a": np.median(slope) / a, "median_abs_slope_over_se": np.median(np.abs(slope) / se),
                     "releases_median_slope_over_a": float((sub.slope_on_log_sigma2 / sub.implied_a).median())})
    return pd.DataFrame(rows)


def structural_of_one_release(epsilon: float, k: int, args) -> dict:
    """phi*_s's posterior (flat prior, grid) under the normal likelihood's own trace model for log sigma^2
    (module docstring) on dpvi_tarp's data set k."""
    simulated, phi, gradient, design = log_sigma2_trace(epsilon, k, args)
    release, data = simulated.release, simulated.data
    n = release.dimension
    s_diagonal = np.einsum("ij,ij->j", design, design) / len(data["y"])
    w, log_sigma2 = phi[:, :n - 1], phi[:, n - 1]
    wander = ((w - w.mean(axis=0)) ** 2 * s_diagonal).sum(axis=1)
    scale = args.kappa * len(data["y"]) / 2
    grid = np.linspace(log_sigma2.mean() - 4, log_sigma2.mean() + 4, 8001)
    predicted = scale * (1 - np.exp(grid[:, None] - log_sigma2) - wander * np.exp(-log_sigma2))
    log_likelihood = -((gradient - predicted) ** 2).sum(axis=1) / (2 * release.noise_sd[n - 1] ** 2)
    weights = np.exp(log_likelihood - log_likelihood.max())
    weights /= weights.sum()
    mean = weights @ grid
    sd = np.sqrt(weights @ (grid - mean) ** 2)
    truth = release.unconstrain(simulated.truth)[n - 1]
    exact = exact_posterior_draws(data, np.random.default_rng(1))[:, n - 1]
    return {"epsilon": epsilon, "k": k, "truth": truth, "exact_mean": exact.mean(), "exact_sd": exact.std(),
            "structural_mean": mean, "structural_sd": sd, "iterate_mean": log_sigma2.mean(),
            "upper_95": grid[np.searchsorted(np.cumsum(weights), 0.95)],
            "z_truth": (mean - truth) / sd, "z_exact": (mean - exact.mean()) / sd}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experiment", choices=["per_coordinate", "coupling", "slope_bias", "structural"],
                        default="per_coordinate")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.1, 1.0])
    parser.add_argument("--datasets", type=int, default=3)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--kappa", type=float, default=0.1)
    parser.add_argument("--q-scale", choices=("variance", "sd"), default=None,
                        help="q's scale parameterisation (default: dpvi_tarp's SETTINGS, the variance)")
    parser.add_argument("--w-step-scale", type=float, default=1.0,
                        help="multiplies lambda_c for w's 11 means (per_coordinate only)")
    parser.add_argument("--csv", default="per_coordinate.csv", help="per_coordinate's output file name")
    args = parser.parse_args(argv)
    if args.w_step_scale <= 0:
        parser.error(f"--w-step-scale: must be positive, got {args.w_step_scale}")
    if args.w_step_scale != 1.0:
        lambda_c = settings_of(NAME, argparse.Namespace(rows=args.rows))["lambda_c"].copy()
        lambda_c[:11] *= args.w_step_scale
        args.lambda_c = lambda_c
    warnings.simplefilter("ignore")
    out = OUT / "dpvi_linear_regression_per_coordinate"
    out.mkdir(parents=True, exist_ok=True)
    if args.experiment == "coupling":
        table = pd.DataFrame([coupling_of_one_release(eps, k, args) for eps in args.epsilons for k in range(args.datasets)])
        table.to_csv(out / "coupling.csv", index=False)
        print(table.groupby("epsilon").median().round(4).to_string())
        return
    if args.experiment == "structural":
        table = pd.DataFrame([structural_of_one_release(eps, k, args) for eps in args.epsilons for k in range(args.datasets)])
        table.to_csv(out / "structural.csv", index=False)
        table["truth_below_upper_95"] = table.truth < table.upper_95
        print(table.groupby("epsilon").agg(
            rms_z_truth=("z_truth", lambda z: np.sqrt(np.mean(z**2))), mean_z_truth=("z_truth", "mean"),
            median_sd=("structural_sd", "median"), truth_below_upper_95=("truth_below_upper_95", "mean")).round(3).to_string())
        return
    if args.experiment == "slope_bias":
        table = slope_bias(pd.read_csv(out / "coupling.csv"), args)
        table.to_csv(out / "slope_bias.csv", index=False)
        print(table.round(3).to_string())
        return
    table = pd.DataFrame([row for eps in args.epsilons for k in range(args.datasets) for row in one_data_set(eps, k, args)])
    table["z_noise_aware"] = (table.na_mean - table.truth) / table.na_sd
    table["z_exact"] = (table.exact_mean - table.truth) / table.exact_sd
    table["sd_ratio"] = table.na_sd / table.exact_sd
    table.to_csv(out / args.csv, index=False)
    table["part"] = np.where(table.name == "log sigma2", "log sigma2", "w")
    summary = table.groupby(["epsilon", "part"]).agg(
        rms_z_noise_aware=("z_noise_aware", lambda z: np.sqrt(np.mean(z**2))),
        rms_z_exact=("z_exact", lambda z: np.sqrt(np.mean(z**2))),
        within_90_noise_aware=("z_noise_aware", lambda z: np.mean(np.abs(z) < 1.645)),
        median_sd_ratio=("sd_ratio", "median"))
    print(summary.round(2).to_string())


if __name__ == "__main__":
    main()
