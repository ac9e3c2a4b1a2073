"""beta-Cores group selection (beta-Cores paper, section 4.4), on Adult instead of the paper's hospital data.

The paper's HospitalReadmissions data are not available; Adult stands in. Two ways to form
the groups (``--protocol``):

- ``demographic``: every training row, in groups by age band (<30, 30-39, 40-49, 50-59, 60+)
  x race x sex (49 groups of 5 to 5150 rows);
- ``paper``: the paper's "groups of roughly equal size", as the authors' code forms Adult's
  (``examples/data/preproc_adult.py`` of github.com/dionman/beta-cores): age (0, 25], (25, 30],
  (30, 35], (35, 40], (40, 45], (45, 55], over 55 x the four races other than "Other" x sex,
  each group its first 50 rows in table order (56 groups, 36 of them full; 2306 rows, which are
  then the whole training set).

Each group gets 0%,
10% or 20% of its rows replaced by crafted outliers (assigned to groups at random, so
about 10% of all rows), half by feature noise and half by flipped labels, as in
section 4.2. beta-Cores on groups (Laplace sampler, inner="beta" or --inner) runs 10 iterations;
after each, the classical posterior on the chosen groups' rows (group weights as
data, NUTS) is scored by accuracy on a class-balanced test set. Baseline: the same
number of groups drawn at random, each row weighted N / (rows chosen).

Writes examples/results/coreset_groups/{runs.csv, summary.csv, accuracy.png, chosen_groups.csv}.

    python examples/coreset_groups.py [--protocol paper] [--trials 5] [--beta 0.6] [--workers 2 | --address ADDR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

import robust_stan as rs
from _cluster import add_address_argument, cluster_pool
from _coreset_data import _one_hot, accuracy, adult_frames, balanced, principal_components

OUT = Path(__file__).parent / "results" / "coreset_groups"
NUTS = {"chains": 2, "iter_warmup": 500, "iter_sampling": 500, "show_progress": False}
AGE_BANDS = [0, 30, 40, 50, 60, 200]
PAPER_AGE_BANDS = [0, 25, 30, 35, 40, 45, 55, 200]  # the authors' (a, b] bands for Adult
PAPER_GROUP_CAP = 50


def adult_with_groups(protocol: str = "demographic"):
    """Adult on 10 principal components (of every training row), the training rows of the
    protocol and each one's group label (see the module docstring)."""
    train, test = adult_frames()
    if protocol == "paper":
        band = pd.cut(train["age"], PAPER_AGE_BANDS, right=True).astype(str)
    else:
        band = pd.cut(train["age"], AGE_BANDS, right=False, labels=["<30", "30-39", "40-49", "50-59", "60+"])
    groups = (band.astype(str) + " | " + train["race"] + " | " + train["sex"]).to_numpy()
    y_train = (train.pop("income") == ">50K").to_numpy(int)
    y_test = (test.pop("income") == ">50K").to_numpy(int)
    X_train, X_test = principal_components(*_one_hot(train, test), 10)
    if protocol == "paper":
        in_group = pd.Series(groups)[(train["race"] != "Other").to_numpy()]
        kept = np.sort(in_group.groupby(in_group, sort=False).head(PAPER_GROUP_CAP).index.to_numpy())
        X_train, y_train, groups = X_train[kept], y_train[kept], groups[kept]
    return X_train, y_train, X_test, y_test, groups


def corrupt_groups(X, y, groups, rng):
    """0, 10 or 20% of each group's rows made outliers (feature noise on a fixed half of the
    columns, or a flipped label); returns X, y, the corrupted mask and each group's level."""
    X, y = X.copy(), y.copy()
    columns = rng.choice(X.shape[1], X.shape[1] // 2, replace=False)
    corrupted = np.zeros(len(y), dtype=bool)
    levels = {}
    for label in np.unique(groups):
        rows = np.flatnonzero(groups == label)
        level = float(rng.choice([0.0, 0.1, 0.2]))
        levels[label] = level
        bad = rng.choice(rows, int(round(level * rows.size)), replace=False)
        noisy, flipped = bad[: bad.size // 2], bad[bad.size // 2:]
        X[np.ix_(noisy, columns)] = rng.normal(0.0, 5.0, (noisy.size, columns.size))
        y[flipped] = 1 - y[flipped]
        corrupted[bad] = True
    return X, y, corrupted, levels




def one_trial(trial: int, args) -> tuple[list[dict], list[dict]]:
    """One corrupted training set: beta-Cores over groups and random groups, scored after each addition."""
    import warnings

    warnings.simplefilter("ignore", rs.RobustStanWarning)
    X_train, y_train, X_test, y_test, groups = adult_with_groups(args.protocol)
    model = rs.glm("bernoulli", standardize=False)
    rows, chosen_rows = [], []
    rng = np.random.default_rng(trial)
    X, y, corrupted, levels = corrupt_groups(X_train, y_train, groups, rng)
    X_eval, y_eval = balanced(X_test, y_test, rng)
    data = {"X": X, "y": y, "prior_scale_b": np.ones(X.shape[1])}
    coreset = rs.coreset(model, data, size=args.iterations, method="beta_cores", divergence=rs.BetaD(args.beta),
                         groups=groups, draws=args.draws, iters_per_point=args.iters,
                         select_batch=len(np.unique(groups)), opt_batch=args.opt_batch, sampler="laplace",
                         inner=args.inner, seed=trial, show_progress=False)
    labels = coreset.group_labels
    for step in range(len(coreset.path)):
        current = coreset.at_step(step)
        chosen = np.flatnonzero(current.unit_weights)
        fit = current.sample("classical", seed=trial, **NUTS)
        rows.append({"protocol": args.protocol, "trial": trial, "method": "beta_cores", "iteration": step + 1,
                     "groups": chosen.size, "rows": current.indices.size,
                     "outlier_share": float(corrupted[current.indices].mean()),
                     "accuracy": accuracy(fit, X_eval, y_eval)})
    for label, weight in zip(labels, coreset.unit_weights):  # every group, chosen or not
        chosen_rows.append({"protocol": args.protocol, "trial": trial, "group": label, "chosen": bool(weight > 0),
                            "weight": weight, "outlier_level": levels[label], "rows": int(np.sum(groups == label))})
    for count in range(1, args.iterations + 1):
        picked = rng.choice(labels, count, replace=False)
        in_picked = np.isin(groups, picked)
        weights = np.where(in_picked, len(y) / in_picked.sum(), 0.0)
        kept = np.flatnonzero(weights)
        fit = model.sample({"X": X[kept], "y": y[kept], "prior_scale_b": np.ones(X.shape[1])},
                           weights=weights[kept], seed=trial, **NUTS)
        rows.append({"protocol": args.protocol, "trial": trial, "method": "random groups", "iteration": count,
                     "groups": count, "rows": kept.size, "outlier_share": float(corrupted[kept].mean()),
                     "accuracy": accuracy(fit, X_eval, y_eval)})
    print(f"trial {trial}: beta-Cores chose {np.count_nonzero(coreset.unit_weights)} groups, outlier levels "
          f"{sorted(levels[g] for g in labels[coreset.unit_weights > 0])}; accuracy "
          f"{rows[-args.iterations - 1]['accuracy']:.3f} against random {rows[-1]['accuracy']:.3f}", flush=True)
    return rows, chosen_rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--protocol", choices=("demographic", "paper"), default="demographic",
                        help="how the groups are formed (module docstring)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--beta", type=float, default=0.6)
    parser.add_argument("--iters", type=int, default=50, help="weight steps per added group (T)")
    parser.add_argument("--draws", type=int, default=50)
    parser.add_argument("--inner", choices=("beta", "classical"), default="beta",
                        help="the posterior drawn inside the loop (the authors' code: classical)")
    parser.add_argument("--opt-batch", type=int, default=8, help="groups per weight step")
    parser.add_argument("--workers", type=int, default=2, help="local worker processes (one trial per task)")
    add_address_argument(parser)
    parser.add_argument("--out", default="coreset_groups", help="folder under examples/results")
    args = parser.parse_args(argv)
    global OUT
    OUT = OUT.parent / args.out
    OUT.mkdir(parents=True, exist_ok=True)
    rs.glm("bernoulli", standardize=False).compile()  # once, before the workers load the cache
    rows, chosen_rows = [], []
    with cluster_pool(args.workers, args.address) as pool:
        for trial_rows, trial_chosen in pool.map(one_trial, range(args.trials), [args] * args.trials):
            rows.extend(trial_rows)
            chosen_rows.extend(trial_chosen)
    pd.DataFrame(rows).to_csv(OUT / "runs.csv", index=False)
    pd.DataFrame(chosen_rows).to_csv(OUT / "chosen_groups.csv", index=False)
    runs = pd.DataFrame(rows)
    summary = (runs.groupby(["method", "iteration"])[["accuracy", "outlier_share", "groups"]].median().reset_index())
    summary.to_csv(OUT / "summary.csv", index=False)
    print(summary.to_string(index=False))
    plot(runs)


def plot(runs: pd.DataFrame) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.6))
    for method, sub in runs.groupby("method"):
        q = sub.groupby("iteration").accuracy.quantile([0.25, 0.5, 0.75]).unstack()
        ax.plot(q.index, q[0.5], marker="o", label=method)
        ax.fill_between(q.index, q[0.25], q[0.75], alpha=0.2)
    ax.set_xlabel("iterations (groups selected)")
    ax.set_ylabel("balanced test accuracy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "accuracy.png", dpi=120)


if __name__ == "__main__":
    main()
