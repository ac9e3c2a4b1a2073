"""Data for the beta-Cores experiments (Manousakas and Mascolo, section 4.2), from ../shared/data.

Adult (census income, >50K = 1) and Phishing websites (Result = 1 -> 1), features
standardised on the training rows and projected on their first 10 principal
components; the paper's contamination of a fraction F of the training rows:
two independent random subsets of F N rows, the first with a fixed random half of
the feature columns replaced by N(0, 5^2) noise, the second with its labels flipped;
and a class-balanced test set.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
ADULT_COLUMNS = ["age", "workclass", "fnlwgt", "education", "education_num", "marital_status", "occupation",
                 "relationship", "race", "sex", "capital_gain", "capital_loss", "hours_per_week", "native_country",
                 "income"]


def _adult_table(path: Path) -> pd.DataFrame:
    table = pd.read_csv(path, header=None, names=ADULT_COLUMNS, sep=",", skipinitialspace=True,
                        na_values="?", comment="|").dropna()
    table["income"] = table["income"].str.rstrip(".")
    return table


def adult_frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    """The raw Adult training and test tables (rows with a missing value dropped)."""
    return _adult_table(DATA_DIR / "adult" / "adult.data"), _adult_table(DATA_DIR / "adult" / "adult.test")


def _one_hot(train: pd.DataFrame, test: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    both = pd.get_dummies(pd.concat([train, test], keys=["train", "test"]), dtype=float)
    return both.loc["train"].to_numpy(float), both.loc["test"].to_numpy(float)


def principal_components(X_train: np.ndarray, X_test: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Both sets standardised with the training rows' means and sds, projected on the training
    rows' first ``k`` principal directions, each scaled to unit variance on the training rows."""
    mean, sd = X_train.mean(axis=0), X_train.std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)
    Z_train, Z_test = (X_train - mean) / sd, (X_test - mean) / sd
    _, s, vt = np.linalg.svd(Z_train, full_matrices=False)
    scale = s[:k] / np.sqrt(Z_train.shape[0])
    return Z_train @ vt[:k].T / scale, Z_test @ vt[:k].T / scale


def load_adult(k: int = 10) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """X_train, y_train, X_test, y_test: Adult on its first ``k`` principal components."""
    train, test = adult_frames()
    y_train = (train.pop("income") == ">50K").to_numpy(int)
    y_test = (test.pop("income") == ">50K").to_numpy(int)
    X_train, X_test = _one_hot(train, test)
    X_train, X_test = principal_components(X_train, X_test, k)
    return X_train, y_train, X_test, y_test


def load_phishing(k: int = 10, test_fraction: float = 0.2, seed: int = 0):
    """X_train, y_train, X_test, y_test: Phishing on its first ``k`` principal components (a
    fixed random split, the set having no test file)."""
    text = (DATA_DIR / "phishing" / "Training_Dataset.arff").read_text()
    body = text[text.lower().index("@data") + len("@data"):]
    table = np.array([[float(v) for v in line.split(",")] for line in body.split() if line.strip()])
    X, y = table[:, :-1], (table[:, -1] > 0).astype(int)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(test_fraction * len(y)))
    test, train = order[:n_test], order[n_test:]
    X_train, X_test = principal_components(X[train], X[test], k)
    return X_train, y[train], X_test, y[test]


def contaminate(X: np.ndarray, y: np.ndarray, fraction: float, rng: np.random.Generator):
    """The paper's corruption (section 4.2): returns X, y and a mask of the corrupted rows."""
    X, y = X.copy(), y.copy()
    n = len(y)
    count = int(round(fraction * n))
    columns = rng.choice(X.shape[1], X.shape[1] // 2, replace=False)
    noisy = rng.choice(n, count, replace=False)
    flipped = rng.choice(n, count, replace=False)
    X[np.ix_(noisy, columns)] = rng.normal(0.0, 5.0, (count, columns.size))
    y[flipped] = 1 - y[flipped]
    corrupted = np.zeros(n, dtype=bool)
    corrupted[noisy] = corrupted[flipped] = True
    return X, y, corrupted


def balanced(X: np.ndarray, y: np.ndarray, rng: np.random.Generator):
    """A class-balanced subset: every row of the smaller class and as many of the larger."""
    ones, zeros = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    m = min(ones.size, zeros.size)
    rows = np.concatenate([rng.choice(ones, m, replace=False), rng.choice(zeros, m, replace=False)])
    return X[rows], y[rows]


def predictive_probability(fit, X_test: np.ndarray) -> np.ndarray:
    """The posterior mean of P(y = 1 | x) under a logistic glm fit, for each test row."""
    alpha = fit.posterior["alpha"].reshape(-1)
    b = fit.posterior["b"].reshape(-1, X_test.shape[1])
    return (1 / (1 + np.exp(-(alpha[:, None] + b @ X_test.T)))).mean(axis=0)


def accuracy(fit, X_test: np.ndarray, y_test: np.ndarray) -> float:
    """Test accuracy of a logistic glm fit: the posterior mean probability above 1/2."""
    return float(np.mean((predictive_probability(fit, X_test) > 0.5) == y_test))


def auc(scores: np.ndarray, y: np.ndarray) -> float:
    """Area under the ROC curve: the share of (positive, negative) pairs whose positive scores
    higher, ties counted one half (the Mann-Whitney U over n_1 n_0, from mid-ranks)."""
    ranks = stats.rankdata(scores)
    positive = np.asarray(y) == 1
    n_1, n_0 = int(positive.sum()), int((~positive).sum())
    return float((ranks[positive].sum() - n_1 * (n_1 + 1) / 2) / (n_1 * n_0))
