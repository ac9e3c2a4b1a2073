"""Rob-ULA's bias, estimator by estimator, against the posterior given the clean rows (issue 51).

Bhatia et al.'s guarantee is a distance to the posterior of the clean rows, so that is the
reference: NUTS with KL on the clean rows alone (the same program, priors and data scale), and in
the conjugate location design its closed form. Every number is in posterior sds of that reference:
z = (Rob-ULA's posterior mean - the clean-rows posterior mean) / the clean-rows posterior sd.

Designs (n = 300 rows, intercept 0.5, coefficients alternating +1 / -1, unit noise, a fraction of
the rows corrupted):

- ``regression``: d = 2, 10, 30 coefficients; x ~ N(0, I) or Student t with 3 df; outliers in y
  (y + 12), in x (x_1 + 10, a bad leverage point: y kept) or in both (x_1 + 10 and y + 12);
  fraction 0.1 and epsilon 0.1;
- ``epsilon``: the first design (d = 2, normal x, outliers in y) with fraction and epsilon 0.05 and
  0.2, and with epsilon stated wrongly (0.05 and 0.2 at fraction 0.1);
- ``logistic``: y ~ bernoulli_logit(0.5 + x' b), d = 2 and 10, x ~ N(0, I), a tenth of the labels
  flipped at random (the case the old default was chosen on); the reference is NUTS on the
  unflipped rows, with the same priors (alpha ~ normal(0, 2.5), prior_scale_b = 2.5);
- ``location``: y ~ N(mu, 1) with mu ~ N(0, 10^2), outliers y + 12; the clean-rows posterior is
  normal in closed form;
- ``mechanism``: the coordinate-wise trimmed mean on the first design with each metric (dense,
  diag, unit: the paper's update), and ``row_trimmed_mean`` with dense and diag, against the rest
  point that trimming predicts (see the README).

The model is ``rs.glm("normal", standardize=False)`` with prior_scale_b = 2.5 for every
coefficient, so the contaminated and the clean fits share their priors. Rob-ULA: 4 chains, 500
warmup and 2000 kept iterations, the default step and metric, seed 100 + the data seed.

    python examples/rob_ula_bias.py [--parts regression epsilon logistic location mechanism] [--seeds 3]
        [--estimators ...] [--jobs 2] [--out rob_ula_bias]

``--parts logistic --out rob_ula_bias_logistic`` runs one part into its own folder.
"""

from __future__ import annotations

import argparse
import itertools
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

import robust_stan as rs

ROWS, INTERCEPT, Y_SHIFT, X_SHIFT = 300, 0.5, 12.0, 10.0
ESTIMATORS = ["mean", "trimmed_mean", "row_trimmed_mean", "lrv_once", "lrv", "median_of_means", "coordinate_median"]
SAMPLING = dict(iter_sampling=2000, iter_warmup=500, chains=4, show_progress=False)


def regression_data(d: int, x_dist: str, outliers: str, fraction: float, seed: int):
    """X, y and the indices of the clean rows."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(ROWS, d)) if x_dist == "normal" else rng.standard_t(3, size=(ROWS, d))
    b = np.where(np.arange(d) % 2 == 0, 1.0, -1.0)
    y = INTERCEPT + X @ b + rng.normal(size=ROWS)
    bad = rng.choice(ROWS, int(round(fraction * ROWS)), replace=False)
    if outliers in ("x", "both"):
        X[bad, 0] += X_SHIFT
    if outliers in ("y", "both"):
        y[bad] += Y_SHIFT
    return X, y, np.setdiff1d(np.arange(ROWS), bad)


def regression_model(family: str = "normal"):
    return rs.glm(family, standardize=False)


def logistic_data(d: int, fraction: float, seed: int):
    """X, y (a fraction of the labels flipped) and the indices of the unflipped rows."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(ROWS, d))
    b = np.where(np.arange(d) % 2 == 0, 1.0, -1.0)
    y = (rng.uniform(size=ROWS) < 1 / (1 + np.exp(-(INTERCEPT + X @ b)))).astype(int)
    bad = rng.choice(ROWS, int(round(fraction * ROWS)), replace=False)
    y[bad] = 1 - y[bad]
    return X, y, np.setdiff1d(np.arange(ROWS), bad)


def location_model():
    return rs.custom("normal", parameters="real mu;", priors="mu ~ normal(0, 10);", mu="mu", sigma="1",
                     title="normal location, unit sd")


def z_scores(summary: pd.DataFrame, reference: pd.DataFrame) -> pd.DataFrame:
    names = list(reference.index)
    return pd.DataFrame({
        "parameter": names,
        "mean": summary.loc[names, "mean"].to_numpy(),
        "sd": summary.loc[names, "sd"].to_numpy(),
        "ref_mean": reference["mean"].to_numpy(),
        "ref_sd": reference["sd"].to_numpy(),
        "z": ((summary.loc[names, "mean"] - reference["mean"]) / reference["sd"]).to_numpy(),
        "sd_ratio": (summary.loc[names, "sd"] / reference["sd"]).to_numpy(),
        "r_hat": summary.loc[names, "r_hat"].to_numpy(),
    })


def run_regression(task: dict) -> pd.DataFrame:
    """Every estimator (and metric) of one task on one data set, against NUTS on its clean rows."""
    logistic = task["part"] == "logistic"
    if logistic:
        X, y, clean = logistic_data(task["d"], task["fraction"], task["seed"])
    else:
        X, y, clean = regression_data(task["d"], task["x_dist"], task["outliers"], task["fraction"], task["seed"])
    model = regression_model("bernoulli" if logistic else "normal")
    scale = np.full(task["d"], 2.5)
    names = ["alpha"] + [f"b[{j + 1}]" for j in range(task["d"])] + ([] if logistic else ["sigma"])
    reference = model.sample({"X": X[clean], "y": y[clean], "prior_scale_b": scale}, seed=1,
                             show_progress=False).summary().loc[names, ["mean", "sd"]]
    frames = []
    for estimator, metric in task["runs"]:
        start = time.perf_counter()
        fit = rs.rob_ula(model, {"X": X, "y": y, "prior_scale_b": scale}, task["epsilon"], estimator=estimator,
                         metric=metric, seed=100 + task["seed"], **SAMPLING)
        frame = z_scores(fit.summary(), reference)
        frames.append(frame.assign(estimator=estimator, metric=metric, seconds=time.perf_counter() - start))
    return pd.concat(frames).assign(**{k: v for k, v in task.items() if k != "runs"})


def run_location(task: dict) -> pd.DataFrame:
    """The location design: the clean-rows posterior N(m, s^2) in closed form."""
    rng = np.random.default_rng(task["seed"])
    y = INTERCEPT + rng.normal(size=ROWS)
    bad = rng.choice(ROWS, int(round(task["fraction"] * ROWS)), replace=False)
    y[bad] += Y_SHIFT
    clean = np.setdiff1d(np.arange(ROWS), bad)
    precision = clean.size + 1 / 100
    reference = pd.DataFrame({"mean": [y[clean].sum() / precision], "sd": [precision ** -0.5]}, index=["mu"])
    frames = []
    for estimator, metric in task["runs"]:
        start = time.perf_counter()
        fit = rs.rob_ula(location_model(), {"y": y}, task["epsilon"], estimator=estimator, metric=metric,
                         seed=100 + task["seed"], **SAMPLING)
        frame = z_scores(fit.summary(), reference)
        frames.append(frame.assign(estimator=estimator, metric=metric, seconds=time.perf_counter() - start))
    return pd.concat(frames).assign(**{k: v for k, v in task.items() if k != "runs"})


def run_task(task: dict) -> pd.DataFrame:
    return run_location(task) if task["part"] == "location" else run_regression(task)


def tasks(parts: list[str], seeds: int, estimators: list[str]) -> list[dict]:
    runs = [(e, "dense") for e in estimators]
    base = dict(d=2, x_dist="normal", outliers="y")
    out = []
    for seed in range(seeds):
        if "regression" in parts:
            for d, x_dist, outliers in itertools.product([2, 10, 30], ["normal", "t3"], ["y", "x", "both"]):
                out.append(dict(part="regression", d=d, x_dist=x_dist, outliers=outliers, fraction=0.1,
                                epsilon=0.1, seed=seed, runs=runs))
        if "epsilon" in parts:
            for fraction, epsilon in [(0.05, 0.05), (0.2, 0.2), (0.1, 0.05), (0.1, 0.2)]:
                out.append(dict(part="epsilon", **base, fraction=fraction, epsilon=epsilon, seed=seed, runs=runs))
        if "logistic" in parts:
            for d in (2, 10):
                out.append(dict(part="logistic", d=d, x_dist="normal", outliers="labels", fraction=0.1, epsilon=0.1,
                                seed=seed, runs=runs))
        if "location" in parts:
            out.append(dict(part="location", d=0, x_dist="", outliers="y", fraction=0.1, epsilon=0.1, seed=seed,
                            runs=runs))
        if "mechanism" in parts:
            out.append(dict(part="mechanism", **base, fraction=0.1, epsilon=0.1, seed=seed,
                            runs=[("trimmed_mean", m) for m in ("dense", "diag", "unit")]
                            + [("row_trimmed_mean", m) for m in ("dense", "diag")]))
    return out


def trimming_rest_point(epsilon: float, fraction: float, rows: int = ROWS) -> dict:
    """Where the coordinate-wise trimmed mean's drift rests on the regression with one-sided outliers
    in y, in the diag or unit metric, whose coordinates are the intercept's and log sigma's own:
    the top epsilon n values (the outliers) and the bottom epsilon n (clean rows) are cut, so the kept
    clean residuals are those above their q = epsilon / (1 - fraction) quantile, and the rest point
    moves the intercept by sigma phi(z_q) / (1 - q) and sigma^2 to E[e^2 | kept] (+ that shift^2)."""
    q = epsilon / (1 - fraction)
    z_q = stats.norm.ppf(q)
    shift = stats.norm.pdf(z_q) / (1 - q)
    c = stats.chi2.ppf(q, 1)
    second_moment = stats.chi2.expect(lambda x: x, args=(1,), lb=c, conditional=True)
    clean = rows * (1 - fraction)
    sigma_ratio = np.sqrt(second_moment + shift ** 2)
    return {"alpha_shift": shift, "alpha_z": shift * np.sqrt(clean), "sigma_ratio": sigma_ratio,
            "sigma_z": (sigma_ratio - 1) * np.sqrt(2 * clean)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["regression", "epsilon", "logistic", "location", "mechanism"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--estimators", nargs="+", default=ESTIMATORS)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default="rob_ula_bias")
    args = parser.parse_args()
    out = Path(__file__).parent / "results" / args.out
    out.mkdir(parents=True, exist_ok=True)
    todo = tasks(args.parts, args.seeds, args.estimators)
    start, frames = time.perf_counter(), []
    with ProcessPoolExecutor(args.jobs) as pool:
        for k, frame in enumerate(pool.map(run_task, todo), 1):
            frames.append(frame)
            runs = pd.concat(frames, ignore_index=True)
            runs.to_csv(out / "runs.csv", index=False)  # after every task, so a stopped run keeps its tasks
            print(f"{k}/{len(todo)} tasks, {time.perf_counter() - start:.0f} s", flush=True)
    rest = pd.DataFrame([dict(epsilon=e, fraction=f, **trimming_rest_point(e, f))
                         for e, f in [(0.1, 0.1), (0.05, 0.05), (0.2, 0.2), (0.05, 0.1), (0.2, 0.1)]])
    rest.to_csv(out / "trimming_rest_point.csv", index=False)
    print(summarise(runs).to_string())
    print(rest.to_string())


def summarise(runs: pd.DataFrame) -> pd.DataFrame:
    """Per part and estimator (and metric): the largest |z| of a coefficient (alpha and b) and of
    sigma, as the median and the maximum over designs and seeds, and the largest R-hat."""
    runs = runs.assign(coefficient=runs["parameter"] != "sigma")
    per_run = runs.groupby(["part", "d", "x_dist", "outliers", "fraction", "epsilon", "seed", "estimator",
                            "metric"]).apply(
        lambda g: pd.Series({"worst_coefficient_z": g.loc[g["coefficient"], "z"].abs().max(),
                             "sigma_z": g.loc[~g["coefficient"], "z"].sum() if (~g["coefficient"]).any() else np.nan,
                             "r_hat": g["r_hat"].max()}), include_groups=False).reset_index()
    return per_run.groupby(["part", "estimator", "metric"]).agg(
        runs=("worst_coefficient_z", "size"),
        median_worst_coefficient_z=("worst_coefficient_z", "median"),
        max_worst_coefficient_z=("worst_coefficient_z", "max"),
        median_sigma_z=("sigma_z", "median"),
        max_abs_sigma_z=("sigma_z", lambda s: s.abs().max()),
        max_r_hat=("r_hat", "max"))


if __name__ == "__main__":
    main()
