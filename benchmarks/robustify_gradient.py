"""Gradient cost of a robustified program against the same model built by robust-stan (target: at
most 1.5x), for normal, logistic and Poisson regressions, all through robust-stan's C interface;
then the cost of all N per-example gradients of the robustified program (weights as parameters,
mixed second derivatives by forward over reverse mode: d sweeps), against one gradient of it,
against the built-in model's per-example call (one call of its linear-predictor mode), and
against the method it replaces (one gradient per row; timed on 20 rows, scaled to N).

The robustified programs are tests/stan_programs/{linear,logistic}_regression.stan and
poisson_offset.stan (exposure 1); the built-in ones rs.glm(...) with the outcome on its own
scale. Calls alternate between the two programs so drifts of the machine hit both alike.

    python benchmarks/robustify_gradient.py [--n 2000] [--p 10] [--beta 0.3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

import robust_stan as rs
from _timing import median_seconds  # the script's own folder is on the path

PROGRAMS = Path(__file__).resolve().parents[1] / "tests" / "stan_programs"


def alternating_microseconds(natives, calls: int) -> list[float]:
    """Median microseconds of one gradient of each native model, the models' calls alternating."""
    theta = [np.random.default_rng(0).normal(scale=0.1, size=native.dimension) for native in natives]
    spent = [[] for _ in natives]
    for _ in range(calls):
        for k, native in enumerate(natives):
            start = time.perf_counter()
            native.log_density_gradient(theta[k])
            spent[k].append(time.perf_counter() - start)
    return [1e6 * statistics.median(s) for s in spent]


def cases(n: int, p: int):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(n, p)) / np.sqrt(p)
    eta = 0.5 + X @ rng.normal(size=p)
    y_normal = eta + rng.normal(size=n)
    y_normal[: n // 10] += 10  # a tenth gross outliers
    y_binary = (rng.random(n) < 1 / (1 + np.exp(-eta))).astype(int)
    y_count = rng.poisson(np.exp(eta))
    return [
        ("normal", "linear_regression", rs.glm("normal", standardize=False), {"X": X, "y": y_normal},
         {"N": n, "K": p, "X": X, "y": y_normal}),
        ("bernoulli", "logistic_regression", rs.glm("bernoulli"), {"X": X, "y": y_binary},
         {"N": n, "K": p, "X": X, "y": y_binary}),
        ("poisson", "poisson_offset", rs.glm("poisson"), {"X": X, "y": y_count},
         {"N": n, "K": p, "X": X, "exposure": np.ones(n), "y": y_count}),
    ]


def per_example_costs(args, divergence) -> None:
    print(f"\nall N = {args.n} per-example gradients, {divergence!r}; milliseconds (median of {args.repeats})")
    print(f"{'family':10s} {'one gradient':>12s} {'mixed':>8s} {'built-in':>9s} {'per row':>9s}   "
          "mixed/gradient  mixed/built-in  per-row method/mixed")
    for family, program, built_in, built_in_data, program_data in cases(args.n, args.p):
        robust = rs.robustify(PROGRAMS / f"{program}.stan", engine="httpstan")
        stan_data = robust.stan_data(program_data, divergence)
        theta = np.random.default_rng(0).normal(scale=0.1, size=robust.dimension(stan_data))
        native = robust.compile(show_progress=False).native_model(stan_data)
        mixed = robust.weight_derivative_gradients(stan_data)
        theirs = built_in.per_example(built_in_data, divergence)
        built_theta = np.random.default_rng(0).normal(scale=0.1, size=theirs.dimension)
        gradient = median_seconds(lambda: native.log_density_gradient(theta), 20 * args.repeats)
        ours = median_seconds(lambda: mixed.gradients(theta), args.repeats)
        built = median_seconds(lambda: theirs.gradients(built_theta), args.repeats)
        rows = np.arange(20)
        per_row = median_seconds(lambda: robust.per_example_gradients(program_data, theta, divergence, batch=rows,
                                                                         strategy="difference"), 3) * args.n / rows.size
        print(f"{family:10s} {1e3 * gradient:12.3f} {1e3 * ours:8.2f} {1e3 * built:9.2f} {1e3 * per_row:9.0f}   "
              f"{ours / gradient:14.1f}  {ours / built:14.1f}  {per_row / ours:20.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--p", type=int, default=10)
    parser.add_argument("--beta", type=float, default=0.3)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=20, help="timed repeats of each per-example call")
    args = parser.parse_args()
    divergence = rs.BetaD(args.beta)
    print(f"N = {args.n}, P = {args.p}, {divergence!r}; median microseconds per gradient")
    print(f"{'family':10s} {'rs.glm':>8s} {'robustify':>10s} {'ratio':>6s}  (target <= 1.5)")
    for family, program, built_in, built_in_data, program_data in cases(args.n, args.p):
        robust = rs.robustify(PROGRAMS / f"{program}.stan", engine="httpstan")
        natives = [built_in.compile(show_progress=False).native_model(built_in.stan_data(built_in_data, divergence)),
                   robust.compile(show_progress=False).native_model(robust.stan_data(program_data, divergence))]
        glm_us, robust_us = alternating_microseconds(natives, args.calls)
        print(f"{family:10s} {glm_us:8.1f} {robust_us:10.1f} {robust_us / glm_us:6.2f}")
    per_example_costs(args, divergence)


if __name__ == "__main__":
    main()
