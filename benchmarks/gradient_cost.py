"""Gradient cost of the robust-stan program against a hand-written plain Stan glm.

Times ``program.log_density_gradient(stan_data, theta)`` (robust-stan's engine
call) for

- the robust-stan normal glm under the beta divergence,
- the same program under KL (divergence chosen by data, same binary),
- a plain, hand-written Stan normal glm (``y ~ normal(alpha + X * b, sigma)``),

all on the same data and at the same unconstrained point, and prints the
median cost per call and the ratio robust / plain. Target: <= 2x.

The httpstan extension converts the Python data dict into Stan's
``array_var_context`` and builds the model object on *every* call (in Python,
item by item), so a call's cost is "data overhead + gradient". The overhead is
separated two ways:

- ``module.get_dims(data)`` does the same conversion and model construction
  but no log density: time it on the same data and subtract;
- the same call with a tiny N (fixed per-call cost only).

``program.log_density_gradient`` of the httpstan engine calls the extension
twice (``log_prob_grad`` then ``log_prob``), so the raw ``log_prob_grad`` call
is timed too. NUTS inside Stan pays none of this overhead: the "gradient only"
columns are what matters for sampling speed.

This is a benchmark, not a test: it prints ratios measured in one run.

    python benchmarks/gradient_cost.py [--n 2000] [--k 10] [--beta 0.3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import robust_stan as rs
from robust_stan.engines import COMPILE_COUNTS, compile_program

PLAIN_GLM = """
data {
  int N;
  int K;
  matrix[N, K] X;
  vector[N] y;
}
parameters {
  real alpha;
  vector[K] b;
  real<lower=0> sigma;
}
model {
  alpha ~ normal(0, 2.5);
  b ~ normal(0, 2.5);
  sigma ~ exponential(1);
  y ~ normal(alpha + X * b, sigma);
}
"""


# The same two programs with the likelihood evaluated n_rep times (data): the
# slope of the cost in n_rep is the cost of one likelihood gradient inside Stan,
# free of the per-call data conversion.
PLAIN_GLM_REPEATED = PLAIN_GLM.replace("vector[N] y;", "vector[N] y;\n  int<lower=1> n_rep;").replace(
    "  y ~ normal(alpha + X * b, sigma);", "  for (r in 1:n_rep) y ~ normal(alpha + X * b, sigma);")


def repeated_robust_code(stan_code: str) -> str | None:
    """The robust-stan program with its mode-0 likelihood block run n_rep times (None if the layout changed)."""
    if stan_code.count("    if (mode == 0) {") != 1 or stan_code.count("data {\n") < 1:
        return None
    code = stan_code.replace("    if (mode == 0) {", "    if (mode == 0) for (r in 1:n_rep) {")
    return code.replace("data {\n", "data {\n  int<lower=1> n_rep;\n", 1)


def simulate(n: int, k: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, k))
    b = rng.normal(0, 0.5, size=k)
    y = 1.0 + X @ b + rng.normal(size=n)
    return {"X": X, "y": y}


def time_call(fn, calls: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean seconds per call over ``calls`` calls."""
    fn()  # warm up
    per_call = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - start) / calls)
    return statistics.median(per_call)


def measure(model, plain, data, beta: float, calls: int, repeats: int) -> dict:
    """Seconds per call for every (program, kind of call) pair at these data."""
    robust = model.compile(show_progress=False)
    # Same priors in both programs (prior_scale_b = 2.5), same standardised y.
    data = dict(data, prior_scale_b=np.full(data["X"].shape[1], 2.5))
    sd_beta = model.stan_data(data, divergence=rs.BetaD(beta))
    sd_kl = model.stan_data(data, divergence=rs.KL())
    sd_plain = {"N": sd_kl["N"], "K": sd_kl["P"], "X": sd_kl["X"], "y": sd_kl["y"]}
    k = sd_kl["P"]
    theta = np.concatenate([[0.1], np.linspace(-0.3, 0.3, k), [np.log(0.8)]])  # alpha, b, log sigma

    # Sanity: the KL program and the plain program have the same gradient
    # (the log density differs only by constants).
    _, g_kl = robust.log_density_gradient(sd_kl, theta)
    _, g_plain = plain.log_density_gradient(sd_plain, theta)
    max_diff = float(np.max(np.abs(g_kl - g_plain)) / max(1.0, np.max(np.abs(g_plain))))

    cases = {"beta": (robust, sd_beta), "KL": (robust, sd_kl), "plain": (plain, sd_plain)}
    out = {}
    for name, (prog, sd) in cases.items():
        hs_data = _httpstan_data(sd)
        theta_list = list(map(float, theta))
        module = prog.module
        out[name] = {
            "engine_call": time_call(lambda: prog.log_density_gradient(sd, theta), calls, repeats),
            "log_prob_grad": time_call(lambda: module.log_prob_grad(hs_data, theta_list, True), calls, repeats),
            "overhead": time_call(lambda: module.get_dims(hs_data), calls, repeats),
        }
        out[name]["gradient_only"] = max(out[name]["log_prob_grad"] - out[name]["overhead"], 0.0)
    out["_max_rel_grad_diff_kl_vs_plain"] = max_diff
    return out


def measure_slope(model, data, beta: float, reps: tuple[int, int], repeats: int) -> dict | None:
    """Seconds of one likelihood gradient inside Stan, from the slope in n_rep of the raw log_prob_grad call."""
    code = repeated_robust_code(model.stan_code)
    if code is None:
        print("(the generated program's layout changed; slope measurement skipped)")
        return None
    t0 = time.perf_counter()
    robust_rep = compile_program(code, engine="httpstan", show_progress=False)
    plain_rep = compile_program(PLAIN_GLM_REPEATED, engine="httpstan", show_progress=False)
    print(f"repeated-likelihood programs ready in {time.perf_counter() - t0:.0f} s "
          f"(real compiles so far: {COMPILE_COUNTS['httpstan']})")
    data = dict(data, prior_scale_b=np.full(data["X"].shape[1], 2.5))
    sd_kl = model.stan_data(data, divergence=rs.KL())
    k = sd_kl["P"]
    theta = list(map(float, np.concatenate([[0.1], np.linspace(-0.3, 0.3, k), [np.log(0.8)]])))
    cases = {
        "beta": (robust_rep, model.stan_data(data, divergence=rs.BetaD(beta))),
        "KL": (robust_rep, sd_kl),
        "plain": (plain_rep, {"N": sd_kl["N"], "K": k, "X": sd_kl["X"], "y": sd_kl["y"]}),
    }
    out = {}
    for name, (prog, sd) in cases.items():
        times = []
        for r in reps:
            hs = _httpstan_data(dict(sd, n_rep=r))
            module = prog.module
            calls = max(5, int(0.2 / max(_one_call(lambda: module.log_prob_grad(hs, theta, True)), 1e-6)))
            times.append(time_call(lambda: module.log_prob_grad(hs, theta, True), calls, repeats))
        out[name] = (times[1] - times[0]) / (reps[1] - reps[0])
    return out


def _one_call(fn) -> float:
    fn()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _httpstan_data(sd: dict) -> dict:
    from robust_stan.engines.httpstan_engine import _as_httpstan_data

    return _as_httpstan_data(sd)


def print_table(title: str, res: dict) -> None:
    cols = ["engine_call", "log_prob_grad", "overhead", "gradient_only"]
    print(f"\n{title}")
    print(f"{'program':<8}" + "".join(f"{c:>16}" for c in cols) + "   (microseconds per call, median)")
    for name in ("beta", "KL", "plain"):
        print(f"{name:<8}" + "".join(f"{res[name][c] * 1e6:16.1f}" for c in cols))
    for name in ("beta", "KL"):
        ratios = [res[name][c] / res["plain"][c] if res["plain"][c] > 0 else float("nan") for c in cols]
        print(f"{name + '/plain':<8}" + "".join(f"{r:16.2f}" for r in ratios) + "   (ratio)")
    print(f"(KL-program vs plain gradient, max relative difference: {res['_max_rel_grad_diff_kl_vs_plain']:.1e})")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="observations (default 2000)")
    parser.add_argument("--k", type=int, default=10, help="predictors (default 10)")
    parser.add_argument("--tiny-n", type=int, default=5, help="N for the fixed-overhead run (default 5)")
    parser.add_argument("--beta", type=float, default=0.3, help="beta of the beta divergence (default 0.3)")
    parser.add_argument("--calls", type=int, default=200, help="calls per timing repeat (default 200)")
    parser.add_argument("--repeats", type=int, default=7, help="timing repeats; the median is reported (default 7)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--slope-reps", type=int, nargs=2, default=(1, 41), metavar=("R1", "R2"),
                        help="n_rep values of the repeated-likelihood programs (default 1 41)")
    parser.add_argument("--no-slope", action="store_true",
                        help="skip the repeated-likelihood measurement (saves two compiles)")
    args = parser.parse_args(argv)

    model = rs.glm("normal", engine="httpstan")
    t0 = time.perf_counter()
    model.compile(show_progress=False)
    plain = compile_program(PLAIN_GLM, engine="httpstan", show_progress=False)
    print(f"programs ready in {time.perf_counter() - t0:.0f} s (real compiles: {COMPILE_COUNTS['httpstan']})")

    big = measure(model, plain, simulate(args.n, args.k, args.seed), args.beta, args.calls, args.repeats)
    tiny = measure(model, plain, simulate(args.tiny_n, args.k, args.seed), args.beta, args.calls, args.repeats)
    print_table(f"N = {args.n}, K = {args.k}, beta = {args.beta}", big)
    print_table(f"N = {args.tiny_n}, K = {args.k} (fixed per-call overhead)", tiny)

    # Cost with the fixed per-call overhead (tiny-N engine call) subtracted.
    print("\nEngine call minus the tiny-N engine call (N-dependent cost: data conversion + gradient), us:")
    net = {name: big[name]["engine_call"] - tiny[name]["engine_call"] for name in ("beta", "KL", "plain")}
    print("  " + ", ".join(f"{name} {v * 1e6:.1f}" for name, v in net.items()))

    slope = None if args.no_slope else measure_slope(
        model, simulate(args.n, args.k, args.seed), args.beta, tuple(args.slope_reps), args.repeats)
    if slope:
        print(f"\nOne likelihood gradient inside Stan (slope in n_rep of log_prob_grad, n_rep "
              f"{args.slope_reps[0]} -> {args.slope_reps[1]}), N = {args.n}, K = {args.k}:")
        print("  " + ", ".join(f"{name} {v * 1e6:.1f} us" for name, v in slope.items()))

    r_call = big["beta"]["engine_call"] / big["plain"]["engine_call"]
    r_grad = big["beta"]["gradient_only"] / big["plain"]["gradient_only"]
    r_net = net["beta"] / net["plain"]
    print(f"\nRATIO robust(beta)/plain, engine call incl. data overhead: {r_call:.2f}  (target <= 2: "
          f"{'met' if r_call <= 2 else 'MISSED'})")
    print(f"RATIO robust(beta)/plain, minus the tiny-N call:           {r_net:.2f}")
    print(f"RATIO robust(beta)/plain, gradient only (minus get_dims):  {r_grad:.2f}  (target <= 2: "
          f"{'met' if r_grad <= 2 else 'MISSED'})")
    print(f"RATIO robust(KL)/plain,   gradient only (minus get_dims):  "
          f"{big['KL']['gradient_only'] / big['plain']['gradient_only']:.2f}")
    if slope:
        r_slope = slope["beta"] / slope["plain"]
        print(f"RATIO robust(beta)/plain, likelihood gradient in Stan (slope): {r_slope:.2f}  (target <= 2: "
              f"{'met' if r_slope <= 2 else 'MISSED'})")
        print(f"RATIO robust(KL)/plain,   likelihood gradient in Stan (slope): {slope['KL'] / slope['plain']:.2f}")


if __name__ == "__main__":
    main()
