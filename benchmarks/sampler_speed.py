"""NUTS wall time per leapfrog step: rs.glm against a hand-written beta-loss program in pystan.

The hand-written program below (this file's own text) is the style of published
research code: the beta loss of a normal linear regression, one observation at a
time in a loop. It gets the same Stan data as robust-stan's program (outcome
standardised, the same priors), so both sample the same posterior, on the same
engine (httpstan). Three rounds alternate the two; each prints

- wall time of the whole call per leapfrog step of the kept draws (robust-stan /
  hand-written; target at most 1.0 overall and 1.2 in every round);
- the share of robust-stan's ``sample()`` spent outside the chains (parsing and
  collecting the draws; target at most 20%);

then the beta / KL (and gamma / KL) gradient cost of robust-stan's program for the
normal, bernoulli and poisson glms at the same size (target at most 2).

pystan pins its httpstan version (pystan 3.10: httpstan 4.13, the oldest stack);
without it the comparison is skipped and the rest still runs.

    python benchmarks/sampler_speed.py [--n 2000] [--p 10] [--beta 0.3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import robust_stan as rs

HAND_WRITTEN = """
data {
  int<lower=0> N;
  int<lower=0> P;
  matrix[N, P] X;
  vector[N] y;
  vector<lower=0>[P] prior_scale_b;
  real<lower=0> beta;
}
parameters {
  real alpha;
  vector[P] b;
  real<lower=0> sigma;
}
model {
  vector[N] mu = alpha + X * b;
  // the integral of p(y | mu, sigma)^(1 + beta) over y, the same for every row
  real integral = exp(-beta * log(sigma) - 0.5 * beta * log(2 * pi()) - 0.5 * log1p(beta));
  alpha ~ normal(0, 2.5);
  b ~ normal(0, prior_scale_b);
  sigma ~ exponential(1);
  for (i in 1:N) {
    real log_p = normal_lpdf(y[i] | mu[i], sigma);
    target += exp(beta * log_p) / beta - integral / (1 + beta);
  }
}
"""


def regression(n: int, p: int, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    y = 1.0 + X @ rng.normal(size=p) + rng.normal(size=n)
    bad = rng.choice(n, size=n // 10, replace=False)
    y[bad] += rng.normal(10.0, 2.0, size=bad.size)  # 10% gross outliers
    return {"X": X, "y": y}


def robust_stan_round(model, data, divergence, iterations, seed) -> dict:
    start = time.perf_counter()
    fit = model.sample(data, divergence, chains=2, iter_warmup=iterations, iter_sampling=iterations, seed=seed,
                       show_progress=False)
    wall = time.perf_counter() - start
    leapfrogs = float(fit.raw.sampler["n_leapfrog__"].sum())
    chains = fit.raw.seconds.get("total", wall)
    return {"wall": wall, "per_leapfrog_us": 1e6 * wall / leapfrogs, "outside_chains": 1 - chains / wall}


def hand_written_round(stan, data, iterations, seed) -> dict:
    # a new seed every round: httpstan keeps each fit by its arguments and would hand back the last one
    posterior = stan.build(HAND_WRITTEN, data=data, random_seed=seed)  # the compiled program is reused
    start = time.perf_counter()
    fit = posterior.sample(num_chains=2, num_warmup=iterations, num_samples=iterations)
    wall = time.perf_counter() - start
    return {"wall": wall, "per_leapfrog_us": 1e6 * wall / float(np.sum(fit["n_leapfrog__"]))}


def gradient_costs(model, data, divergences, calls: int = 2000) -> list[float]:
    """Median microseconds of one log density gradient through robust-stan's C interface, per
    divergence; the divergences' calls alternate, so drifts of the machine's speed hit all alike."""
    model.compile(show_progress=False)
    natives = [model.compile().native_model(model.stan_data(data, d)) for d in divergences]
    theta = np.random.default_rng(0).normal(scale=0.1, size=natives[0].dimension)
    times = [[] for _ in natives]
    for _ in range(calls):
        for native, spent in zip(natives, times):
            start = time.perf_counter()
            native.log_density_gradient(theta)
            spent.append(time.perf_counter() - start)
    return [1e6 * statistics.median(spent) for spent in times]


def family_data(family: str, n: int, p: int) -> dict:
    rng = np.random.default_rng(2)
    X = rng.normal(size=(n, p)) / np.sqrt(p)
    eta = 0.5 + X @ rng.normal(size=p)
    if family == "bernoulli":
        return {"X": X, "y": (rng.random(n) < 1 / (1 + np.exp(-eta))).astype(int)}
    return {"X": X, "y": rng.poisson(np.exp(eta))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--p", type=int, default=10)
    parser.add_argument("--beta", type=float, default=0.3)
    parser.add_argument("--iterations", type=int, default=1000, help="warmup and sampling iterations per chain")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    data = regression(args.n, args.p)
    model = rs.glm("normal")
    divergence = rs.BetaD(args.beta)
    model.compile(show_progress=False)
    try:
        import stan  # pystan 3
    except ImportError:
        stan = None
        print("pystan is not installed (pip install pystan; it pins httpstan 4.13): the comparison is skipped")
    if stan is not None:
        shared = model.stan_data(data, divergence)
        hand_data = {**{k: shared[k] for k in ("N", "P", "X", "y", "prior_scale_b")}, "beta": args.beta}
        stan.build(HAND_WRITTEN, data=hand_data, random_seed=0)  # compile once, before the clock runs

    print(f"normal linear regression, N = {args.n}, P = {args.p}, 10% gross outliers, beta = {args.beta}; "
          f"2 chains x ({args.iterations} warmup + {args.iterations} draws)")
    ratios, outside = [], []
    for round_ in range(1, args.rounds + 1):
        ours = robust_stan_round(model, data, divergence, args.iterations, seed=round_)
        outside.append(ours["outside_chains"])
        line = (f"round {round_}: robust-stan {ours['per_leapfrog_us']:.0f} us per leapfrog "
                f"({ours['wall']:.2f} s, {100 * ours['outside_chains']:.1f}% outside the chains)")
        if stan is not None:
            theirs = hand_written_round(stan, hand_data, args.iterations, seed=round_)
            ratios.append(ours["per_leapfrog_us"] / theirs["per_leapfrog_us"])
            line += f"; hand-written {theirs['per_leapfrog_us']:.0f} us ({theirs['wall']:.2f} s); ratio {ratios[-1]:.2f}"
        print(line)
    if ratios:
        print(f"per-leapfrog ratio robust-stan / hand-written: median {statistics.median(ratios):.2f}, "
              f"largest {max(ratios):.2f} (targets 1.0 and 1.2)")
    if outside:
        print(f"share of sample() outside the chains: median {100 * statistics.median(outside):.1f}% (target 20%)")

    print("beta and gamma / KL gradient cost (robust-stan's program, C interface, median of 2000 alternating "
          "calls; beta and gamma take the native losses of robust_stan_native.hpp):")
    for family, family_model, family_data_ in (
        ("normal", model, data),
        ("bernoulli", rs.glm("bernoulli"), family_data("bernoulli", args.n, args.p)),
        ("poisson", rs.glm("poisson"), family_data("poisson", args.n, args.p)),
    ):
        kl, beta, gamma = gradient_costs(family_model, family_data_, [rs.KL(), divergence, rs.GammaD(args.beta)])
        print(f"  {family:10s} KL {kl:7.0f} us, beta {beta:7.0f} us, ratio {beta / kl:.2f} (target 2); "
              f"gamma {gamma:7.0f} us, ratio {gamma / kl:.2f}")


if __name__ == "__main__":
    main()
