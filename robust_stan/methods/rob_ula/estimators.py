"""Robust mean estimators for the rows of an (n, d) array of per-example gradients.

Each estimator is called as ``estimator(G, epsilon)`` with epsilon in [0, 0.5)
the assumed fraction of corrupted rows, and returns an :class:`EstimateResult`:
the estimate and the fraction of rows it kept. ``lrv`` is Algorithm 2 of
Bhatia et al. (2019) (after Lai, Rao and Vempala 2016) with its outlier
truncation (Algorithm 3); the others are the usual alternatives.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...common.errors import RobustStanInputError


@dataclass(frozen=True)
class EstimateResult:
    """A robust mean (d,) and the fraction of rows used for it."""

    mean: np.ndarray
    kept_fraction: float = 1.0


def check_rows(G, epsilon) -> tuple[np.ndarray, float]:
    """G as a finite (n, d) float array with n >= 1, and epsilon in [0, 0.5)."""
    G = np.asarray(G, dtype=float)
    if G.ndim != 2 or G.shape[0] < 1:
        raise RobustStanInputError(f"G: need a 2-D array (n, d) with n >= 1, got shape {G.shape}")
    if not np.all(np.isfinite(G)):
        raise RobustStanInputError("G: contains non-finite values")
    if not (isinstance(epsilon, (int, float, np.floating)) and 0 <= epsilon < 0.5):
        raise RobustStanInputError(f"epsilon: must lie in [0, 0.5), got {epsilon!r}")
    return G, float(epsilon)


def _keep_count(n: int, epsilon: float) -> int:
    """ceil((1 - epsilon)^2 n): how many points the truncation keeps (at least 1)."""
    return max(1, min(n, math.ceil((1 - epsilon) ** 2 * n - 1e-9)))


def shortest_interval(x: np.ndarray, keep: int) -> np.ndarray:
    """Boolean mask of the ``keep`` points of x in the shortest interval containing that many."""
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    widths = sorted_x[keep - 1:] - sorted_x[: x.size - keep + 1]
    start = int(np.argmin(widths))
    mask = np.zeros(x.size, dtype=bool)
    mask[order[start:start + keep]] = True
    return mask


def shortest_interval_means(G: np.ndarray, keep: int) -> np.ndarray:
    """For each column of G, the mean of its ``keep`` values in the shortest interval
    containing that many (the values :func:`shortest_interval` selects; all columns in one sort)."""
    n, d = G.shape
    sorted_columns = G.T.copy(order="C")                   # (d, n): each row contiguous, sorted in place
    sorted_columns.sort(axis=1)
    widths = sorted_columns[:, keep - 1:] - sorted_columns[:, : n - keep + 1]
    starts = np.argmin(widths, axis=1)                     # the first shortest, as shortest_interval
    # every window's sum in one pass over the flat array: reduceat sums [start, start + keep) of
    # each row (and the stretches between windows, dropped); the last window may end the array
    bounds = (np.arange(d)[:, None] * n + np.stack([starts, starts + keep], axis=1)).ravel()
    if bounds[-1] == n * d:
        bounds = bounds[:-1]
    return np.add.reduceat(sorted_columns.ravel(), bounds)[::2] / keep


def outlier_truncation(G: np.ndarray, epsilon: float) -> np.ndarray:
    """Algorithm 3: boolean mask of the rows kept.

    1-D: the (1 - epsilon)^2 fraction in the shortest interval. d-D: the same
    fraction closest to the centre a, whose coordinates are the means of each
    coordinate's 1-D truncation.
    """
    n, d = G.shape
    keep = _keep_count(n, epsilon)
    if keep == n:
        return np.ones(n, dtype=bool)
    if d == 1:
        return shortest_interval(G[:, 0], keep)
    offsets = G - shortest_interval_means(G, keep)
    distances = np.einsum("ij,ij->i", offsets, offsets)
    cut = np.partition(distances, keep - 1)[keep - 1]     # the keep-th smallest distance
    mask = distances < cut
    at_cut = np.flatnonzero(distances == cut)              # ties at the cut: the first rows in order
    mask[at_cut[: keep - mask.sum()]] = True
    return mask


def _lrv_mean(G: np.ndarray, epsilon: float) -> tuple[np.ndarray, float]:
    kept = outlier_truncation(G, epsilon)
    X = G if kept.all() else G[kept]
    mean = X.mean(axis=0)
    d = G.shape[1]
    if d == 1:
        return mean, kept.mean()
    centred = X - mean
    _, vectors = np.linalg.eigh(centred.T @ centred)  # the covariance's eigenvectors, ascending
    top = vectors[:, d - d // 2:]                      # V: the top floor(d/2) principal directions
    mean_top, _ = _lrv_mean(X @ top, epsilon)          # recurse on the projection onto V
    # W = the other directions: W W^T mean = mean - V V^T mean, so W itself is never formed
    return mean + top @ (mean_top - top.T @ mean), kept.mean()


def lrv(G, epsilon: float) -> EstimateResult:
    """Algorithm 2 (RobustGradientEstimate), read literally: truncate (Algorithm 3),
    split into the top floor(d/2) principal directions of the kept rows (recursed
    on, truncating again at every level) and the rest (plain mean), and add the two.
    Each level keeps ceil((1 - epsilon)^2 m) of its m rows (ties in distance broken
    by row order), so about (1 - epsilon)^(2 log2 d) of the rows reach the bottom.
    kept_fraction: the share of rows kept by the first truncation."""
    G, epsilon = check_rows(G, epsilon)
    mean, kept = _lrv_mean(G, epsilon)
    return EstimateResult(mean, float(kept))


def lrv_once(G, epsilon: float) -> EstimateResult:
    """``lrv`` truncating at the top level only. Without
    truncation below the top, each level's V and W parts add up to the plain mean
    of its rows, so this is exactly the mean of the rows Algorithm 3 keeps."""
    G, epsilon = check_rows(G, epsilon)
    kept = outlier_truncation(G, epsilon)
    return EstimateResult(G[kept].mean(axis=0), float(kept.mean()))


def row_trimmed_mean(G, epsilon: float) -> EstimateResult:
    """The mean of the rows left after dropping the floor(epsilon n) rows farthest (in Euclidean
    distance) from the coordinate-wise median: a row is judged as a whole, and only as many rows
    are dropped as epsilon says are corrupted. When the corrupted rows are the farthest, this is
    exactly the mean of the clean rows, whatever the shape of their distribution: unlike the
    coordinate-wise trimmed mean it cuts no clean rows from the side opposite to one-sided
    outliers, and unlike ``lrv_once`` it keeps (1 - epsilon) n rows, not (1 - epsilon)^2 n, so it
    does not trim the clean rows' own tails. Ties in distance at the cut are broken by row order.
    kept_fraction: the share of rows kept."""
    G, epsilon = check_rows(G, epsilon)
    n = G.shape[0]
    cut = int(epsilon * n)
    if not cut:
        return EstimateResult(G.mean(axis=0), 1.0)
    offsets = G - np.median(G, axis=0)
    distances = np.einsum("ij,ij->i", offsets, offsets)
    keep = n - cut
    limit = np.partition(distances, keep - 1)[keep - 1]  # the keep-th smallest distance
    kept = distances < limit
    at_limit = np.flatnonzero(distances == limit)
    kept[at_limit[: keep - np.count_nonzero(kept)]] = True
    return EstimateResult(G[kept].mean(axis=0), keep / n)


def mean(G, epsilon: float = 0.0) -> EstimateResult:
    """The plain mean (ULA); keeps every row."""
    G, _ = check_rows(G, epsilon)
    return EstimateResult(G.mean(axis=0), 1.0)


def coordinate_median(G, epsilon: float = 0.0) -> EstimateResult:
    """Coordinate-wise median; kept_fraction 1 (every row takes part)."""
    G, _ = check_rows(G, epsilon)
    return EstimateResult(np.median(G, axis=0), 1.0)


def trimmed_mean(G, epsilon: float) -> EstimateResult:
    """Coordinate-wise mean after cutting a fraction epsilon from each end (the values
    scipy.stats.trim_mean keeps); kept_fraction is the share of values left per coordinate."""
    G, epsilon = check_rows(G, epsilon)
    n = G.shape[0]
    cut = int(epsilon * n)
    if not cut:
        return EstimateResult(G.mean(axis=0), 1.0)
    if n < BRACKETED_FROM:  # a two-point partition of every column: as quick as a sort here
        means = partitioned_trimmed_means(G, cut)
    else:
        means = _bracketed_trimmed_means(G, cut)
    return EstimateResult(means, (n - 2 * cut) / n)


def partitioned_trimmed_means(values: np.ndarray, cut: int) -> np.ndarray:
    """The mean of order statistics cut .. n - cut - 1 along axis 0 (of each column, or of a
    vector), by a two-point partition."""
    n = values.shape[0]
    return np.partition(values, [cut, n - cut - 1], axis=0)[cut:n - cut].mean(axis=0)


BRACKETED_FROM = 20_000  # rows; below this the partition is as quick (benchmarks/trimmed_mean_speed.py)
_SAMPLE_ROWS = 8192


def _bracketed_trimmed_means(G: np.ndarray, cut: int) -> np.ndarray:
    """Each column's mean of its order statistics cut .. n - cut - 1, exactly, with the two order
    statistics found as in Floyd and Rivest's selection: the values of 8,192 evenly spaced rows
    bracket each one (5 binomial sds either side, a heuristic: a bracket that misses is detected
    by counting), so only the few values inside a bracket are partitioned and every value between
    the brackets is summed in one pass. A column whose brackets miss or
    overlap (heavy ties, an adversarial row order) is partitioned whole. Quicker than the
    two-point partition of every column on large n (benchmarks/ measure it)."""
    n, d = G.shape
    columns = np.ascontiguousarray(G.T)
    rows = np.linspace(0, n - 1, min(_SAMPLE_ROWS, n)).astype(np.intp)
    sample = np.sort(columns[:, rows], axis=1)
    low_brackets, high_brackets = _sample_bracket(sample, cut, n), _sample_bracket(sample, n - cut - 1, n)
    means = np.empty(d)
    for j in range(d):
        mean = _column_trimmed_mean(columns[j], cut, low_brackets[:, j], high_brackets[:, j])
        means[j] = mean if mean is not None else partitioned_trimmed_means(columns[j], cut)
    return means


def _sample_bracket(sample: np.ndarray, rank: int, n: int) -> np.ndarray:
    """(2, d): per column, values of the sorted ``sample`` (d, s) below and above which the
    rank-th smallest (0-based) of n values lies, 5 binomial sds plus 2 sample positions apart
    from the sample's own estimate of it (-inf and +inf past its ends)."""
    d, s = sample.shape
    q = rank / (n - 1)
    margin = 5 * math.sqrt(s * q * (1 - q)) + 2
    low, high = math.floor(q * (s - 1) - margin), math.ceil(q * (s - 1) + margin)
    return np.vstack([sample[:, low] if low >= 0 else np.full(d, -np.inf),
                      sample[:, high] if high < s else np.full(d, np.inf)])


def _column_trimmed_mean(x: np.ndarray, cut: int, low_bracket: np.ndarray, high_bracket: np.ndarray) -> float | None:
    """The mean of order statistics cut .. n - cut - 1 of x, given brackets [a1, b1] and
    [a2, b2] of the first and the last of them (None when a bracket misses or b1 >= a2)."""
    (a1, b1), (a2, b2) = low_bracket, high_bracket
    if not b1 < a2:
        return None
    n = x.size
    low_side, high_side = x <= b1, x >= a2
    low_band = np.compress(low_side & (x >= a1), x)
    high_band = np.compress(high_side & (x <= b2), x)
    below = np.count_nonzero(low_side) - low_band.size  # values under a1
    above = np.count_nonzero(high_side) - high_band.size  # values over b2
    low_rank, high_rank = cut - below, (n - cut - 1) - (n - above - high_band.size)
    if not (0 <= low_rank < low_band.size and 0 <= high_rank < high_band.size):
        return None
    first = np.partition(low_band, low_rank)[low_rank]  # the smallest value kept
    last = np.partition(high_band, high_rank)[high_rank]  # the largest
    between = np.compress(~(low_side | high_side), x).sum()  # every value in (b1, a2) is kept
    # (NumPy's pairwise sum: unlike a BLAS dot, the same bits whatever the thread count)
    # values equal to first (or last) fill the kept positions the values under (over) them leave
    first_kept = below + np.count_nonzero(low_band <= first) - cut
    last_kept = above + np.count_nonzero(high_band >= last) - cut
    total = (between + low_band[low_band > first].sum() + high_band[high_band < last].sum()
             + first_kept * first + last_kept * last)
    return float(total / (n - 2 * cut))


def median_of_means(G, epsilon: float, n_blocks: int | None = None, seed: int = 0) -> EstimateResult:
    """Coordinate-wise median of block means. Blocks: 2 ceil(epsilon n) + 1 by default
    (so corrupted rows spoil fewer than half the blocks), capped at n; rows are
    shuffled with ``seed`` first."""
    G, epsilon = check_rows(G, epsilon)
    n = G.shape[0]
    k = n_blocks if n_blocks is not None else 2 * math.ceil(epsilon * n) + 1
    k = int(min(max(k, 1), n))
    order = np.random.default_rng(seed).permutation(n)
    block_means = np.array([G[block].mean(axis=0) for block in np.array_split(order, k)])
    return EstimateResult(np.median(block_means, axis=0), 1.0)


def geometric_median(G, epsilon: float = 0.0, tol: float = 1e-10, max_iter: int = 500) -> EstimateResult:
    """Weiszfeld's iteration with Vardi and Zhang's step at data points (it never divides by 0)."""
    G, _ = check_rows(G, epsilon)
    y = np.median(G, axis=0)
    scale = max(float(np.max(np.abs(G))), 1e-300)
    for _ in range(max_iter):
        dist = np.linalg.norm(G - y, axis=1)
        at_point = dist <= 1e-14 * scale
        w = 1.0 / np.where(at_point, 1.0, dist)
        w[at_point] = 0.0
        t = (w[:, None] * G).sum(axis=0) / w.sum() if w.sum() > 0 else y
        eta = int(at_point.sum())
        if eta:
            r = np.linalg.norm((w[:, None] * (G - y)).sum(axis=0))
            step = min(1.0, float(eta / r)) if r > 0 else 1.0
            new = (1 - step) * t + step * y
        else:
            new = t
        if np.linalg.norm(new - y) <= tol * max(float(np.linalg.norm(y)), 1.0):
            y = new
            break
        y = new
    return EstimateResult(y, 1.0)


def estimate_each(G: np.ndarray, estimate: Callable, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """``estimate`` on each state's per-example gradients G[c] (states, n, d): the robust means
    (states, d) and kept shares; NaN for a state whose gradients are not all finite."""
    means = np.full((G.shape[0], G.shape[2]), np.nan)
    kept = np.full(G.shape[0], np.nan)
    for c in range(G.shape[0]):
        if np.all(np.isfinite(G[c])):
            with np.errstate(over="ignore", invalid="ignore"):
                result = estimate(G[c], epsilon)
            means[c], kept[c] = result.mean, result.kept_fraction
    return means, kept


ESTIMATORS: dict[str, Callable] = {
    "lrv": lrv,
    "lrv_once": lrv_once,
    "mean": mean,
    "coordinate_median": coordinate_median,
    "trimmed_mean": trimmed_mean,
    "row_trimmed_mean": row_trimmed_mean,
    "median_of_means": median_of_means,
    "geometric_median": geometric_median,
}


def get_estimator(estimator) -> Callable[[np.ndarray, float], EstimateResult]:
    """An estimator by name, or a callable ``(G, epsilon)`` returning an EstimateResult or an array."""
    if isinstance(estimator, str):
        if estimator not in ESTIMATORS:
            raise RobustStanInputError(
                f"estimator: unknown estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)} or pass a callable")
        return ESTIMATORS[estimator]
    if not callable(estimator):
        raise RobustStanInputError(f"estimator: expected a name or a callable, got {estimator!r}")

    def wrapped(G, epsilon):
        result = estimator(G, epsilon)
        return result if isinstance(result, EstimateResult) else EstimateResult(np.asarray(result, float), 1.0)

    wrapped.__name__ = getattr(estimator, "__name__", "custom")
    return wrapped
