"""Cost of one DP-VI step against one per-example gradient call of the same rows (issue 22's target).

The paper's Adult logistic regression: Adult's 30,162 training rows on their first 10
principal components, rs.glm("bernoulli", standardize=False) with b ~ N(0, 1); a
Poisson batch at kappa = 0.1 (about 3,000 rows). Prints, as medians of repeated
runs in one process:

- one per-example gradient call of a batch at one point, and at the 10 draws of a step
  (the one call a DP-VI step makes: item 1 of the issue);
- one DP-VI step: the per-example phi-gradients of the batch from 10 draws of q (that
  call and 10 prior-gradient calls), clipping, noise and the update; the target is at
  most 3 per-example calls, printed against both calls;
- the same step at 1 draw, to split the cost between the draws and the rest;
- the step's random numbers (the Poisson batch, the draws of q and the noise) from a private
  run's ChaCha20 with 4 normals per noise value, against a seeded run's PCG64 with one.

The steps draw from ChaCha20 with 4 normals per noise value, as a private run does.

Every timed call gets a fresh Poisson batch, as DP-VI's steps do (each batch's program
instance is built for its rows: part of the cost of a step).

    python benchmarks/dpvi_step.py [--draws 10] [--kappa 0.1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import robust_stan as rs
from robust_stan.building.data import with_switches
from robust_stan.methods.dpvi.mechanism import PerExampleObjective, clip_rows, noisy_gradient, poisson_batch
from robust_stan.methods.dpvi.randomness import PRIVATE_NORMAL_DRAWS, chacha_generator, fresh_key, private_normal

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from _coreset_data import load_adult
from _timing import median_seconds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draws", type=int, default=10)
    parser.add_argument("--kappa", type=float, default=0.1)
    args = parser.parse_args(argv)
    X, y, _, _ = load_adult()
    model = rs.glm("bernoulli", standardize=False)
    model.compile()
    data = {"X": X, "y": y, "prior_scale_b": np.ones(X.shape[1])}
    prepared = model.prepare(data)
    per_example = model.per_example(data)
    prior = model.oracle_for(with_switches(prepared.stan_data, mode="prior"))
    objective = PerExampleObjective(per_example, prior, len(y))
    n = objective.dimension
    rng = chacha_generator(fresh_key())
    phi = np.concatenate([rng.normal(0, 0.1, n), np.full(n, -3.0)])
    thetas = objective.draws(phi, rng.standard_normal((args.draws, n)))
    beta = np.ones(2 * n)

    def batch():
        return poisson_batch(rng, len(y), args.kappa)

    def step(draws):
        eps = rng.standard_normal((draws, n))
        clipped = clip_rows(objective.gradients(phi, eps, batch()) * beta, 1.0).sum(axis=0)
        return phi - 1e-4 * beta * noisy_gradient(clipped, 3.0, beta, rng, PRIVATE_NORMAL_DRAWS)

    def step_randomness(generator, normal_draws):
        poisson_batch(generator, len(y), args.kappa)
        generator.standard_normal((args.draws, n))
        private_normal(generator, 2 * n, normal_draws)

    one_point = median_seconds(lambda: per_example.gradients(phi[:n], batch()))
    all_draws = median_seconds(lambda: per_example.gradients_many(thetas, batch()))
    full_step = median_seconds(lambda: step(args.draws))
    single = median_seconds(lambda: step(1))
    private = median_seconds(lambda: step_randomness(rng, PRIVATE_NORMAL_DRAWS))
    seeded_rng = np.random.default_rng(0)
    seeded = median_seconds(lambda: step_randomness(seeded_rng, 1))
    rows = int(round(args.kappa * len(y)))
    print(f"Adult logistic, about {rows} rows per batch (kappa {args.kappa}), {n} parameters")
    print(f"one per-example call, 1 point:         {1e3 * one_point:8.2f} ms")
    print(f"one per-example call, {args.draws:2d} points:        {1e3 * all_draws:8.2f} ms  "
          f"({all_draws / one_point:.2f} x 1 point)")
    print(f"one DP-VI step, {args.draws:2d} draws:             {1e3 * full_step:8.2f} ms  "
          f"= {full_step / all_draws:.2f} x the step's own per-example call (target <= 3: "
          f"{'met' if full_step <= 3 * all_draws else 'MISSED'}), {full_step / one_point:.2f} x a 1-point call "
          f"({'met' if full_step <= 3 * one_point else 'MISSED'})")
    print(f"one DP-VI step,  1 draw:               {1e3 * single:8.2f} ms  = {single / one_point:.2f} x a 1-point call")
    print(f"a step's random numbers, private:      {1e3 * private:8.3f} ms  = {private / seeded:.2f} x a seeded run's, "
          f"{private / full_step:.4f} of the step")


if __name__ == "__main__":
    main()
