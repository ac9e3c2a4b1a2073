"""Checking a posterior's calibration: TARP coverage (Lemos et al. 2023, as modified by the
noise-aware DPVI paper, its algorithm 1 and appendix H.4) and calibration curves of
predictive probabilities (its section 4.4)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..common.errors import RobustStanInputError


def tarp_coverage(posterior_draws, truths, references, alphas=None) -> tuple[np.ndarray, np.ndarray]:
    """Expected coverage of credible balls around reference points, over simulated data sets.

    For data set k, f_k is the posterior mass closer to the reference than the truth is; the
    coverage of level 1 - alpha is the share of data sets with f_k < 1 - alpha (eqs. A62-A63 of
    Alrawajfeh, Jälkö and Honkela (2025, arXiv:2410.19371)). Distances are Euclidean, on the scale
    given (the paper's: the unconstrained scale). A calibrated posterior has coverage = 1 - alpha
    for every alpha.

    Parameters
    ----------
    posterior_draws : array_like
        (K, S, p): S draws of the approximate posterior for each of K data sets.
    truths : array_like
        (K, p): the parameters each data set was simulated from, drawn from the prior.
    references : array_like
        (K, p): one reference point per data set, drawn independently of the data.
    alphas : array_like or None, default None
        The levels; None is 101 evenly spaced levels from 0 to 1.

    Returns
    -------
    alphas : numpy.ndarray
        The levels.
    coverage : numpy.ndarray
        The coverage at each level.
    """
    draws = np.asarray(posterior_draws, dtype=float)
    truths, references = np.asarray(truths, dtype=float), np.asarray(references, dtype=float)
    if draws.ndim != 3:
        raise RobustStanInputError(f"posterior_draws: need shape (data sets, draws, parameters), got {draws.shape}")
    if truths.shape != (draws.shape[0], draws.shape[2]) or references.shape != truths.shape:
        raise RobustStanInputError(f"truths, references: need shape {(draws.shape[0], draws.shape[2])}, "
                                   f"got {truths.shape} and {references.shape}")
    alphas = np.linspace(0.0, 1.0, 101) if alphas is None else np.asarray(alphas, dtype=float)
    draw_distance = np.linalg.norm(draws - references[:, None, :], axis=2)
    truth_distance = np.linalg.norm(truths - references, axis=1)
    f = np.mean(draw_distance < truth_distance[:, None], axis=1)
    return alphas, coverage_curve(f, alphas)


def coverage_curve(f, alphas) -> np.ndarray:
    """The coverage of each level 1 - alpha given the data sets' f_k (eq. A62): the share of them
    with f_k < 1 - alpha. ``f`` (..., K) gives (..., len(alphas))."""
    f, alphas = np.asarray(f, dtype=float), np.asarray(alphas, dtype=float)
    return np.mean(f[..., None, :] < (1.0 - alphas)[:, None], axis=-1)


def coverage_rmse(alphas, coverage) -> float:
    """Root mean square distance of a coverage curve from the diagonal.

    sqrt(mean over alpha of (coverage(alpha) - (1 - alpha))^2), eq. 27 of Alrawajfeh, Jälkö and Honkela (2025, arXiv:2410.19371).

    Parameters
    ----------
    alphas : array_like
        The levels alpha.
    coverage : array_like
        The coverage at each level.

    Returns
    -------
    float
        The RMSE.
    """
    alphas, coverage = np.asarray(alphas, dtype=float), np.asarray(coverage, dtype=float)
    return float(np.sqrt(np.mean((coverage - (1.0 - alphas)) ** 2)))


def calibrated_rmse_reference(datasets: int, alphas=None, repeats: int = 4000, seed: int = 0) -> dict[str, float]:
    """The coverage RMSE (eq. 27) that a perfectly calibrated posterior gets from ``datasets``
    (K) simulated data sets. Its f_k are then independent U(0, 1) and its coverage curve is their
    empirical distribution function, whose noise alone gives E[RMSE^2] = mean over alpha of
    alpha (1 - alpha) / K (about 1 / (6 K)): 0.053 at K = 60, 0.018 at K = 500. So an RMSE
    measured on K data sets is to be read against this, not against a figure from another K.
    Returns the mean RMSE, its 5%, 50%, 95% and 99% quantiles over ``repeats`` simulated studies,
    and ``expected_mse``, the exact E[RMSE^2]."""
    if not (isinstance(datasets, (int, np.integer)) and datasets >= 1):
        raise RobustStanInputError(f"datasets: need a positive whole number, got {datasets!r}")
    alphas = np.linspace(0.0, 1.0, 101) if alphas is None else np.asarray(alphas, dtype=float)
    f = np.random.default_rng(seed).random((repeats, int(datasets)))
    coverage = coverage_curve(f, alphas)  # (repeats, alphas)
    rmse = np.sqrt(np.mean((coverage - (1.0 - alphas)) ** 2, axis=1))
    quantiles = dict(zip(("q05", "q50", "q95", "q99"), map(float, np.quantile(rmse, [0.05, 0.5, 0.95, 0.99]))))
    return {"mean": float(rmse.mean()), **quantiles, "expected_mse": float(np.mean(alphas * (1 - alphas)) / datasets)}


def calibration_curve(probabilities, outcomes, bins: int = 10, strategy: str = "uniform") -> pd.DataFrame:
    """Predicted probability against the observed share of positives, by bins of the prediction.

    Parameters
    ----------
    probabilities : array_like
        Predicted probabilities of the positive class.
    outcomes : array_like
        Observed outcomes, 0 or 1.
    bins : int, default 10
        Number of bins.
    strategy : {"uniform", "quantile"}, default "uniform"
        "uniform": equal-width bins of [0, 1] (empty bins left out); "quantile": bins of equal
        count (the predictions sorted and cut into runs whose sizes differ by at most one, as
        the noise-aware DPVI authors bin).

    Returns
    -------
    pandas.DataFrame
        Columns predicted, observed, count and error (observed - predicted), one row per bin.
    """
    p, y = np.asarray(probabilities, dtype=float).ravel(), np.asarray(outcomes, dtype=float).ravel()
    if p.shape != y.shape:
        raise RobustStanInputError(f"outcomes: need one per probability ({p.size}), got {y.size}")
    if np.any((p < 0) | (p > 1)):
        raise RobustStanInputError("probabilities: must lie in [0, 1]")
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 1:
        raise RobustStanInputError(f"bins: must be a positive integer, got {bins!r}")
    if strategy == "uniform":
        which = np.minimum((p * bins).astype(int), bins - 1)
    elif strategy == "quantile":
        if p.size < bins:
            raise RobustStanInputError(f"bins: {bins} equal-count bins need at least as many predictions, got {p.size}")
        which = np.empty(p.size, dtype=int)
        for k, run in enumerate(np.array_split(np.argsort(p, kind="stable"), bins)):
            which[run] = k
    else:
        raise RobustStanInputError(f"strategy: must be 'uniform' or 'quantile', got {strategy!r}")
    frame = pd.DataFrame({"bin": which, "predicted": p, "observed": y})
    table = frame.groupby("bin").agg(predicted=("predicted", "mean"), observed=("observed", "mean"),
                                     count=("observed", "size"))
    table["error"] = table["observed"] - table["predicted"]
    return table


def calibration_rmse(table: pd.DataFrame) -> float:
    """Root mean square of a calibration curve's errors, each bin weighted by its count.

    Parameters
    ----------
    table : pandas.DataFrame
        From :func:`calibration_curve`.

    Returns
    -------
    float
        The weighted RMSE.
    """
    return float(np.sqrt(np.average(table["error"] ** 2, weights=table["count"])))
