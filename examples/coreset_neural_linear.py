"""beta-Cores for neural-linear regression on poisoned minibatches (beta-Cores paper, section 4.3).

Housing (``../shared/data/UCI_Datasets/bostonHousing``, 506 rows, 13 features), split
446 train / 50 test per trial as in the paper's Table 2, features and price standardised
on the training rows (456 train rows: the paper's Table 2 says 446). The model is the
paper's eq. 17 with its known noise scale: a Bayesian linear regression (``rs.custom``)
on the last hidden layer z(x) of a network 13 -> 30 -> 30 (ReLU), y ~ N(alpha + z' b,
0.5^2) in standardised units, alpha, b_j ~ N(0, 1). (With sigma a parameter, the
20-row start has more coefficients than rows, the weighted fit interpolates and the
mode runs to sigma = 0: no Laplace approximation exists; the paper fixes sigma.)
The training rows form minibatches of 10 (the coreset's units: group summarisation);
a fraction F of the minibatches is poisoned, 70% of their rows replaced by outliers:
half of them with a fixed random half of the features replaced by N(0, 5^2) noise, the
other half with the price replaced by N(0, 5^2) noise (standardised units).

Every method starts from 2 random clean minibatches (20 rows) and adds one minibatch per
step; after each step the network is retrained on the current coreset rows (1000
AdaGrad steps on minibatches of 10 rows drawn in proportion to the coreset weights,
continuing from the previous round) and the regression's features recomputed for every
row: ``rs.coreset(..., start=, refresh=)``, the same compiled program throughout.
beta-Cores (Laplace sampler, inner="beta") and SparseVI choose the minibatches; the
uniform baseline adds random ones (weight G / k each). Every second step the classical
posterior on the coreset rows (weights as data, NUTS) predicts the test prices: RMSE
of the posterior mean prediction, in the data's units (thousands of dollars). The
references are the classical and beta posteriors on all training rows with a network
trained on all of them.

What differs from the paper: no batch normalisation (the inputs are standardised);
the network trains on the weighted coreset rows by sampling them in proportion to
their weights; sigma = 0.5 standardised units is our choice (the paper does not give
its value).

Writes examples/results/coreset_neural_linear/{runs.csv, summary.csv, rmse.png}.

    python examples/coreset_neural_linear.py [--fractions 0 0.3] [--trials 5] [--beta 0.5] [--workers 2 | --address ADDR]
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
from _uci import load_regression

OUT = Path(__file__).parent / "results" / "coreset_neural_linear"
NUTS = {"chains": 2, "iter_warmup": 400, "iter_sampling": 400, "show_progress": False}
METHODS = ("beta_cores", "sparse_vi", "uniform")
BATCH_ROWS, START_BATCHES, N_TEST = 10, 2, 50
NOISE_SD = 0.5  # the known noise scale, in standard deviations of the training prices


class FeatureNetwork:
    """z(x) = relu(W2 relu(W1 x + c1) + c2), trained with a linear head v' z + c3 on squared error."""

    def __init__(self, inputs: int, units: int, rng: np.random.Generator):
        self.params = {"W1": rng.normal(0, np.sqrt(2 / inputs), (inputs, units)), "c1": np.zeros(units),
                       "W2": rng.normal(0, np.sqrt(2 / units), (units, units)), "c2": np.zeros(units),
                       "v": rng.normal(0, np.sqrt(1 / units), units), "c3": np.zeros(1)}

    def features(self, X: np.ndarray) -> np.ndarray:
        p = self.params
        return np.maximum(np.maximum(X @ p["W1"] + p["c1"], 0) @ p["W2"] + p["c2"], 0)

    def loss_gradient(self, X: np.ndarray, y: np.ndarray) -> tuple[float, dict]:
        """Half the mean squared error of the head's prediction, and its gradient (backpropagation)."""
        p = self.params
        h = np.maximum(X @ p["W1"] + p["c1"], 0)
        z = np.maximum(h @ p["W2"] + p["c2"], 0)
        error = z @ p["v"] + p["c3"][0] - y
        d_out = error / y.size
        d_z = np.outer(d_out, p["v"]) * (z > 0)
        d_h = d_z @ p["W2"].T * (h > 0)
        grads = {"v": z.T @ d_out, "c3": np.array([d_out.sum()]), "W2": h.T @ d_z, "c2": d_z.sum(0),
                 "W1": X.T @ d_h, "c1": d_h.sum(0)}
        return 0.5 * float(np.mean(error**2)), grads

    def train(self, X, y, weights, rng, steps=1000, batch=10, rate=0.05) -> None:
        """AdaGrad on minibatches of ``batch`` rows drawn with probability proportional to ``weights``."""
        probability = weights / weights.sum()
        accumulated = {k: np.zeros_like(v) for k, v in self.params.items()}
        for _ in range(steps):
            rows = rng.choice(y.size, batch, p=probability)
            _, grads = self.loss_gradient(X[rows], y[rows])
            for k, g in grads.items():
                accumulated[k] += g**2
                self.params[k] -= rate * g / (np.sqrt(accumulated[k]) + 1e-8)


def neural_linear_model():
    """The paper's eq. 17 with its known noise scale: y_n ~ N(alpha + z(x_n)' b, noise_sd^2),
    alpha, b_j ~ N(0, prior_sd^2); z(x_n) are the rows of the data matrix X."""
    return rs.custom("normal", data="int<lower=1> P; matrix[N, P] X; real<lower=0> noise_sd; real<lower=0> prior_sd;",
                     parameters="real alpha; vector[P] b;",
                     priors="alpha ~ normal(0, prior_sd); b ~ normal(0, prior_sd);",
                     mu="alpha + X[n] * b", sigma="noise_sd", vectorised={"mu": "alpha + X * b"},
                     title="neural-linear regression, known noise (beta-Cores paper eq. 17)")


def poisoned_housing(fraction: float, rng: np.random.Generator):
    """Standardised train/test split, minibatch labels, and a fraction of minibatches poisoned."""
    X, y = load_regression("housing")
    order = rng.permutation(y.size)
    test, train = order[:N_TEST], order[N_TEST:]
    mean_x, sd_x, mean_y, sd_y = X[train].mean(0), X[train].std(0), y[train].mean(), y[train].std()
    X_train, X_test = (X[train] - mean_x) / sd_x, (X[test] - mean_x) / sd_x
    y_train, y_test = (y[train] - mean_y) / sd_y, (y[test] - mean_y) / sd_y
    batches = rng.permutation(np.arange(y_train.size) // BATCH_ROWS)
    n_batches = batches.max() + 1
    poisoned = rng.choice(n_batches, int(round(fraction * n_batches)), replace=False)
    columns = rng.choice(X.shape[1], X.shape[1] // 2, replace=False)
    corrupted = np.zeros(y_train.size, dtype=bool)
    for label in poisoned:
        rows = np.flatnonzero(batches == label)
        bad = rng.choice(rows, int(round(0.7 * rows.size)), replace=False)
        noisy, wrong = bad[: bad.size // 2], bad[bad.size // 2:]
        X_train[np.ix_(noisy, columns)] = rng.normal(0.0, 5.0, (noisy.size, columns.size))
        y_train[wrong] = rng.normal(0.0, 5.0, wrong.size)
        corrupted[bad] = True
    clean_batches = np.setdiff1d(np.arange(n_batches), poisoned)
    return X_train, y_train, X_test, y_test, sd_y, batches, corrupted, clean_batches


def regression_data(Z: np.ndarray, y: np.ndarray) -> dict:
    return {"P": Z.shape[1], "X": Z, "y": y, "noise_sd": NOISE_SD, "prior_sd": 1.0}


def rmse(model, Z, y, weights, Z_test, y_test, scale, seed, divergence=None):
    """Test RMSE (data units) of the posterior mean prediction from a fit on the rows with a weight."""
    rows = np.flatnonzero(weights)
    data = regression_data(Z[rows], y[rows])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = model.sample(data, divergence=divergence, weights=weights[rows], seed=seed, **NUTS)
    alpha = fit.posterior["alpha"].reshape(-1)
    b = fit.posterior["b"].reshape(-1, Z.shape[1])
    prediction = (alpha[:, None] + b @ Z_test.T).mean(axis=0)
    return scale * float(np.sqrt(np.mean((prediction - y_test) ** 2))), len(caught) > 0


def run_trial(model, args, fraction: float, trial: int) -> list[dict]:
    rng = np.random.default_rng(1000 * trial + int(round(100 * fraction)))
    X, y, X_test, y_test, scale, batches, corrupted, clean_batches = poisoned_housing(fraction, rng)
    n_batches = batches.max() + 1
    start = rng.choice(clean_batches, START_BATCHES, replace=False)
    divergence = rs.BetaD(args.beta)
    rows = []

    full_network = FeatureNetwork(X.shape[1], args.units, np.random.default_rng(trial))
    full_network.train(X, y, np.ones(y.size), np.random.default_rng(trial), steps=3 * args.train_steps)
    for reference, div in (("full classical", None), ("full beta", divergence)):
        error, warned = rmse(model, full_network.features(X), y, np.ones(y.size), full_network.features(X_test),
                             y_test, scale, trial, div)
        rows.append({"F": fraction, "trial": trial, "method": reference, "step": args.steps, "rows": y.size,
                     "outlier_share": float(corrupted.mean()), "rmse": error, "nuts_warning": warned})

    for method in METHODS:
        network = FeatureNetwork(X.shape[1], args.units, np.random.default_rng(trial))
        train_rng = np.random.default_rng(trial + 1)
        calls = [0]
        began = time.perf_counter()

        def refresh(weights):
            """Retrain the network on the coreset rows; score every second step; new features."""
            network.train(X, y, weights, train_rng, steps=args.train_steps)
            Z = network.features(X)
            step = calls[0]
            calls[0] += 1
            if step % args.every == 0:
                kept = weights > 0
                error, warned = rmse(model, Z, y, weights, network.features(X_test), y_test, scale, trial)
                rows.append({"F": fraction, "trial": trial, "method": method, "step": step, "rows": int(kept.sum()),
                             "outlier_share": float(corrupted[kept].mean()), "rmse": error, "nuts_warning": warned})
            return regression_data(Z, y)

        if method == "uniform":
            order = np.concatenate([start, rng.permutation(np.setdiff1d(np.arange(n_batches), start))])
            for k in range(START_BATCHES, START_BATCHES + args.steps + 1):
                refresh(np.where(np.isin(batches, order[:k]), n_batches / k, 0.0))
        else:
            untrained = regression_data(network.features(X), y)
            rs.coreset(model, untrained, size=args.steps, method=method, divergence=divergence, groups=batches,
                       start=start, refresh=refresh, draws=args.draws, iters_per_point=args.iters,
                       select_batch=n_batches, opt_batch=args.opt_batch, sampler="laplace", seed=trial,
                       show_progress=False)
        seconds = time.perf_counter() - began
        for row in rows:
            if row["method"] == method:
                row["seconds"] = seconds
        last = rows[-1]
        print(f"F = {fraction:.2f} trial {trial} {method:10s} {seconds:5.0f} s: RMSE {last['rmse']:.2f} at "
              f"{last['rows']} rows, outlier share {last['outlier_share']:.2f}", flush=True)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.3])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--steps", type=int, default=18, help="minibatches added after the start")
    parser.add_argument("--every", type=int, default=2, help="score the coreset every this many steps")
    parser.add_argument("--beta", type=float, default=0.5)
    parser.add_argument("--units", type=int, default=30)
    parser.add_argument("--train-steps", type=int, default=1000, help="AdaGrad steps per training round")
    parser.add_argument("--iters", type=int, default=50, help="weight steps per added minibatch (T)")
    parser.add_argument("--draws", type=int, default=50)
    parser.add_argument("--opt-batch", type=int, default=20, help="minibatches per weight step (B')")
    parser.add_argument("--workers", type=int, default=2, help="local worker processes (one trial per task)")
    add_address_argument(parser)
    parser.add_argument("--out", default="coreset_neural_linear", help="folder under examples/results")
    args = parser.parse_args(argv)
    out = OUT.parent / args.out
    out.mkdir(parents=True, exist_ok=True)
    model = neural_linear_model()
    model.compile()  # once, before the workers load the cache
    tasks = [(fraction, trial) for fraction in args.fractions for trial in range(args.trials)]
    rows = []
    with cluster_pool(args.workers, args.address) as pool:
        for trial_rows in pool.map(run_trial, [model] * len(tasks), [args] * len(tasks), *zip(*tasks)):
            rows += trial_rows
    pd.DataFrame(rows).to_csv(out / "runs.csv", index=False)
    runs = pd.DataFrame(rows)
    summary = (runs.groupby(["F", "method", "step"]).agg(
        rows=("rows", "median"), q25=("rmse", lambda v: v.quantile(0.25)), median=("rmse", "median"),
        q75=("rmse", lambda v: v.quantile(0.75)), outlier_share=("outlier_share", "mean"),
        trials=("rmse", "size")).reset_index())
    summary.to_csv(out / "summary.csv", index=False)
    print(summary.to_string(index=False))
    plot(summary, out)


def plot(summary: pd.DataFrame, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fractions = sorted(summary.F.unique())
    fig, axes = plt.subplots(1, len(fractions), figsize=(4.5 * len(fractions), 3.5), squeeze=False, sharey=True)
    for ax, fraction in zip(axes[0], fractions):
        for method in METHODS:
            sub = summary[(summary.F == fraction) & (summary.method == method)]
            ax.plot(sub["rows"], sub["median"], marker="o", label=method)
            ax.fill_between(sub["rows"], sub.q25, sub.q75, alpha=0.2)
        for reference, style in (("full classical", ":"), ("full beta", "--")):
            value = summary[(summary.F == fraction) & (summary.method == reference)]["median"]
            ax.axhline(float(value.iloc[0]), linestyle=style, color="grey", label=reference)
        ax.set_title(f"Housing, F = {fraction:.0%} of minibatches poisoned")
        ax.set_xlabel("coreset rows")
    axes[0, 0].set_ylabel("test RMSE (median, quartiles)")
    axes[0, -1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "rmse.png", dpi=120)


if __name__ == "__main__":
    main()
