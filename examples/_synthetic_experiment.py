"""Shared runner for the synthetic Rob-ULA experiments of Bhatia et al. (2019), section 6.

A *problem* module (rob_ula_mean_estimation.py, rob_ula_linear_regression.py)
supplies ``model(prior)``, ``simulate(d, n_clean, eps, rng)`` returning
``(theta, data, held_out)`` and ``held_out_loglik(held_out, theta_hat)``. This
module runs Rob-ULA with the paper's estimator (``lrv``), its truncation once (``lrv_once``),
the coordinate-wise trimmed mean (``trimmed_mean``, the default before issue 51), the library's
default (``row_trimmed_mean``), and ULA (``mean``), on each simulated data set, with the library's
default warmup (start at the mode, dense metric) and the given burn-in and draws;
optionally the NUTS beta posterior too; in parallel processes; and writes runs.csv,
summary.csv and a figure. Under the flat prior, ``clean_posterior_mean(data, n_clean)`` of
the problem module gives the exact posterior mean given the clean rows only (row "clean
rows, exact"), the error a perfectly robust sampler would have. Metric: ||mean of the samples - theta||_2
and the average held-out log-likelihood at the posterior mean.
"""

from __future__ import annotations

import argparse
import importlib
import time
from pathlib import Path

import numpy as np
import pandas as pd

import robust_stan as rs
from _cluster import add_address_argument, cluster_pool

SAMPLERS = (("Rob-ULA lrv", "lrv"), ("Rob-ULA lrv_once", "lrv_once"), ("Rob-ULA trimmed_mean", "trimmed_mean"),
            ("Rob-ULA row_trimmed_mean", "row_trimmed_mean"), ("ULA", "mean"))


WARMUPS = {
    "library": {},                                      # start at the (trimmed) mode, dense metric
    "paper": {"inits": "random", "metric": "unit"},     # the paper's: a random start, no preconditioner
}


def run_once(problem_name: str, prior: str, d: int, n_clean: int, eps: float, warmup: int, iters: int,
             nuts_beta: float | None, seed: int, warmup_protocol: str = "library",
             estimators: tuple[str, ...] | None = None) -> list[dict]:
    """One simulated data set; a row per sampler (those of ``estimators`` only, when given)."""
    problem = importlib.import_module(problem_name)
    model = problem.model(prior)  # compiled by main(); loads from the cache here
    rng = np.random.default_rng(seed)
    theta, data, held_out = problem.simulate(d, n_clean, eps, rng)

    def row(sampler: str, estimate: np.ndarray, seconds: float, step_size: float = np.nan) -> dict:
        return {"sampler": sampler, "d": d, "n_clean": n_clean, "eps": eps, "seed": seed,
                "error": float(np.linalg.norm(estimate - theta)),
                "held_out_loglik": problem.held_out_loglik(held_out, estimate),
                "seconds": seconds, "step_size": step_size}

    rows = []
    for sampler, estimator in SAMPLERS:
        if estimators is not None and estimator not in estimators:
            continue
        start = time.perf_counter()
        fit = rs.rob_ula(model, data, contamination=eps, estimator=estimator, iter_sampling=iters,
                         iter_warmup=warmup, chains=1,
                         **WARMUPS[warmup_protocol],
                         seed=seed, show_progress=False, log_density=False)
        estimate = fit.draws("theta").reshape(-1, d).mean(axis=0)
        rows.append(row(sampler, estimate, time.perf_counter() - start, fit.settings.step_size))
    if prior == "flat":  # the exact clean posterior: what a perfectly robust sampler would centre on
        rows.append(row("clean rows, exact", problem.clean_posterior_mean(data, n_clean), 0.0))
    if nuts_beta:
        start = time.perf_counter()
        fit = model.sample(data, rs.BetaD(nuts_beta), chains=1, iter_warmup=max(warmup, 200), iter_sampling=iters,
                           seed=seed, show_progress=False)
        estimate = fit.draws("theta").reshape(-1, d).mean(axis=0)
        rows.append(row(f"NUTS beta={nuts_beta:g}", estimate, time.perf_counter() - start))
    return rows


def settings_to_run(args) -> list[tuple[int, int, float]]:
    """(d, n_clean, eps) for the defaults, or for one of the sweeps around them."""
    if args.sweep == "d":
        return [(d, args.n_clean, args.eps) for d in (25, 50, 100, 200)]
    if args.sweep == "n":
        return [(args.d, n, args.eps) for n in (250, 500, 1000, 2000)]
    if args.sweep == "eps":
        return [(args.d, args.n_clean, e) for e in (0.05, 0.1, 0.2, 0.3)]
    return [(args.d, args.n_clean, args.eps)]


def main(problem_name: str, description: str, warmup: int, iters: int, argv=None) -> pd.DataFrame:
    """Parse the command line, run every setting ``--runs`` times, write and print the results."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d", type=int, default=200)
    parser.add_argument("--n-clean", type=int, default=1000)
    parser.add_argument("--eps", type=float, default=0.2)
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--iters", type=int, default=iters)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--sweep", choices=("none", "d", "n", "eps"), default="none",
                        help="vary one setting around the others")
    parser.add_argument("--prior", choices=("flat", "box"), default="flat")
    parser.add_argument("--nuts-beta", type=float, default=None,
                        help="also sample the beta posterior with NUTS (1 chain; costly at large d); "
                             "needs --prior box")
    parser.add_argument("--warmup-protocol", choices=tuple(WARMUPS), default="library",
                        help="library: start at the mode with a dense metric (rob_ula's default); paper: a random "
                             "start and the unit metric, as the paper runs it")
    parser.add_argument("--estimators", nargs="+", choices=[e for _, e in SAMPLERS], default=[e for _, e in SAMPLERS],
                        help="run only these samplers (by estimator; mean = ULA)")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel processes")
    add_address_argument(parser)
    parser.add_argument("--out", default=problem_name)
    args = parser.parse_args(argv)
    if args.nuts_beta and args.prior == "flat":
        # The beta loss is bounded in theta, so exp(-loss) tends to a constant far from
        # the data: with a flat prior the beta posterior is improper and NUTS drifts off.
        parser.error("--nuts-beta: the beta posterior is improper under the flat prior (the beta loss is "
                     "bounded); add --prior box")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    importlib.import_module(problem_name).model(args.prior).compile()
    tasks = [(problem_name, args.prior, d, n, e, args.warmup, args.iters, args.nuts_beta, run, args.warmup_protocol,
              tuple(args.estimators))
             for d, n, e in settings_to_run(args) for run in range(args.runs)]
    rows = []
    with cluster_pool(args.jobs, args.address) as pool:
        for task, result in zip(tasks, pool.map(run_once, *zip(*tasks))):
            rows += result
            print(f"d {task[2]}, n_clean {task[3]}, eps {task[4]}, run {task[8] + 1}: "
                  + ", ".join(f"{r['sampler']} error {r['error']:.3f}" for r in result), flush=True)
    table = pd.DataFrame(rows)
    table.to_csv(out / "runs.csv", index=False)
    keys = ["d", "n_clean", "eps", "sampler"]
    summary = table.groupby(keys)[["error", "held_out_loglik", "seconds"]].agg(["mean", "std"])
    summary.to_csv(out / "summary.csv")
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(f"\n{args.runs} runs per setting, prior {args.prior}, {args.warmup} burn-in + {args.iters} draws, "
              f"{args.warmup_protocol} warmup\n"
              f"{summary}")
    errors = table.pivot_table(index=keys[:3], columns="sampler", values="error", aggfunc="mean")
    for setting, row in errors.iterrows():
        for sampler, estimator in SAMPLERS[:-1]:
            if estimator not in args.estimators or "ULA" not in row:
                continue
            print(f"RATIO {sampler} error / ULA error at (d, n_clean, eps) = {setting}: "
                  f"{row[sampler] / row['ULA']:.3f}")
    plot(table, args, out / "errors.png")
    print(f"wrote {out / 'runs.csv'}, {out / 'summary.csv'}, {out / 'errors.png'}")
    return table


def plot(table: pd.DataFrame, args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    varied = {"d": "d", "n": "n_clean", "eps": "eps"}.get(args.sweep)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, group in table.groupby("sampler"):
        if varied:
            by = group.groupby(varied)["error"].agg(["mean", "std"])
            ax.errorbar(by.index, by["mean"], yerr=by["std"], marker="o", capsize=3, label=name)
            ax.set_xlabel(varied)
        else:
            ax.scatter(group["seed"] + 1, group["error"], label=name)
            ax.set_xlabel("run")
    ax.set_ylabel(r"$\|\bar\theta - \theta\|_2$")
    ax.set_yscale("log")
    ax.set_title(f"{args.out}: {args.prior} prior")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
