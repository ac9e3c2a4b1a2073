"""Where the examples' independent runs go: an rs.Cluster (a new local one, or a running
scheduler's address), used like the process pools the examples had before.

    with cluster_pool(workers=2, address=None) as pool:
        results = pool.map(function, xs, ys)           # in order, like Executor.map (a list)
        future = pool.submit(function, x, y)            # future.result()
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from functools import partial

import cloudpickle

import robust_stan as rs


def add_address_argument(parser) -> None:
    parser.add_argument("--address", default=None,
                        help="a running Dask scheduler (dask scheduler; dask worker ADDRESS) instead of a local cluster")


def _star(function, arguments):
    return function(*arguments)


class ClusterPool:
    """``map`` and ``submit`` of an executor, on an :class:`rs.Cluster`."""

    def __init__(self, cluster: rs.Cluster):
        self.cluster = cluster

    def map(self, function, *iterables) -> list:
        return self.cluster.map(partial(_star, function), list(zip(*iterables)), getattr(function, "__name__", "tasks"))

    def submit(self, function, *arguments):
        return self.cluster.client.submit(function, *arguments, pure=False)


@contextmanager
def cluster_pool(workers: int, address: str | None = None):
    """A :class:`ClusterPool` on a new local cluster of ``workers`` processes, or on the scheduler
    at ``address``. The examples' own helper modules travel with the tasks (workers elsewhere
    cannot import them)."""
    for name in ("_synthetic_experiment", "_uci", "_coreset_data", "_timing"):
        if name in sys.modules:
            cloudpickle.register_pickle_by_value(sys.modules[name])
    cluster = rs.Cluster(address=address) if address else rs.Cluster(workers=workers)
    try:
        yield ClusterPool(cluster)
    finally:
        cluster.close()
