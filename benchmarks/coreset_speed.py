"""Speed of beta-Cores on the Adult logistic model (issue 21's targets), one run, ratios printed.

Adult, 30,162 training rows on their first 10 principal components, rs.glm("bernoulli")
with b ~ N(0, 1) (prior_scale_b = 1); beta-Cores with beta = 0.5, Laplace sampler,
S = 100 draws, select batch B = 1000, optimisation batch B' = 200, T = 100 steps per
point, 100 points. Prints

- the wall time of the whole construction (target: under 5 minutes on two cores);
- the gains of B rows at S draws (one generated-quantities call) against one
  full-data gradient call of the same program (target: at most 3 gradient calls);
- the time per weight step, split into drawing (Laplace fit and constrain calls)
  and gains.

    python benchmarks/coreset_speed.py [--size 100] [--iters 100]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import robust_stan as rs
from robust_stan.methods.coresets.targets import CoresetTarget

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from _coreset_data import load_adult
from _timing import median_seconds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--select-batch", type=int, default=1000)
    parser.add_argument("--opt-batch", type=int, default=200)
    parser.add_argument("--beta", type=float, default=0.5)
    args = parser.parse_args(argv)

    X, y, _, _ = load_adult()
    data = {"X": X, "y": y, "prior_scale_b": np.ones(X.shape[1])}
    model = rs.glm("bernoulli", standardize=False)
    model.compile(show_progress=False)
    divergence = rs.BetaD(args.beta)
    prepared = model.prepare(data, divergence)

    # the gains of B rows at S draws against one full-data gradient
    target = CoresetTarget(model, prepared.stan_data, divergence, "beta", "laplace")
    rng = np.random.default_rng(0)
    support = rng.choice(len(y), 50, replace=False)
    weights = np.full(50, len(y) / 50)
    draws = target.draw(support, weights, args.draws, rng)
    batch = rng.choice(len(y), args.select_batch, replace=False)
    gains = median_seconds(lambda: target.gains(batch, draws))
    oracle = model.oracle_for(prepared.stan_data)
    theta = np.zeros(oracle.dimension)
    gradient = median_seconds(lambda: oracle.log_density_gradient(theta), repeats=21)
    draw = median_seconds(lambda: target.draw(support, weights * (1 + 1e-9 * rng.random()), args.draws, rng))
    print(f"N = {len(y)}, d = {oracle.dimension}, S = {args.draws}, B = {args.select_batch}")
    print(f"gains of B rows at S draws, one call: {gains * 1e3:.1f} ms; full-data gradient: {gradient * 1e3:.2f} ms")
    ratio = gains / gradient
    print(f"RATIO gains / full-data gradient = {ratio:.2f} (target <= 3: {'met' if ratio <= 3 else 'MISSED'})")
    print(f"one Laplace draw of S = {args.draws} on 50 coreset rows (L-BFGS, Hessian, constrain): {draw * 1e3:.1f} ms")

    start = time.perf_counter()
    coreset = rs.coreset(model, data, size=args.size, method="beta_cores", divergence=divergence, draws=args.draws,
                         iters_per_point=args.iters, select_batch=args.select_batch, opt_batch=args.opt_batch,
                         sampler="laplace", seed=1, show_progress=True)
    seconds = time.perf_counter() - start
    steps = args.size * (args.iters + 1) + 1
    print(f"{coreset}: built in {seconds:.0f} s, {steps} steps, {seconds / steps * 1e3:.1f} ms per step")
    print(f"RATIO construction / 5 minutes = {seconds / 300:.2f} (target <= 1: {'met' if seconds <= 300 else 'MISSED'})")


if __name__ == "__main__":
    main()
