"""Timing shared by the benchmark scripts."""

from __future__ import annotations

import statistics
import time


def median_seconds(fn, repeats: int = 7) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls, after one warm-up call (first calls
    convert data and build caches)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
