"""Process pools for running several fits or samplers side by side."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

from threadpoolctl import threadpool_limits

from .errors import require_count


def process_pool(jobs: int) -> ProcessPoolExecutor:
    """A pool of ``jobs`` worker processes, each limited to one BLAS thread.

    NumPy's BLAS starts a thread per core in every process, so several processes
    on a few cores fight over them and each call slows several-fold. Use it as
    ``with process_pool(jobs) as pool: ...``.
    """
    return ProcessPoolExecutor(max_workers=require_count("jobs", jobs), initializer=threadpool_limits, initargs=(1,))
