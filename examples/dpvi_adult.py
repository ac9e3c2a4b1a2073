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
``--settings authors`` takes the authors' code's instead (DPBayes/noise-aware-dpvi,
adult_uci_experiments.py, set_default_args and preprocess_adult): C = 11, beta_u = 50 C = 550,
lambda_c = sqrt(57) (their step factor sqrt(2) sqrt(57); 57 = the number of coefficients),
q's initial sd softplus(-6) (here as the variance softplus(-6)^2), burn-in 20%, and the
continuous columns z-scored instead of scaled to [0, 1] (by the training rows' mean and sd;
their code scales the test rows by the test rows' own). Both scores are written: calibration
over 10 equal-width bins, count-weighted (ours), and over 10 equal-count bins (theirs).

    python examples/dpvi_adult.py [--epsilons 0.1 0.3 1] [--repeats 3] [--workers 2] [--settings authors]

Writes examples/results/dpvi_adult/ (or ``--out``)/{runs.csv, table.csv, calibration.png}.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

import robust_stan as rs
from _cluster import add_address_argument, cluster_pool
from _coreset_data import adult_frames
from robust_stan.methods.dpvi.mechanism import softplus

OUT = Path(__file__).parent / "results" / "dpvi_adult"
CONTINUOUS = ["age", "fnlwgt", "capital_gain", "capital_loss", "hours_per_week"]
METHODS = ("noise-aware NUTS", "noise-aware Laplace", "last iterate", "DPVIm")


SETTINGS = {"ours": {"clip": 5.0, "precondition": 10.0, "lambda_c": 1.0, "initial_variance": 0.01, "burn_in": 0.5,
                     "scaling": "range"},
            "authors": {"clip": 11.0, "precondition": 550.0, "lambda_c": float(np.sqrt(57)),
                        "initial_variance": float(softplus(-6.0) ** 2), "burn_in": 0.2, "scaling": "z"}}


def adult_h6(scaling: str = "range"):
    """Appendix H.6's Adult: X_train, y_train, X_test, y_test; the continuous columns scaled to
    [0, 1] by the training rows' range (``scaling="range"``, the paper's text) or z-scored by
    their mean and sd (``"z"``, the authors' code)."""
    train, test = adult_frames()
    y_train = (train.pop("income") == ">50K").to_numpy(int)
    y_test = (test.pop("income") == ">50K").to_numpy(int)
    frames = []
    for frame in (train, test):
        frames.append(frame.drop(columns=["education_num", "native_country", "relationship"]))
    if scaling == "range":
        low, high = frames[0][CONTINUOUS].min(), frames[0][CONTINUOUS].max()
        for frame in frames:
            frame[CONTINUOUS] = ((frame[CONTINUOUS] - low) / (high - low)).clip(0, 1)
    else:
        mean, sd = frames[0][CONTINUOUS].mean(), frames[0][CONTINUOUS].std(ddof=0)
        for frame in frames:
            frame[CONTINUOUS] = (frame[CONTINUOUS] - mean) / sd
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
    settings = dict(SETTINGS[args.settings])
    for key in ("clip", "precondition"):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    X, y, X_test, y_test = adult_h6(settings.pop("scaling"))
    burn_in = settings.pop("burn_in")
    # seed=repeat makes the table reproducible; a release with a seed written here is not private
    fit = rs.dpvi(model(), {"X": X, "y": y, "prior_scale_b": np.ones(X.shape[1])}, epsilon=epsilon,
                  steps=args.steps, sampling_rate=0.1, seed=repeat, show_progress=False, **settings)
    release = fit.release
    posteriors = {
        "noise-aware NUTS": rs.noise_aware(release, burn_in, method="nuts", iter_sampling=2000, iter_warmup=1000,
                                           seed=repeat),
        "noise-aware Laplace": rs.noise_aware(release, burn_in, method="laplace", iter_sampling=2000, seed=repeat),
        "last iterate": rs.dpvi_baseline(release, "last_iterate", draws=4000, seed=repeat),
        "DPVIm": rs.dpvi_baseline(release, "averaged", burn_in, draws=4000, seed=repeat),
    }
    rows = []
    trace_summary = posteriors["noise-aware NUTS"].trace_summary  # the trace model's convergence (warnings are off)
    for method, posterior in posteriors.items():
        predicted = predictive(posterior, X_test)
        table = rs.calibration_curve(predicted, y_test, bins=10)
        equal_count = rs.calibration_curve(predicted, y_test, bins=10, strategy="quantile")
        rows.append({"epsilon": epsilon, "repeat": repeat, "method": method, "calibration_rmse": rs.calibration_rmse(table),
                     "calibration_rmse_equal_count": rs.calibration_rmse(equal_count),
                     "dpvi_seconds": fit.seconds, "trace_r_hat_max": trace_summary["r_hat"].max(),
                     "trace_ess_bulk_min": trace_summary["ess_bulk"].min(), "curve": table.reset_index().to_dict("list")})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.1, 0.3, 1.0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--settings", choices=sorted(SETTINGS), default="ours",
                        help="DP-VI's settings and the scaling of the continuous columns (module docstring)")
    parser.add_argument("--clip", type=float, default=None, help="C (default: the settings')")
    parser.add_argument("--precondition", type=float, default=None, help="beta_u (default: the settings')")
    parser.add_argument("--out", default=None, help="folder under examples/results (default: dpvi_adult)")
    parser.add_argument("--workers", type=int, default=2)
    add_address_argument(parser)
    args = parser.parse_args(argv)
    out = OUT.parent / (args.out or OUT.name)
    out.mkdir(parents=True, exist_ok=True)
    model().compile()
    start = time.perf_counter()
    rows = []
    with cluster_pool(args.workers, args.address) as pool:
        futures = [pool.submit(one_run, eps, r, args) for eps in args.epsilons for r in range(args.repeats)]
        for future in futures:
            rows += future.result()
            print(f"{len(rows) // len(METHODS)}/{len(futures)} runs, {time.perf_counter() - start:.0f} s", flush=True)
    runs = pd.DataFrame(rows)
    runs.drop(columns="curve").to_csv(out / "runs.csv", index=False)
    grouped = runs.groupby(["epsilon", "method"], sort=False)
    table = grouped["calibration_rmse"].agg(mean="mean", sd=lambda v: v.std(ddof=1), repeats="size").reset_index()
    table["mean_x1e3"] = (1e3 * table["mean"]).round(0)
    table["sd_x1e3"] = (1e3 * table["sd"]).round(0)
    equal_count = grouped["calibration_rmse_equal_count"]
    table["equal_count_mean_x1e3"] = (1e3 * equal_count.mean().to_numpy()).round(0)
    table["equal_count_sd_x1e3"] = (1e3 * equal_count.std(ddof=1).to_numpy()).round(0)
    table.to_csv(out / "table.csv", index=False)
    print(table.to_string(index=False))
    plot(runs, out)


def plot(runs: pd.DataFrame, out: Path) -> None:
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
    fig.savefig(out / "calibration.png", dpi=120)


if __name__ == "__main__":
    main()
