"""Noise-aware DP-VI for logistic regression on Adult: the noise-aware DPVI paper's Table 3
(``../shared/papers/noise-aware-dpvi.txt``, section 4.4 and appendix H.6).

Adult (``../shared/data/adult``, rows with a missing value dropped; 30,162 training and
15,060 test rows) prepared as in appendix H.6: the columns education-num,
native-country and relationship removed, the categorical columns one-hot encoded, the
continuous ones scaled to [0, 1] by the training rows' range (as in the paper, this
preprocessing is not itself private). Logistic regression with standard normal priors
on the intercept and every coefficient (``rs.glm("bernoulli", standardize=False)``).
DP-VI at epsilon in {0.1, 0.3, 1}, delta = 1e-5, T = 10^4, kappa = 0.1; then from each
release the noise-aware posterior (NUTS, 1000 + 4000; Laplace), the last iterate and
DPVIm. Each is scored by the calibration of its posterior predictive probabilities on
the test rows (eq. 29; 10 equal-width bins): the RMSE of observed share minus
predicted probability, bins weighted by their counts.

Chosen where the paper is silent: C = 5 (a row's score (y - p) x has norm at most
|x| <= 3.5 here), beta_u = 10, initial variances 0.01, burn-in T / 2, lambda_c = 1.

    python examples/dpvi_adult.py [--epsilons 0.1 0.3 1] [--repeats 3] [--workers 2]

Writes examples/results/dpvi_adult/{runs.csv, table.csv, calibration.png}.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from _coreset_data import adult_frames

import robust_stan as rs
from _cluster import add_address_argument, cluster_pool

OUT = Path(__file__).parent / "results" / "dpvi_adult"
CONTINUOUS = ["age", "fnlwgt", "capital_gain", "capital_loss", "hours_per_week"]
METHODS = ("noise-aware NUTS", "noise-aware Laplace", "last iterate", "DPVIm")


def adult_h6():
    """Appendix H.6's Adult: X_train, y_train, X_test, y_test."""
    train, test = adult_frames()
    y_train = (train.pop("income") == ">50K").to_numpy(int)
    y_test = (test.pop("income") == ">50K").to_numpy(int)
    frames = []
    for frame in (train, test):
        frames.append(frame.drop(columns=["education_num", "native_country", "relationship"]))
    low, high = frames[0][CONTINUOUS].min(), frames[0][CONTINUOUS].max()
    for frame in frames:
        frame[CONTINUOUS] = ((frame[CONTINUOUS] - low) / (high - low)).clip(0, 1)
    both = pd.get_dummies(pd.concat(frames, keys=["train", "test"]), dtype=float)
    return both.loc["train"].to_numpy(float), y_train, both.loc["test"].to_numpy(float), y_test


def model():
    return rs.glm("bernoulli", standardize=False, priors={"alpha": "normal(0, 1)"})


def predictive(posterior, X) -> np.ndarray:
    alpha = posterior.draws("alpha").reshape(-1)
    b = posterior.draws("b").reshape(alpha.size, -1)
    return (1 / (1 + np.exp(-(alpha[:, None] + b @ X.T)))).mean(axis=0)


def one_run(epsilon: float, repeat: int, args) -> list[dict]:
    warnings.simplefilter("ignore")
    X, y, X_test, y_test = adult_h6()
    fit = rs.dpvi(model(), {"X": X, "y": y, "prior_scale_b": np.ones(X.shape[1])}, epsilon=epsilon, clip=args.clip,
                  steps=args.steps, sampling_rate=0.1, precondition=args.precondition, initial_variance=0.01,
                  seed=repeat, show_progress=False)
    release = fit.release
    posteriors = {
        "noise-aware NUTS": rs.noise_aware(release, method="nuts", draws=4000, warmup=1000, seed=repeat),
        "noise-aware Laplace": rs.noise_aware(release, method="laplace", draws=4000, seed=repeat),
        "last iterate": rs.dpvi_baseline(release, "last_iterate", draws=4000, seed=repeat),
        "DPVIm": rs.dpvi_baseline(release, "averaged", draws=4000, seed=repeat),
    }
    rows = []
    for method, posterior in posteriors.items():
        table = rs.calibration_curve(predictive(posterior, X_test), y_test, bins=10)
        rows.append({"epsilon": epsilon, "repeat": repeat, "method": method, "calibration_rmse": rs.calibration_rmse(table),
                     "dpvi_seconds": fit.seconds, "curve": table.reset_index().to_dict("list")})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.1, 0.3, 1.0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--clip", type=float, default=5.0)
    parser.add_argument("--precondition", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2)
    add_address_argument(parser)
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    model().compile()
    start = time.perf_counter()
    rows = []
    with cluster_pool(args.workers, args.address) as pool:
        futures = [pool.submit(one_run, eps, r, args) for eps in args.epsilons for r in range(args.repeats)]
        for future in futures:
            rows += future.result()
            print(f"{len(rows) // len(METHODS)}/{len(futures)} runs, {time.perf_counter() - start:.0f} s", flush=True)
    runs = pd.DataFrame(rows)
    runs.drop(columns="curve").to_csv(OUT / "runs.csv", index=False)
    table = (runs.groupby(["epsilon", "method"], sort=False)["calibration_rmse"]
             .agg(mean="mean", sd=lambda v: v.std(ddof=1), repeats="size").reset_index())
    table["mean_x1e3"] = (1e3 * table["mean"]).round(0)
    table["sd_x1e3"] = (1e3 * table["sd"]).round(0)
    table.to_csv(OUT / "table.csv", index=False)
    print(table.to_string(index=False))
    plot(runs)


def plot(runs: pd.DataFrame) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epsilons = sorted(runs.epsilon.unique())
    fig, axes = plt.subplots(1, len(epsilons), figsize=(4 * len(epsilons), 3.6), squeeze=False, sharey=True)
    for ax, eps in zip(axes[0], epsilons):
        for method in METHODS:
            first = runs[(runs.epsilon == eps) & (runs.method == method)].iloc[0]
            ax.plot(first.curve["predicted"], first.curve["observed"], marker="o", label=method)
        ax.plot([0, 1], [0, 1], color="grey", linestyle=":")
        ax.set_title(f"Adult, epsilon {eps:g} (repeat 0)")
        ax.set_xlabel("predicted probability")
    axes[0, 0].set_ylabel("observed share of >50K")
    axes[0, -1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT / "calibration.png", dpi=120)


if __name__ == "__main__":
    main()
