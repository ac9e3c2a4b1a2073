"""Row partitions placed where their tasks run, for every method over rows held in partitions
(Rob-ULA, robust VI, DP-VI, coresets).

The data: a built-in model's data dict whose row-indexed values are held in partitions
(:mod:`robust_stan.building.partitions`: Dask arrays, DataFrames or Series, lists of ``.npy``
or ``.parquet`` paths), the other values as usual. :class:`PlacedPartitions` computes each
partition on a worker of an :class:`rs.Cluster` and keeps it there (or loads it here without a
cluster) and runs a function where a partition is; what a run builds from a partition there
(its prepared Stan data, its gradient objects) is kept between steps by :func:`kept_on_worker`,
keyed by the run, the partition and what is kept, and forgotten when the run closes.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Callable, Mapping

import numpy as np

from ..building.data import PreparedData, prepare_data
from ..building.divergences import Divergence
from ..building.partitions import (
    Partitions,
    first_row,
    global_prior_scales,
    load_partition_value,
    split_partitions,
    unified_dask_values,
)
from ..common.cluster import Cluster, require_cluster
from ..common.errors import RobustStanInputError, RobustStanWarning
from ..gradients.program import GeneratedProgram

_ON_THIS_WORKER: dict[tuple[str, int, str], object] = {}  # (run, partition, what) -> what the run keeps of it there


def prepare_rows(spec, values: Mapping, divergence: Divergence, learning_rate: float) -> PreparedData:
    """Some of the rows (a partition, the first row, a coreset's) prepared as posterior data.
    Without the check that a beta loss leaves the data enough weight, which is about all the
    rows, not a part of them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RobustStanWarning)
        stan_data, scaling = prepare_data(spec, values, divergence, learning_rate, None, "posterior", None)
    return PreparedData(values, stan_data, scaling, divergence)


def partition_stan_data(program: GeneratedProgram, part: dict, shared: dict, divergence: Divergence,
                        learning_rate: float) -> dict:
    """A partition's rows with the shared values, prepared as the program's posterior data."""
    values = {**shared, **{name: load_partition_value(value) for name, value in part.items()}}
    return prepare_rows(program.spec, values, divergence, learning_rate).stan_data


def kept_on_worker(run: str, index: int, build: Callable[[], object], what: str = "main"):
    """What run ``run`` keeps of partition ``index`` in this process under the name ``what``
    (built on first use)."""
    kept = _ON_THIS_WORKER.get((run, index, what))
    if kept is None:
        kept = _ON_THIS_WORKER[(run, index, what)] = build()
    return kept


def _forget_run(run: str) -> None:
    for key in [key for key in _ON_THIS_WORKER if key[0] == run]:
        del _ON_THIS_WORKER[key]


class PlacedPartitions:
    """Row partitions placed where their tasks run: each computed on a worker of ``cluster`` and
    kept there (only futures are here), or loaded here without a cluster. ``call(k, function,
    ...)`` runs ``function(part_k, run, k, ...)`` where partition k is; ``submit`` runs any
    function on a cluster (or here), ``gather`` collects results."""

    def __init__(self, program: GeneratedProgram, partitions: Partitions, cluster: Cluster | None):
        self.cluster = require_cluster(cluster)
        self.rows = np.asarray(partitions.rows, dtype=int)
        self.offsets = np.concatenate([[0], np.cumsum(self.rows)])
        self.shared = partitions.shared
        self.run = uuid.uuid4().hex
        if cluster is None:  # a Dask chunk is computed here (.npy partitions need no Dask at all)
            self.parts = [{name: load_partition_value(v.compute() if hasattr(v, "dask") else v)
                           for name, v in part.items()} for part in partitions.parts]
        else:
            cluster.ship(program.compile())
            self.parts = [{name: cluster.client.compute(v) if hasattr(v, "dask") else v for name, v in part.items()}
                          for part in partitions.parts]

    @property
    def n(self) -> int:
        return int(self.offsets[-1])

    def submit(self, function: Callable, *arguments):
        return function(*arguments) if self.cluster is None else self.cluster.submit(function, *arguments)

    def call(self, index: int, function: Callable, *arguments):
        return self.submit(function, self.parts[index], self.run, index, *arguments)

    def gather(self, results: list) -> list:
        return list(results) if self.cluster is None else self.cluster.client.gather(list(results))

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The partition of each global row number and its row number inside that partition."""
        index = np.searchsorted(self.offsets, rows, side="right") - 1
        return index, rows - self.offsets[index]

    def close(self) -> None:
        """Forget what the run kept of its partitions (here and on the workers)."""
        _forget_run(self.run)
        if self.cluster is not None:
            self.cluster.client.run(_forget_run, self.run)


def prepare_partitioned(program: GeneratedProgram, data: Mapping, divergence: Divergence,
                        learning_rate: float, cluster: Cluster | None = None) -> tuple[Partitions, PreparedData]:
    """The checked partitions of a built-in model's ``data`` (with the glm's prior scales over
    all rows among the shared values), and its first row with the shared values, prepared (for
    the program's sizes and transforms, which the rows do not change, and a fit's constraining)."""
    if program.spec.formula is not None:
        raise RobustStanInputError("data: a model built from a formula reads a data frame held here; rows held in "
                                   "partitions are not offered for it yet (build X and y with the formula's "
                                   "encoding and use rs.glm without a formula)")
    if program.spec.standardize:
        raise RobustStanInputError("model: with the rows held in partitions, each partition would standardise by its "
                                   "own centre and scale; build the model with standardize=False")
    data = unified_dask_values(data)
    partitions = split_partitions(data)  # checked before any pass over the rows (but a Dask frame's row counts)
    if program.spec.family.class_labels and "K" not in partitions.shared:
        raise RobustStanInputError("data['K']: give the number of categories with rows held in partitions "
                                   "(each partition would infer its own)")
    partitions.shared.update(global_prior_scales(program.spec, data, cluster))
    return partitions, prepare_rows(program.spec, first_row(data, partitions), divergence, learning_rate)
