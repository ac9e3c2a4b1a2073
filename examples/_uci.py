"""Data for the robust-VI benchmarks of Futami, Sato and Sugiyama (2018), from ../shared/data.

Loaders for the UCI regression sets (Hernandez-Lobato and Adams's layout), spam and EEG
eye state, and the paper's contamination: in a fraction of the training rows, noise
N(mu_j, 2 sigma_j) (mu_j, sigma_j the column's mean and sd) is added to a random subset of
input columns (half of them for regression, a quarter for classification) and to the
output (regression) or the label is flipped (classification).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

import robust_stan as rs

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
REGRESSION_SETS = {"housing": "bostonHousing", "concrete": "concrete", "power_plant": "power-plant",
                   "protein": "protein-tertiary-structure"}


def load_regression(name: str, data_dir: Path = DATA_DIR) -> tuple[np.ndarray, np.ndarray]:
    """Inputs (n, D) and output (n,) of a UCI regression set."""
    folder = data_dir / "UCI_Datasets" / REGRESSION_SETS[name] / "data"
    table = np.loadtxt(folder / "data.txt")
    features = np.loadtxt(folder / "index_features.txt", dtype=int, ndmin=1)
    target = int(np.loadtxt(folder / "index_target.txt", dtype=int))
    return table[:, features], table[:, target]


def load_classification(name: str, data_dir: Path = DATA_DIR) -> tuple[np.ndarray, np.ndarray]:
    """Inputs (n, D) and 0/1 labels of spam or eeg."""
    if name == "spam":
        table = np.loadtxt(data_dir / "spambase" / "spambase.data", delimiter=",")
    elif name == "eeg":
        text = (data_dir / "eeg_eye_state" / "EEG_Eye_State.arff").read_text()
        body = text[text.upper().index("@DATA") + len("@DATA"):]
        table = np.array([[float(v) for v in line.split(",")] for line in body.split() if line.strip()])
    else:
        raise ValueError(f"unknown classification set {name!r}; choose spam or eeg")
    return table[:, :-1], table[:, -1].astype(int)


def split(n: int, test_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    order = rng.permutation(n)
    n_test = int(round(test_fraction * n))
    return order[n_test:], order[:n_test]


def contaminate_inputs(X: np.ndarray, rows: np.ndarray, n_columns: int, rng: np.random.Generator) -> np.ndarray:
    """Add N(mu_j, 2 sigma_j) noise to ``n_columns`` random columns j of the given rows."""
    X = X.copy()
    columns = rng.choice(X.shape[1], size=n_columns, replace=False)
    mu, sigma = X.mean(axis=0), X.std(axis=0)
    for j in columns:
        X[rows, j] += rng.normal(mu[j], 2 * sigma[j], size=rows.size)
    return X


# The paper's network: two hidden layers of this many ReLU units (rs.mlp's H), started near
# zero rather than at the driver's default.
HIDDEN = 20
NETWORK_START = {"init_radius": 0.5, "init_sd": 0.1}


def rows_of(data: dict, rows: np.ndarray) -> dict:
    """The data restricted to some rows (X and y; other entries such as H and P kept)."""
    return dict(data, X=data["X"][rows], y=data["y"][rows])


def standardiser(X: np.ndarray):
    """Column means and sds of X (sd 1 for constant columns) and a function applying them."""
    mean, sd = X.mean(axis=0), X.std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)
    return lambda Z: (Z - mean) / sd


def table_beside_paper(runs: pd.DataFrame, value: str, paper: dict, labels: tuple[str, ...]) -> pd.DataFrame:
    """Mean and sd over splits of ``value`` per (dataset, contamination) and method, with the
    paper's figures (``paper[(dataset, contamination)]``, in the order of ``labels``) beside them."""
    table = runs.pivot_table(index=["dataset", "contamination"], columns="method", values=value,
                             aggfunc=["mean", "std"])
    for setting, figures in paper.items():
        if setting in table.index:
            for label, figure in zip(labels, figures):
                table.loc[setting, ("paper", label)] = figure
    return table


def paper_learning_rate(divergence) -> float:
    """Futami et al.'s scaling: their beta loss is ours times 1 + beta (DESIGN.md section 2),
    so w = 1 + beta gives their objective; their gamma loss is our decomposable form as it is."""
    return 1 + divergence.beta if isinstance(divergence, rs.BetaD) else 1.0


def plot_by_contamination(runs: pd.DataFrame, value: str, ylabel: str, path: Path) -> None:
    """One panel per data set: ``value`` (mean and sd over splits) against the contaminated
    fraction, a line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(runs["dataset"]))
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.5), squeeze=False)
    for ax, name in zip(axes[0], names):
        mine = runs[runs["dataset"] == name].groupby(["method", "contamination"])[value].agg(["mean", "std"])
        for method in mine.index.get_level_values(0).unique():
            part = mine.loc[method]
            ax.errorbar(part.index, part["mean"], yerr=part["std"], marker="o", capsize=3, label=method)
        ax.set_title(name)
        ax.set_xlabel("fraction of contaminated training rows")
        ax.set_ylabel(ylabel)
    axes[0, 0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
