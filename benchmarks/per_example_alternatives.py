"""Could another Stan program give all n per-example gradients within 3x a full gradient?

``per_example_cost.py`` measures robust-stan's per-example mode (one parameter copy per
row). This script measures, on the same problems (normal regression with the beta loss,
n = 10,000, d = 20 and n = 1,000, d = 200), the cheapest other formulation we know for a
regression, written by hand:

  linear-predictor offsets: the coefficients stay shared; each row gets its own copy of
  sigma and an offset u_i added to its linear predictor, at u = 0. One gradient call gives
  dl_i/d eta_i (the u block) and dl_i/d sigma_i; the coefficient gradients are then
  dl_i/d eta_i * x_i (the chain rule, in NumPy). n (k + 1) autodiff variables instead of n d.

Both programs are compiled by the httpstan engine and called through robust-stan's C
interface; times are medians of repeated calls, each ratio from one run. The per-example
gradients are checked against the full gradient (their sum).

    python benchmarks/per_example_alternatives.py [--repeats 21]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from robust_stan.engines import compile_program

sys.path.insert(0, str(Path(__file__).parent))
from _timing import median_seconds
from per_example_cost import problem

OFFSETS_PROGRAM = """
data {
  int<lower=1> N;
  int<lower=1> P;
  matrix[N, P] X;
  vector[N] y;
  int<lower=0, upper=1> per_example;
  real<lower=0> a;  // beta
}
transformed data {
  int n_rows = per_example ? N : 0;
  real half_log_2pi = 0.5 * log(2 * pi());
}
parameters {
  real alpha;
  vector[P] b;
  vector<lower=0>[per_example ? N : 1] sigma;
  vector[n_rows] u;
}
model {
  // minus the beta loss of every row: sum_i p_i^a / a - I_a(sigma_i) / (1 + a)
  if (per_example) {
    vector[N] log_c = -log(sigma) - half_log_2pi;
    vector[N] lp = log_c - 0.5 * square((y - (alpha + X * b + u)) ./ sigma);
    target += sum(exp(a * lp)) / a - sum(exp(a * log_c - 0.5 * log1p(a))) / (1 + a);
  } else {
    real log_c = -log(sigma[1]) - half_log_2pi;
    vector[N] lp = log_c - 0.5 * square((y - (alpha + X * b)) / sigma[1]);
    target += sum(exp(a * lp)) / a - N * exp(a * log_c - 0.5 * log1p(a)) / (1 + a);
  }
}
"""


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args(argv)
    program = compile_program(OFFSETS_PROGRAM, "httpstan")
    print("linear-predictor offsets (hand-written), beta = 0.3; median of", args.repeats, "calls\n")
    print(f"{'n':>6} {'d':>4}  {'full gradient':>14} {'per-example':>12} {'ratio':>6}")
    for n, d in ((10_000, 20), (1_000, 200)):
        data = problem(n, d)
        base = {"N": n, "P": d, "X": data["X"], "y": data["y"], "a": 0.3}
        full = program.native_model(dict(base, per_example=0))
        rows = program.native_model(dict(base, per_example=1))
        theta = np.random.default_rng(1).normal(scale=0.1, size=d + 2)  # alpha, b, log sigma

        def per_example_gradients() -> np.ndarray:
            point = np.concatenate([theta[:d + 1], np.full(n, theta[d + 1]), np.zeros(n)])
            grad = rows.log_density_gradient(point, jacobian=False)[1]
            d_sigma, d_eta = grad[d + 1:d + 1 + n], grad[d + 1 + n:]
            out = np.empty((n, d + 2))
            out[:, 0] = d_eta
            np.multiply(d_eta[:, None], data["X"], out=out[:, 1:d + 1])
            out[:, d + 1] = d_sigma
            return out

        summed = per_example_gradients().sum(axis=0)
        reference = full.log_density_gradient(theta, jacobian=False)[1]
        error = np.max(np.abs(summed - reference)) / np.max(np.abs(reference))
        t_full = median_seconds(lambda: full.log_density_gradient(theta, jacobian=False), args.repeats)
        t_rows = median_seconds(per_example_gradients, args.repeats)
        print(f"{n:>6} {d:>4}  {t_full * 1e3:>11.3f} ms {t_rows * 1e3:>9.3f} ms {t_rows / t_full:>6.2f}"
              f"   RATIO (sum of rows against the full gradient: relative error {error:.1e})")


if __name__ == "__main__":
    main()
