"""The process pool the examples use: one BLAS thread per worker, checked arguments."""

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from robust_stan.common.errors import RobustStanInputError
from robust_stan.common.parallel import process_pool


def blas_threads(_task=None) -> list[int]:
    """The BLAS thread counts of the process that runs it (a pool task)."""
    np.ones(2) @ np.ones(2)  # BLAS loaded
    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


def test_workers_use_one_blas_thread():
    with process_pool(2) as pool:
        per_worker = list(pool.map(blas_threads, range(2)))
    assert all(threads and set(threads) == {1} for threads in per_worker), per_worker


@pytest.mark.parametrize("jobs", [0, -1, 1.5, "2"])
def test_jobs_is_checked(jobs):
    with pytest.raises(RobustStanInputError, match="jobs"):
        process_pool(jobs)
