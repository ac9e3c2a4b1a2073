"""ESS per second of the beta-divergence posterior against the ordinary (KL) posterior.

Same normal glm (one compiled program), same engine, same data, seeds and NUTS
settings; only the divergence (program data) differs. The data are simulated:
N rows, K standard-normal predictors, y = 1 + X b + N(0, 1) noise, and a
fraction of rows (10% by default) turned into gross outliers by adding
+10 (ten noise sds) to y.

ESS/s = min over parameters (alpha, b[1..K], sigma) of ess_bulk, divided by the
NUTS wall time of the run (``fit.raw.seconds["total"]``: warmup + sampling, all
chains running concurrently). The time per leapfrog step (wall time / total
leapfrog steps of the sampling draws) separates the cost of a gradient from
the geometry (steps per draw). Target: ESS/s ratio beta / KL >= 0.5.

This is a benchmark, not a test: it prints ratios measured in one run.

    python benchmarks/ess_per_second.py [--n 2000] [--k 10] [--beta 0.3] [--chains 4]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import robust_stan as rs


def simulate(n: int, k: int, outlier_frac: float, shift: float, seed: int):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, k))
    b = rng.normal(0, 0.5, size=k)
    y = 1.0 + X @ b + rng.normal(size=n)
    outliers = rng.choice(n, size=int(round(outlier_frac * n)), replace=False)
    y[outliers] += shift
    return {"X": X, "y": y}, b, outliers


def run(model, data, divergence, args) -> dict:
    fit = model.sample(data, divergence=divergence, chains=args.chains, iter_warmup=args.warmup,
                       iter_sampling=args.sampling, seed=args.seed, show_progress=False)
    summary = fit.summary()
    seconds = fit.raw.seconds["total"]
    worst = summary["ess_bulk"].idxmin()
    leapfrogs = float(fit.raw.sampler["n_leapfrog__"].sum())
    return {
        "fit": fit,
        "seconds": seconds,
        "min_ess": float(summary["ess_bulk"].min()),
        "worst": worst,
        "ess_per_s": float(summary["ess_bulk"].min()) / seconds,
        "leapfrog_per_draw": leapfrogs / fit.raw.sampler["n_leapfrog__"].size,
        "us_per_leapfrog": 1e6 * seconds / leapfrogs,
        "divergent": int(fit.raw.sampler["divergent__"].sum()),
        "max_rhat": float(summary["r_hat"].max()),
        "step_size": float(np.mean(fit.raw.sampler["stepsize__"][:, 0])),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="observations (default 2000)")
    parser.add_argument("--k", type=int, default=10, help="predictors (default 10)")
    parser.add_argument("--outlier-frac", type=float, default=0.10, help="fraction of gross outliers (default 0.10)")
    parser.add_argument("--shift", type=float, default=10.0, help="outlier shift, in noise sds (default 10)")
    parser.add_argument("--beta", type=float, default=0.3, help="beta of the beta divergence (default 0.3)")
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--sampling", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1, help="NUTS seed, the same for both fits (default 1)")
    parser.add_argument("--data-seed", type=int, default=2024)
    args = parser.parse_args(argv)

    data, b_true, outliers = simulate(args.n, args.k, args.outlier_frac, args.shift, args.data_seed)
    print(f"normal glm, N = {args.n}, K = {args.k}, {len(outliers)} outliers ({args.outlier_frac:.0%}, y + {args.shift:g}); "
          f"httpstan; {args.chains} chains x {args.warmup} warmup / {args.sampling} sampling, seed {args.seed}")
    model = rs.glm("normal", engine="httpstan")
    t0 = time.perf_counter()
    model.compile(show_progress=False)
    print(f"program ready in {time.perf_counter() - t0:.0f} s")

    results = {}
    for label, div in (("KL", rs.KL()), (f"beta={args.beta:g}", rs.BetaD(args.beta))):
        results[label] = run(model, data, div, args)

    header = (f"{'divergence':<11}{'seconds':>9}{'min ess_bulk':>14}{'(param)':>9}{'ESS/s':>9}"
              f"{'leapfrog/draw':>15}{'us/leapfrog*':>13}{'divergent':>11}{'max R-hat':>11}{'step':>7}{'max|b-b0|':>11}")
    print("\n" + header)
    for label, r in results.items():
        err = float(np.max(np.abs(r["fit"].posterior["b"].mean(axis=(0, 1)) - b_true)))
        print(f"{label:<11}{r['seconds']:9.1f}{r['min_ess']:14.0f}{r['worst']:>9}{r['ess_per_s']:9.1f}"
              f"{r['leapfrog_per_draw']:15.1f}{r['us_per_leapfrog']:13.0f}{r['divergent']:11d}"
              f"{r['max_rhat']:11.3f}{r['step_size']:7.3f}{err:11.3f}")
    print("* us/leapfrog = NUTS wall time (warmup + sampling, and writing the generated quantities)\n"
          "  / leapfrog steps of the sampling draws: a crude per-gradient cost, for comparing the two rows only")
    kl, beta = results["KL"], results[f"beta={args.beta:g}"]
    ratio = beta["ess_per_s"] / kl["ess_per_s"]
    print(f"\nRATIO ESS/s beta / KL = {ratio:.2f}  (target >= 0.5: {'met' if ratio >= 0.5 else 'MISSED'})")
    print(f"  of which: min-ESS ratio {beta['min_ess'] / kl['min_ess']:.2f}, wall-time ratio KL/beta "
          f"{kl['seconds'] / beta['seconds']:.2f}, cost-per-leapfrog ratio beta/KL "
          f"{beta['us_per_leapfrog'] / kl['us_per_leapfrog']:.2f}")


if __name__ == "__main__":
    main()
