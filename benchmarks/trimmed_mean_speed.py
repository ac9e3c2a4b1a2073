"""The trimmed mean (Rob-ULA's default estimator) against the two-point partition of every
column it replaced from BRACKETED_FROM rows on, at the sizes Rob-ULA meets (one partition of
the cluster benchmark: 500,000 rows x 22; the README's in-memory cases).

Gradient-like columns: N(0, 1) with a tenth of the rows shifted by 50, epsilon 0.15. Prints the
median time of each over 7 calls, their ratio, and the largest difference of the two means
(the same kept values, summed in another order).

    python benchmarks/trimmed_mean_speed.py
"""

from __future__ import annotations

import numpy as np

from _timing import median_seconds
from robust_stan.methods.rob_ula.estimators import BRACKETED_FROM, partitioned_trimmed_means, trimmed_mean

EPSILON = 0.15


def partitioned_means(G: np.ndarray, epsilon: float) -> np.ndarray:
    """The previous trimmed mean: a two-point partition of every column."""
    return partitioned_trimmed_means(G, int(epsilon * G.shape[0]))


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"trimmed mean at epsilon {EPSILON}; the bracketed selection is used from {BRACKETED_FROM:,} rows")
    print(f"{'rows':>9} {'columns':>7} {'partition':>10} {'trimmed_mean':>12} {'ratio':>6} {'largest difference':>18}")
    for n, d in [(1_250, 200), (5_000, 22), (10_000, 20), (15_000, 22), (20_000, 22), (30_000, 22), (100_000, 22), (100_000, 200),
                 (500_000, 22)]:
        G = rng.normal(size=(n, d))
        G[rng.choice(n, n // 10, replace=False)] += 50.0
        before = median_seconds(lambda: partitioned_means(G, EPSILON))
        after = median_seconds(lambda: trimmed_mean(G, EPSILON))
        difference = np.abs(trimmed_mean(G, EPSILON).mean - partitioned_means(G, EPSILON)).max()
        print(f"{n:>9,} {d:>7} {before * 1e3:>8.1f}ms {after * 1e3:>10.1f}ms {before / after:>6.2f} {difference:>18.1e}")


if __name__ == "__main__":
    main()
