"""Robust VI for binary classification: Tables 5 and 6 of Futami, Sato and Sugiyama (2018).

Table 6: spam and EEG eye state (../shared/data). Per random split: 90% training, 10%
clean test rows; a fraction (0, 10%, 20%) of the training rows is contaminated: noise
N(mu_j, 2 sigma_j) on D/4 random input columns and the label flipped. Inputs are
standardised on the training rows. Model (--model): "mlp", the issue's network with two
hidden layers of 20 ReLU units and a Bernoulli (logit) output, rs.mlp("bernoulli") (the
default: a linear model cannot reach the paper's eeg accuracy, about 63% at best by
maximum likelihood against the paper's 75.6%), or "logistic", rs.glm("bernoulli").
Mean-field Gaussian q (robust-stan driver; beta-VI at learning rate 1 + beta, the paper's
loss). Test accuracy of the posterior-predictive probability for KL, beta and gamma; beta
and gamma from --grid by validation accuracy (20% of the training rows) on the first split
of each setting, reused for the others.
Paper (KL / beta / gamma): spam 93.2 / 94.2 / 93.3 at 0%; eeg 75.6 / 79.6 / 79.2 at 0%,
68.4 / 73.3 / 77.3 at 20%.

Table 5 (--influence K): on clean training data, flip the label of K random training
points one at a time (rs.influence: 500 full-batch steps from the fit's q, against a
baseline refit with the same seed) and report the average absolute change in the mean test
log-likelihood, KL against beta = 0.1. The refits are full-batch: with minibatches the
flipped row enters a few batches at N/B times its weight, so the change after 500 steps
measures when it was last drawn more than its influence (on eeg it reversed the order of
KL and beta). --splits 0 runs Table 5 alone.
Writes runs.csv, table6.csv (beside the paper's numbers), accuracy.png and table5.csv.

    python examples/robust_vi_classification.py [--model mlp|logistic] [--datasets spam,eeg]
        [--contamination 0,0.1,0.2] [--splits 10] [--influence 20] [--jobs 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import expit

import robust_stan as rs
from _cluster import add_address_argument, cluster_pool

sys.path.insert(0, str(Path(__file__).parent))
import _uci

PAPER = {("spam", 0.0): (93.2, 94.2, 93.3), ("eeg", 0.0): (75.6, 79.6, 79.2), ("eeg", 0.2): (68.4, 73.3, 77.3)}


# Minibatches of 200 rows: a full-batch step converts the whole data set on httpstan (~0.1 s
# per step on spam), minibatch steps slice it. 3000 steps are ~150 passes over spam.
FIT_OPTIONS = {"batch_size": 200, "iter": 3000}
INFLUENCE_STEPS = 500


def model(kind: str):
    return rs.mlp("bernoulli") if kind == "mlp" else rs.glm("bernoulli", standardize=False)


def prepare(name: str, contamination: float, split_seed: int, kind: str):
    X, y = _uci.load_classification(name)
    rng = np.random.default_rng(split_seed)
    train, test = _uci.split(len(y), 0.1, rng)
    X_train, y_train = X[train], y[train].copy()
    bad = rng.choice(len(train), size=int(round(contamination * len(train))), replace=False)
    if bad.size:
        X_train = _uci.contaminate_inputs(X_train, bad, max(1, X.shape[1] // 4), rng)
        y_train[bad] = 1 - y_train[bad]
    scale = _uci.standardiser(X_train)
    network = {"H": _uci.HIDDEN, "P": X.shape[1]} if kind == "mlp" else {}
    return {"X": scale(X_train), "y": y_train, **network}, {"X": scale(X[test]), "y": y[test], **network}


def fit_options(kind: str) -> dict:
    return {**FIT_OPTIONS, **(_uci.NETWORK_START if kind == "mlp" else {})}


def fit(kind: str, data: dict, divergence, seed: int):
    return model(kind).variational(data, divergence, learning_rate=_uci.paper_learning_rate(divergence),
                                   family="meanfield", draws=200, seed=seed, show_progress=False,
                                   **fit_options(kind))


def logits(fitted, X: np.ndarray) -> np.ndarray:
    """(draws, rows) linear predictor of each posterior draw at X."""
    if "W1" in fitted.parameter_names:
        return rs.network_output(fitted, X)
    return fitted.draws("alpha")[0][:, None] + fitted.draws("b")[0] @ X.T


def accuracy(fitted, X: np.ndarray, y: np.ndarray) -> float:
    probability = expit(logits(fitted, X)).mean(axis=0)
    return float(np.mean((probability > 0.5) == (y == 1)))


def choose(name: str, contamination: float, grid: list[float], kind: str) -> dict:
    train, _ = prepare(name, contamination, 0, kind)
    order = np.random.default_rng(1).permutation(len(train["y"]))
    val, rest = order[: len(order) // 5], order[len(order) // 5:]
    part = _uci.rows_of(train, rest)
    chosen = {}
    for label, make in (("beta", rs.BetaD), ("gamma", rs.GammaD)):
        scores = [accuracy(fit(kind, part, make(v), 0), train["X"][val], train["y"][val]) for v in grid]
        chosen[label] = grid[int(np.argmax(scores))]
    return chosen


def run_split(name: str, contamination: float, split: int, chosen: dict, kind: str) -> list[dict]:
    train, test = prepare(name, contamination, split, kind)
    methods = {"KL": rs.KL(), "beta": rs.BetaD(chosen["beta"]), "gamma": rs.GammaD(chosen["gamma"])}
    rows = [{"dataset": name, "contamination": contamination, "split": split, "method": method,
             "parameter": chosen.get(method, np.nan),
             "accuracy": 100 * accuracy(fit(kind, train, divergence, split), test["X"], test["y"])}
            for method, divergence in methods.items()]
    print(f"{name} {contamination:.0%} split {split}: "
          + ", ".join(f"{r['method']} {r['accuracy']:.1f}" for r in rows), flush=True)
    return rows


def influence_of_flips(name: str, points: int, kind: str) -> list[dict]:
    """Average |change in test log-likelihood| from flipping one training label, KL and beta = 0.1."""
    train, test = prepare(name, 0.0, 0, kind)
    rows = np.random.default_rng(2).choice(len(train["y"]), size=points, replace=False)
    out = []
    for label, divergence in (("KL", rs.KL()), ("beta=0.1", rs.BetaD(0.1))):
        fitted = fit(kind, train, divergence, 0)
        refit = {**fit_options(kind), "iter": INFLUENCE_STEPS, "batch_size": None}  # full batch: see the top
        changes = [rs.influence(fitted, train, int(i), [1 - train["y"][i]], test, draws=100, seed=0,
                                **refit)["change"].iloc[0]
                   for i in rows]
        out.append({"dataset": name, "method": label, "points": points,
                    "mean_abs_change": float(np.mean(np.abs(changes))), "sd": float(np.std(changes))})
    return out


def main(argv=None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("mlp", "logistic"), default="mlp")
    parser.add_argument("--datasets", default="spam,eeg")
    parser.add_argument("--contamination", default="0,0.1,0.2")
    parser.add_argument("--splits", type=int, default=10)
    parser.add_argument("--grid", default="0.1,0.3,0.5,0.7,0.9")
    parser.add_argument("--influence", type=int, default=20, help="points flipped for Table 5 (0: skip)")
    parser.add_argument("--jobs", type=int, default=2)
    add_address_argument(parser)
    parser.add_argument("--out", type=Path, default=Path(Path(__file__).stem))
    args = parser.parse_args(argv)
    names = [n for n in args.datasets.split(",") if n]
    if sorted(set(names) - {"spam", "eeg"}):
        parser.error("--datasets: choose from spam, eeg")
    levels = [float(c) for c in args.contamination.split(",")]
    grid = [float(g) for g in args.grid.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    model(args.model).compile()
    settings = [(name, level) for name in names for level in levels]
    with cluster_pool(args.jobs, args.address) as pool:
        per_dataset = pool.map(influence_of_flips, names, [args.influence] * len(names),
                               [args.model] * len(names)) if args.influence else []
        if args.splits:
            chosen = dict(zip(settings, pool.map(choose, *zip(*settings), [grid] * len(settings),
                                                 [args.model] * len(settings))))
            tasks = [(name, level, split, chosen[(name, level)], args.model) for name, level in settings
                     for split in range(args.splits)]
            rows = [r for result in pool.map(run_split, *zip(*tasks)) for r in result]
        flips = [r for result in per_dataset for r in result]
    if flips:
        pd.DataFrame(flips).to_csv(args.out / "table5.csv", index=False)
        print(pd.DataFrame(flips))
    if not args.splits:
        print(f"wrote {args.out}/table5.csv" if flips else "nothing to do: --splits 0 and --influence 0")
        return pd.DataFrame(flips)
    runs = pd.DataFrame(rows)
    runs.to_csv(args.out / "runs.csv", index=False)
    table = _uci.table_beside_paper(runs, "accuracy", PAPER, ("KL", "beta", "gamma"))
    table.to_csv(args.out / "table6.csv")
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.precision", 2):
        print(f"chosen beta/gamma: {chosen}\n{table}")
    _uci.plot_by_contamination(runs, "accuracy", "test accuracy (%)", args.out / "accuracy.png")
    print(f"wrote {args.out}/runs.csv, table6.csv, accuracy.png" + (", table5.csv" if flips else ""))
    return runs


if __name__ == "__main__":
    main()
