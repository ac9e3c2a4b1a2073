"""Noise-aware DP-VI coverage by TARP: the noise-aware DPVI paper's Table 1 (exponential families)
and Table 2 (10-dimensional linear regression), ``../shared/papers/noise-aware-dpvi.txt``.

Each of K simulated data sets draws theta from the prior and N rows from the model;
DP-VI (rs.dpvi) runs on it, and from its release alone come the noise-aware posterior
(NUTS, 1000 warm-up + 4000 draws in 2 chains; and Laplace) and the two baselines, the
last iterate and DPVIm (the mean of the post-burn-in iterates). TARP (the paper's
algorithm 1 and appendix H.4) scores each method: credible balls on the unconstrained
scale around a reference point, coverage over alpha in 0..1 (101 levels), RMSE of
coverage - (1 - alpha) (eq. 27). Two reference points are scored (``reference`` in the
tables): ``prior``, a point drawn from the prior, and ``trace``, the authors' code's
theta_ref(xi) (the mean of the post-burn-in mu iterates plus U(-4 sd, 4 sd), sd that of the
method's draws; ``trace_references``; ``--reference-redraws`` averages the RMSE over several
draws of its jitter, as the authors' code does over 20). With ``--repeats R`` the study runs R
times on fresh data sets and the table gives the mean and sd of the RMSE over repeats,
as the paper's tables do; the Monte Carlo error of a single repeat's RMSE is the sd of
its bootstrap over the K data sets. The RMSE depends on K even for a perfectly calibrated
posterior (its coverage curve is then the empirical CDF of K uniforms: mean RMSE 0.049 at
K = 60, 0.017 at the paper's K = 500), so the table also gives that reference's mean and
95% and 99% quantiles at the K used: a figure from another K is not comparable as it is.

The paper's settings: epsilon = 0.1 (Table 1) or 0.1, 0.3, 1 (Table 2), delta = 1e-5,
N = 5000, kappa = 0.1, T = 10^4, K = 500 data sets, 20 repeats. What the paper leaves
open, chosen here: priors Gamma(2, 2), Beta(2, 2), Dirichlet(2, 2, 2); the clipping
bound C (10 for the exponential, whose score 1 - rate y has an Exp(1) tail; 2 for the
bounded scores of the Bernoulli and categorical); beta_u = 100; initial variances 1 / N (N is
fixed by the design, so public); burn-in T / 2; lambda_c = 1. The regression's settings
follow the authors' code (SETTINGS; C = 260, beta_u = 1500, lambda_c = 4, burn-in 20%, phi_0
near the prior's means); an earlier run with C = 60 (the 99th percentile of a row's gradient
norm at the truth under the prior predictive), lambda_c = sqrt(d / 2) and phi_0 = 0 left
the iterates at their start at epsilon 0.1 and 0.3 (the results README has both).
Linear regression: (w, sigma^2) ~ N-Gamma^-1(0, 1/4, 20, 1/2) read as
sigma^2 ~ inv_gamma(20, 1/2) and w | sigma^2 ~ N(0, 4 sigma^2 I) (11 coefficients, the
last an intercept), x ~ N(0, I_10).

    python examples/dpvi_tarp.py --experiment exponential_families --datasets 100 --workers 2
    python examples/dpvi_tarp.py --experiment exponential_families --datasets 500 --repeats 20 --workers 64   # the paper's size
    # the authors' code's protocol:
    python examples/dpvi_tarp.py --settings authors --datasets 500 --reference-redraws 20 --address ADDRESS
    python examples/dpvi_tarp.py --experiment linear_regression --epsilons 0.1 0.3 1 --datasets 50
    python examples/dpvi_tarp.py --settings authors --datasets 60   # the authors' code's priors and settings

Writes examples/results/dpvi_<experiment>/{runs.csv (coverage curves), repeats.csv, table.csv (a row per
cell, reference, method and ``coordinates``: ``all``, the paper's test, and for the regression ``w`` alone),
coverage.png, marginals.csv and marginal_summary.csv (each coordinate's PIT and z-score: ``marginal_checks``)}.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

import robust_stan as rs
from _cluster import add_address_argument, cluster_pool
from robust_stan.methods.dpvi.mechanism import softplus
from robust_stan.methods.dpvi.noise_aware import burn_in_steps
from robust_stan.results.coverage import calibrated_rmse_reference, coverage_curve, coverage_rmse, tarp_coverage

OUT = Path(__file__).parent / "results"
ALPHAS = np.linspace(0.0, 1.0, 101)
# the noise-aware methods' names by phi*'s prior (rs.noise_aware's phi_star_prior): eq. A61's unit sd keeps
# the names of the earlier results
PHI_STAR_PRIOR_LABELS = {"unit": "", "trace_sd": " (trace-sd prior)"}
EXPERIMENTS = {"exponential_families": ("gamma_exponential", "beta_bernoulli", "dirichlet_categorical"),
               "linear_regression": ("linear_regression",)}
# Besides TARP on every coordinate (the paper's), TARP on a model's named subsets of the unconstrained
# coordinates: the regression's coefficients alone, to tell a miss in w from one in log sigma^2.
COORDINATE_SUBSETS = {"linear_regression": {"w": slice(0, 11)}}
# DP-VI's settings per model where they differ from DEFAULTS; every one is chosen without the data.
# The regression's follow the authors' code (DPBayes/noise-aware-dpvi, coverage_experiment.py,
# linear_regression10d: C 260, beta_u 1500, lambda_c 4 and 4 / 28, burn-in 20%), with phi_0 at the prior's
# means (w = 0, sigma^2 = 0.5 / 19) and q's variances the prior-mean sigma^2 / N (theirs: w = 1,
# sigma^2 = 0.018 and q's sd 0.0025, which is about the same variance).
DEFAULTS = {"clip": 10.0, "lambda_c": 1.0, "precondition": 100.0, "inits": None, "initial_variance": None,
            "burn_in": 0.5}
SETTINGS = {
    "gamma_exponential": {},
    "beta_bernoulli": {"clip": 2.0},
    "dirichlet_categorical": {"clip": 2.0},
    # lambda_c per entry of phi (w's 11 means, sigma^2's mean, then the 12 u's): the authors' 4,
    # and 4 / 28 for sigma^2's mean, whose iterate a full step lets wander far above the optimum
    "linear_regression": {"clip": 260.0, "lambda_c": np.r_[np.full(11, 4.0), 4.0 / 28, np.full(12, 4.0)],
                          "precondition": 1500.0, "burn_in": 0.2,
                          "inits": {"w": np.zeros(11), "sigma2": 0.5 / 19}, "initial_variance": 0.5 / 19 / 5000},
}
# ``--settings authors``: the exponential families with the authors' code's choices
# (coverage_experiment.py, set_default_args_<model> and perform_experiment): priors Gamma(8, 2),
# Beta(10, 10), Dirichlet(5, 5, 5); C 2 / 2 / sqrt 2; beta_u 100 / 120 / 100; burn-in 20%; mu_0 = 0;
# their initial pre-transformed scale -4 / -4 / -6 is q's sd softplus(u), here as a variance (with
# --q-scale sd, their form, u_0 is exactly -4 / -4 / -6).
PRIORS = {"ours": {"gamma_exponential": (2.0, 2.0), "beta_bernoulli": (2.0, 2.0), "dirichlet_categorical": 2.0},
          "authors": {"gamma_exponential": (8.0, 2.0), "beta_bernoulli": (10.0, 10.0), "dirichlet_categorical": 5.0}}
AUTHORS_SETTINGS = {
    "gamma_exponential": {"clip": 2.0, "precondition": 100.0, "burn_in": 0.2,
                          "initial_variance": float(softplus(-4.0) ** 2)},
    "beta_bernoulli": {"clip": 2.0, "precondition": 120.0, "burn_in": 0.2,
                       "initial_variance": float(softplus(-4.0) ** 2)},
    "dirichlet_categorical": {"clip": float(np.sqrt(2.0)), "precondition": 100.0, "burn_in": 0.2,
                              "initial_variance": float(softplus(-6.0) ** 2)},
}


def settings_of(name: str, args) -> dict:
    """DP-VI's settings for model ``name``: DEFAULTS, the model's SETTINGS, then the command line's
    (``args``; a script without one of these options keeps the model's)."""
    chosen = AUTHORS_SETTINGS if getattr(args, "settings", "ours") == "authors" else SETTINGS
    if name not in chosen:
        raise ValueError(f"--settings {args.settings}: no settings for {name}")
    out = {**DEFAULTS, **chosen[name]}
    for key in ("clip", "lambda_c", "precondition", "burn_in", "q_scale"):
        if getattr(args, key, None) is not None:
            out[key] = getattr(args, key)
    if out["initial_variance"] is None:
        out["initial_variance"] = 1 / args.rows
    return out


def build(name: str, settings: str = "ours"):
    """The model, and a simulator (rng, n) -> (data, true parameter values) drawing theta from the prior
    (``settings``: whose prior for the exponential families, PRIORS)."""
    prior = PRIORS[settings].get(name)
    if name == "gamma_exponential":
        shape, rate_of_rate = prior
        model = rs.location("exponential", priors={"rate": f"gamma({shape:g}, {rate_of_rate:g})"}, standardize=False)

        def simulate(rng, n):
            rate = rng.gamma(shape, 1 / rate_of_rate)
            return {"y": rng.exponential(1 / rate, n)}, {"rate": rate}
    elif name == "beta_bernoulli":
        a, b = prior
        model = rs.custom("bernoulli", parameters="real<lower=0, upper=1> p;", priors=f"p ~ beta({a:g}, {b:g});",
                          eta="logit(p)", title="Beta-Bernoulli")

        def simulate(rng, n):
            p = rng.beta(a, b)
            return {"y": (rng.random(n) < p).astype(int)}, {"p": p}
    elif name == "dirichlet_categorical":
        model = rs.custom("categorical", parameters="simplex[3] p;", priors=f"p ~ dirichlet(rep_vector({prior:g}, 3));",
                          eta="log(p)'", title="Dirichlet-categorical")

        def simulate(rng, n):
            p = rng.dirichlet([prior] * 3)
            return {"y": rng.choice(3, n, p=p) + 1, "K": 3}, {"p": p}
    elif name == "linear_regression":
        model = rs.custom("normal", data="int<lower=1> P; matrix[N, P] X;",
                          parameters="vector[P + 1] w; real<lower=0> sigma2;",
                          priors="sigma2 ~ inv_gamma(20, 0.5); w ~ normal(0, 2 * sqrt(sigma2));",
                          mu="X[n] * w[1:P] + w[P + 1]", sigma="sqrt(sigma2)",
                          vectorised={"mu": "X * w[1:P] + w[P + 1]"}, title="linear regression, N-inv-gamma prior")

        def simulate(rng, n):
            sigma2 = 1 / rng.gamma(20.0, 1 / 0.5)
            w = rng.normal(0, 2 * np.sqrt(sigma2), 11)
            X = rng.normal(size=(n, 10))
            return {"P": 10, "X": X, "y": X @ w[:10] + w[10] + rng.normal(0, np.sqrt(sigma2), n)}, {"w": w, "sigma2": sigma2}
    else:
        raise ValueError(name)
    return model, simulate


class SimulatedRelease(NamedTuple):
    """Data set k of a cell: the model, the data, the true theta, a reference point drawn from the
    prior, DP-VI's release on the data, the burn-in the settings give and DP-VI's seconds."""

    model: object
    data: dict
    truth: dict
    reference: dict
    release: object
    burn_in: float
    seconds: float


def simulated_release(name: str, epsilon: float, repeat: int, k: int, args) -> SimulatedRelease:
    """Data set k of repeat ``repeat`` at ``epsilon`` and DP-VI's release on it (settings_of(name, args);
    T and kappa from ``args`` or the paper's 10^4 and 0.1). The seeds depend on these four alone, so
    every script that calls this rebuilds the same data set and release."""
    model, simulate = build(name, getattr(args, "settings", "ours"))
    rng = np.random.default_rng([k, repeat, int(1000 * epsilon), sum(map(ord, name))])
    data, truth = simulate(rng, args.rows)
    _, reference = simulate(rng, 1)
    settings = settings_of(name, args)
    burn_in = settings.pop("burn_in")
    # seed=k makes the study reproducible; a release with a seed written here is not private
    fit = rs.dpvi(model, data, epsilon=epsilon, steps=getattr(args, "steps", 10_000),
                  sampling_rate=getattr(args, "kappa", 0.1), seed=k, show_progress=False, **settings)
    return SimulatedRelease(model, data, truth, reference, fit.release, burn_in, fit.seconds)


def one_data_set(name: str, epsilon: float, repeat: int, k: int, args) -> dict:
    """DP-VI on data set k, and each method's unconstrained draws, the truth and a reference point."""
    warnings.simplefilter("ignore")
    simulated = simulated_release(name, epsilon, repeat, k, args)
    release, burn_in = simulated.release, simulated.burn_in
    draws, convergence = {}, {}
    for prior in getattr(args, "phi_star_priors", ["unit"]):
        suffix = PHI_STAR_PRIOR_LABELS[prior]
        nuts = rs.noise_aware(release, burn_in, method="nuts", iter_sampling=2000, iter_warmup=1000, seed=k,
                              phi_star_prior=prior)
        draws["noise-aware NUTS" + suffix] = nuts
        draws["noise-aware Laplace" + suffix] = rs.noise_aware(release, burn_in, method="laplace", iter_sampling=2000,
                                                               seed=k, phi_star_prior=prior)
        convergence.update({"trace_r_hat_max" + suffix: float(nuts.trace_summary["r_hat"].max()),
                            "trace_ess_bulk_min" + suffix: float(nuts.trace_summary["ess_bulk"].min())})
        check = rs.check_trace_model(nuts)  # the per-coordinate predictive check a user can run on the release
        convergence.update({f"check_p{suffix}[{name}]": p for name, p in check["p_value"].items()})
    draws["last iterate"] = rs.dpvi_baseline(release, "last_iterate", draws=4000, seed=k)
    draws["DPVIm"] = rs.dpvi_baseline(release, "averaged", burn_in, draws=4000, seed=k)
    dimension = release.iterates.shape[1] // 2
    post_burn_in = release.iterates[burn_in_steps(burn_in, release.steps):release.steps]
    trace_mean = post_burn_in[:, :dimension].mean(axis=0)  # DPVIm's mean
    return {"model": name, "epsilon": epsilon, "repeat": repeat, "k": k, "truth": release.unconstrain(simulated.truth),
            "reference": release.unconstrain(simulated.reference), "trace_mean": trace_mean,
            "seconds": simulated.seconds, **convergence,
            "draws": {m: d.unconstrained.reshape(-1, d.unconstrained.shape[-1]) for m, d in draws.items()}}


def trace_references(draws, trace_means, rng, scale=4.0):
    """The authors' code's reference points (coverage_tools.py): theta_ref(xi) = the mean of the
    post-burn-in mu iterates plus U(-4 sd, 4 sd) per coordinate, sd that of the method's draws;
    a function of the release (H.4's theta_ref(xi_i)) and of independent noise."""
    half_range = scale * draws.std(axis=1)
    return trace_means + rng.uniform(-half_range, half_range)


def bootstrap_rmse(draws, truths, references, rng, repeats=200) -> tuple[float, float]:
    rmse = coverage_rmse(*tarp_coverage(draws, truths, references, ALPHAS))
    k = len(truths)
    boots = []
    for _ in range(repeats):
        pick = rng.integers(0, k, k)
        boots.append(coverage_rmse(*tarp_coverage(draws[pick], truths[pick], references[pick], ALPHAS)))
    return rmse, float(np.std(boots, ddof=1))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experiment", choices=sorted(EXPERIMENTS), default="exponential_families")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.1])
    parser.add_argument("--datasets", type=int, default=100, help="K, simulated data sets per cell and repeat")
    parser.add_argument("--repeats", type=int, default=1, help="independent TARP studies per cell (the paper: 20)")
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--kappa", type=float, default=0.1)
    parser.add_argument("--precondition", type=float, default=None, help="beta_u (default: SETTINGS, per model)")
    parser.add_argument("--lambda-c", type=float, default=None,
                        help="lambda_c of the step size lambda_heur (eq. A58; default: SETTINGS, per model)")
    parser.add_argument("--burn-in", type=float, default=None, help="T* as a share of T (default: SETTINGS, per model)")
    parser.add_argument("--models", nargs="+", default=None, help="a subset of the experiment's models")
    parser.add_argument("--clip", type=float, default=None, help="C for every model (default: SETTINGS, per model)")
    parser.add_argument("--settings", choices=("ours", "authors"), default="ours",
                        help="the exponential families' priors and DP-VI settings: ours, or the authors' code's")
    parser.add_argument("--reference-redraws", type=int, default=1,
                        help="draws of the trace reference's jitter per data set (the authors' code: 20): rmse is "
                             "the mean of their RMSEs (what a calibrated posterior's reference describes), "
                             "rmse_of_mean_curve the RMSE of their mean coverage curve (the plotted one; smaller); "
                             "the bootstrap sd is the first draw's")
    parser.add_argument("--q-scale", choices=("variance", "sd"), default=None,
                        help="what softplus(u) is: q's variance (the paper's text, robust-stan's default) or sd "
                             "(the authors' code)")
    parser.add_argument("--phi-star-priors", nargs="+", choices=sorted(PHI_STAR_PRIOR_LABELS), default=["unit"],
                        help="phi*'s prior sd in the noise-aware posterior (rs.noise_aware's phi_star_prior): 'unit' "
                             "(eq. A61 as printed) and/or 'trace_sd' (the authors' code); each is scored on the "
                             "same releases")
    parser.add_argument("--workers", type=int, default=2)
    add_address_argument(parser)
    parser.add_argument("--out", default=None, help="folder under examples/results")
    parser.add_argument("--resummarise", type=Path, default=None, metavar="FOLDER",
                        help="only rewrite FOLDER's marginal_summary.csv from its marginals.csv")
    args = parser.parse_args(argv)
    if args.resummarise is not None:
        print(summarise_marginals(pd.read_csv(args.resummarise / "marginals.csv"), args.resummarise).to_string())
        return
    if args.reference_redraws < 1:
        parser.error(f"--reference-redraws: must be at least 1, got {args.reference_redraws}")
    out = OUT / (args.out or f"dpvi_{args.experiment}")
    out.mkdir(parents=True, exist_ok=True)
    models = args.models or EXPERIMENTS[args.experiment]
    for name in models:  # compile once, before the workers load the cache
        build(name, args.settings)[0].compile()
    tasks = [(name, eps, r, k) for name in models for eps in args.epsilons
             for r in range(args.repeats) for k in range(args.datasets)]
    start = time.perf_counter()
    results = []
    with cluster_pool(args.workers, args.address) as pool:
        futures = [pool.submit(one_data_set, *task, args) for task in tasks]
        for i, future in enumerate(futures):
            results.append(future.result())
            if (i + 1) % 10 == 0:
                print(f"{i + 1}/{len(tasks)} data sets, {time.perf_counter() - start:.0f} s", flush=True)
    rng, subset_rng = np.random.default_rng(0), np.random.default_rng(1)
    rows, curves = [], []
    for (name, eps, repeat), group in pd.DataFrame(results).groupby(["model", "epsilon", "repeat"], sort=False):
        truths, prior_references = np.stack(group["truth"]), np.stack(group["reference"])
        for method in group["draws"].iloc[0]:
            draws = np.stack([d[method] for d in group["draws"]])
            trace_means = np.stack(group["trace_mean"])
            references = {"prior": [prior_references],
                          "trace": [trace_references(draws, trace_means, rng) for _ in range(args.reference_redraws)]}
            subsets = {"all": (slice(None), rng), **{subset: (index, subset_rng)
                                                      for subset, index in COORDINATE_SUBSETS.get(name, {}).items()}}
            for reference, redraws in references.items():
                # every subset is scored with the same reference draws (sliced); its bootstrap has its own
                # generator, so the all-coordinates figures do not depend on which subsets are scored
                for coordinates, (index, bootstrap_rng) in subsets.items():
                    sub_draws, sub_truths = draws[..., index], truths[:, index]
                    sub_redraws = [points[:, index] for points in redraws]
                    _, se = bootstrap_rmse(sub_draws, sub_truths, sub_redraws[0], bootstrap_rng)
                    coverages = [tarp_coverage(sub_draws, sub_truths, points, ALPHAS)[1] for points in sub_redraws]
                    mean_curve = np.mean(coverages, axis=0)
                    rmses = [coverage_rmse(ALPHAS, coverage) for coverage in coverages]
                    rows.append({"model": name, "epsilon": eps, "repeat": repeat, "reference": reference,
                                 "method": method, "coordinates": coordinates,
                                 "rmse": float(np.mean(rmses)), "rmse_bootstrap_se": se,
                                 "rmse_sd_over_reference_redraws":
                                     float(np.std(rmses, ddof=1)) if len(rmses) > 1 else np.nan,
                                 "rmse_of_mean_curve": coverage_rmse(ALPHAS, mean_curve),
                                 "reference_redraws": len(rmses), "datasets": len(group),
                                 "dpvi_seconds": group["seconds"].median()})
                    curves.append(pd.DataFrame({"model": name, "epsilon": eps, "repeat": repeat,
                                                "reference": reference, "method": method,
                                                "coordinates": coordinates, "alpha": ALPHAS,
                                                "coverage": mean_curve}))
    per_repeat = pd.DataFrame(rows)
    per_repeat.to_csv(out / "repeats.csv", index=False)
    rows = []
    for (name, eps, reference, method, coordinates), g in per_repeat.groupby(
            ["model", "epsilon", "reference", "method", "coordinates"], sort=False):
        # what a perfectly calibrated posterior scores on this many data sets (the paper's K = 500: 0.017)
        calibrated = calibrated_rmse_reference(int(g["datasets"].iloc[0]), ALPHAS)
        rows.append({"model": name, "epsilon": eps, "reference": reference, "method": method,
                     "coordinates": coordinates, "rmse": g["rmse"].mean(),
                     "rmse_sd_over_repeats": g["rmse"].std(ddof=1) if len(g) > 1 else np.nan,
                     "rmse_bootstrap_se": g["rmse_bootstrap_se"].mean(),
                     "rmse_sd_over_reference_redraws": g["rmse_sd_over_reference_redraws"].mean(),
                     "rmse_of_mean_curve": g["rmse_of_mean_curve"].mean(), "repeats": len(g),
                     "datasets": g["datasets"].iloc[0], "calibrated_rmse_mean": calibrated["mean"],
                     "calibrated_rmse_q95": calibrated["q95"], "calibrated_rmse_q99": calibrated["q99"],
                     "dpvi_seconds": g["dpvi_seconds"].median()})
    table = pd.DataFrame(rows)
    table.to_csv(out / "table.csv", index=False)
    pd.concat(curves).to_csv(out / "runs.csv", index=False)
    print(table.to_string(index=False))
    plot(pd.concat(curves).query("repeat == 0 and coordinates == 'all'"), out)
    marginal_checks(results, out)
    convergence = pd.DataFrame(results).drop(columns=["truth", "reference", "trace_mean", "seconds", "draws"])
    convergence.to_csv(out / "convergence.csv", index=False)  # the trace model's NUTS, per data set
    for prior in args.phi_star_priors:
        suffix = PHI_STAR_PRIOR_LABELS[prior]
        r_hat, ess = convergence["trace_r_hat_max" + suffix], convergence["trace_ess_bulk_min" + suffix]
        print(f"trace model's NUTS{suffix}: R-hat above 1.01 on", int((r_hat > 1.01).sum()), "of",
              len(convergence), "data sets; smallest bulk ESS", round(ess.min()))


def marginal_checks(results: list[dict], out: Path) -> pd.DataFrame:
    """Each coordinate's calibration on its own, beside TARP's joint test: per data set the truth's
    PIT (the share of a method's unconstrained draws below it; uniform on [0, 1] for a calibrated
    posterior) and z-score (truth - mean) / sd. Writes marginals.csv (one row per data set, method
    and coordinate) and the summary of ``summarise_marginals``."""
    rows = []
    for result in results:
        for method, draws in result["draws"].items():
            pit = (draws < result["truth"]).mean(axis=0)
            z = (result["truth"] - draws.mean(axis=0)) / draws.std(axis=0)
            rows += [{"model": result["model"], "epsilon": result["epsilon"], "repeat": result["repeat"],
                      "k": result["k"], "method": method, "coordinate": j, "pit": pit[j], "z": z[j]}
                     for j in range(pit.size)]
    marginals = pd.DataFrame(rows)
    marginals.to_csv(out / "marginals.csv", index=False)
    return summarise_marginals(marginals, out)


def summarise_marginals(marginals: pd.DataFrame, out: Path) -> pd.DataFrame:
    """marginal_summary.csv: per cell, method and coordinate, the mean and sd of z (0 and 1 for a
    calibrated normal posterior), the Kolmogorov-Smirnov distance of the PITs from uniform with its
    p-value, and ``central_coverage_rmse``: the coverage RMSE (eq. 27) of central credible intervals,
    whose f_k = |2 PIT - 1| (one-dimensional TARP with the reference at the median), to be read
    against table.csv's calibrated_rmse_* at the same K."""
    from scipy import stats

    summary = []
    for key, g in marginals.groupby(["model", "epsilon", "method", "coordinate"], sort=False):
        ks = stats.kstest(g["pit"], "uniform")
        central = coverage_curve(np.abs(2.0 * g["pit"].to_numpy() - 1.0), ALPHAS)
        summary.append(dict(zip(["model", "epsilon", "method", "coordinate"], key), datasets=len(g),
                            z_mean=g["z"].mean(), z_sd=g["z"].std(ddof=1), ks_distance=ks.statistic,
                            ks_p_value=ks.pvalue, central_coverage_rmse=coverage_rmse(ALPHAS, central)))
    summary = pd.DataFrame(summary)
    summary.to_csv(out / "marginal_summary.csv", index=False)
    return summary


def plot(curves: pd.DataFrame, out: Path) -> None:
    """Coverage curves, one column per (model, epsilon), one row per kind of reference point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = list(curves.groupby(["model", "epsilon"], sort=False).groups)
    references = list(curves["reference"].unique())
    fig, axes = plt.subplots(len(references), len(cells), figsize=(4 * len(cells), 3.6 * len(references)),
                             squeeze=False)
    for row, reference in enumerate(references):
        for ax, (name, eps) in zip(axes[row], cells):
            for method in curves["method"].unique():
                sub = curves[(curves.model == name) & (curves.epsilon == eps) & (curves.method == method)
                             & (curves.reference == reference)]
                ax.plot(1 - sub["alpha"], sub["coverage"], label=method)
            ax.plot([0, 1], [0, 1], color="grey", linestyle=":")
            ax.set_title(f"{name}, epsilon {eps:g}, reference: {reference}", fontsize=9)
            ax.set_xlabel("credibility 1 - alpha")
        axes[row, 0].set_ylabel("expected coverage (TARP)")
    axes[0, -1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "coverage.png", dpi=120)


if __name__ == "__main__":
    main()
