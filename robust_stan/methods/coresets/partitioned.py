"""beta-Cores (and SparseVI) over rows held in partitions: the batches' gains are computed where
their partitions are, and only reductions travel (the issue's "correlations and the small
coreset's gains").

Each greedy step of :func:`~robust_stan.methods.coresets.construction.greedy_coreset` draws S parameters from
the coreset posterior and asks for gains of the coreset's M units and of a uniform batch of B
units. Here:

- the coreset's rows are fetched to this process once, when a row joins, so the weighted
  posterior (Laplace or NUTS) and the coreset's gains (S, M) are computed here on M rows;
- the batch rows are looked up in their partitions; each partition computes its batch rows'
  gains at the S draws where it lives and keeps them there, and sends back per kind of gain the
  centred sum over its batch rows (S,) and each batch row's mean gain (one number per row); for
  a selection step it then receives the residual (S,) and returns each of its batch rows'
  correlation with it (eq. 14).

So a weight step moves 2 S numbers per partition each way and a selection step B more; nothing
that travels scales with the number of rows N (this process keeps the N weights, one number a
row). The draws and the choices are the in-memory run's (the same random numbers in the same
order); only the order of the batch sums' additions differs. A partition's batch gains are a
:class:`~robust_stan.methods.coresets.construction.UnitGains` kept on its worker, so the reductions are the
in-memory ones, computed there.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ...building.data import with_switches
from ...building.divergences import Divergence
from ...building.partitions import load_partition_value
from ...common.cluster import Cluster
from ...gradients.program import GeneratedProgram
from ..partition_placement import (
    PlacedPartitions,
    kept_on_worker,
    partition_stan_data,
    prepare_partitioned,
    prepare_rows,
)
from .construction import UnitGains
from .targets import CoresetTarget


def partition_batch_gains(part: dict, run: str, index: int, program: GeneratedProgram, shared: dict,
                          divergence: Divergence, learning_rate: float, inner: str, rows: np.ndarray,
                          columns: np.ndarray) -> UnitGains:
    """The gains of partition ``index``'s rows ``rows`` at the constrained draws ``columns``, as the
    batch of a :class:`UnitGains` (run where the partition is; its target is kept for the run)."""
    target = kept_on_worker(run, index, lambda: CoresetTarget(
        program, partition_stan_data(program, part, shared, divergence, learning_rate), divergence, inner, "laplace"))
    return UnitGains(target.gains(rows, columns), 0)


def batch_reductions(gains: UnitGains, kinds) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per kind of gain: the batch's centred sum (S,) and each batch row's mean gain."""
    return {kind: (gains.batch_centred_sum(kind), gains.batch_means(kind)) for kind in kinds}


def batch_correlations(gains: UnitGains, kind: str, residual: np.ndarray) -> np.ndarray:
    """Each batch row's Corr_n with ``residual`` (eq. 14)."""
    return gains.batch_correlations(kind, residual)


def partition_rows(part: dict, run: str, index: int, rows: np.ndarray) -> dict[str, np.ndarray]:
    """Partition ``index``'s raw values of its rows ``rows``."""
    return {name: load_partition_value(value, rows) for name, value in part.items()}


class PartitionedUnitGains:
    """What greedy_coreset needs of the gains (the interface of
    :class:`~robust_stan.methods.coresets.construction.UnitGains`), the batch's part computed where its rows are."""

    def __init__(self, coreset_gains: dict[str, np.ndarray], placed: PlacedPartitions, batch_size: int,
                 pieces: list[tuple[np.ndarray, object]]):
        self._coreset, self._placed, self._pieces = coreset_gains, placed, pieces
        self.batch_size = batch_size
        reductions = placed.gather([placed.submit(batch_reductions, gains, list(coreset_gains)) for _, gains in pieces])
        self._sums = {kind: sum(r[kind][0] for r in reductions) for kind in coreset_gains}
        self._means = {kind: self._in_batch_order([r[kind][1] for r in reductions]) for kind in coreset_gains}

    def _in_batch_order(self, values: list[np.ndarray]) -> np.ndarray:
        out = np.empty(self.batch_size)
        for (positions, _), piece in zip(self._pieces, values):
            out[positions] = piece
        return out

    def coreset(self, kind: str) -> np.ndarray:
        return self._coreset[kind]

    def batch_centred_sum(self, kind: str) -> np.ndarray:
        return self._sums[kind]

    def batch_correlations(self, kind: str, residual: np.ndarray) -> np.ndarray:
        placed = self._placed
        found = placed.gather([placed.submit(batch_correlations, gains, kind, residual) for _, gains in self._pieces])
        return self._in_batch_order(found)

    def batch_means(self, kind: str) -> np.ndarray:
        return self._means[kind]


class PartitionedCoresetTarget(CoresetTarget):
    """A :class:`CoresetTarget` of a built-in model whose rows are held in partitions: the rows of
    the coreset are fetched here as they join (``local_rows``, their row numbers, sorted; the
    data's first row is fetched from the start), the batches' gains are computed where their
    partitions are (module docstring); ``local_prepared`` holds the fetched rows as prepared data
    (the coreset result's ``prepared``). Units are rows."""

    def __init__(self, program: GeneratedProgram, data: Mapping, divergence: Divergence, inner: str, sampler: str,
                 learning_rate: float, cluster: Cluster | None):
        partitions, first = prepare_partitioned(program, data, divergence, learning_rate, cluster)
        self.placed = PlacedPartitions(program, partitions, cluster)
        self._partitioned_names = sorted(partitions.parts[0])
        self.local_rows = np.zeros(1, dtype=int)
        self.local_values = {name: np.asarray(first.data[name]) for name in self._partitioned_names}
        self.local_prepared = first
        super().__init__(program, first.stan_data, divergence, inner, sampler)
        self.n_rows = self.n_units = self.placed.n

    def fetch(self, rows) -> None:
        """Bring the raw values of ``rows`` here (those not here yet), and prepare the local rows again."""
        missing = np.setdiff1d(np.asarray(rows, dtype=int), self.local_rows)
        if missing.size == 0:
            return
        index, inside = self.placed.locate(missing)
        parts = np.unique(index)
        fetched = self.placed.gather([self.placed.call(int(k), partition_rows, inside[index == k]) for k in parts])
        order_rows = np.concatenate([self.local_rows, *[missing[index == k] for k in parts]])
        order = np.argsort(order_rows, kind="stable")
        for name in self._partitioned_names:
            stacked = np.concatenate([self.local_values[name], *[piece[name] for piece in fetched]])
            self.local_values[name] = stacked[order]
        self.local_rows = order_rows[order]
        self.local_prepared = prepare_rows(self.spec, {**self.placed.shared, **self.local_values}, self.divergence,
                                            self.learning_rate)
        self.stan_data = with_switches(self.local_prepared.stan_data, pointwise=False, divergence=self.divergence)

    def rows_of(self, units, weights=None):
        """The positions of ``units`` (row numbers) among the local rows, fetching those not here yet."""
        units = np.asarray(units, dtype=int)
        self.fetch(units)
        positions = np.searchsorted(self.local_rows, units)
        return positions if weights is None else (positions, np.asarray(weights, dtype=float))

    # the same interface as UnitGains, with the gains left on the workers
    def unit_gains(self, support, batch, columns: np.ndarray) -> PartitionedUnitGains:  # type: ignore[override]
        columns = np.asarray(columns, dtype=float)
        coreset_gains = self.gains(support, columns)
        index, inside = self.placed.locate(np.asarray(batch, dtype=int))
        pieces = []
        for k in np.unique(index):
            positions = np.flatnonzero(index == k)
            pieces.append((positions, self.placed.call(int(k), partition_batch_gains, self.program, self.placed.shared,
                                                       self.divergence, self.learning_rate, self.inner,
                                                       inside[positions], columns)))
        return PartitionedUnitGains(coreset_gains, self.placed, len(batch), pieces)

    def close(self) -> None:
        """Forget what the run kept of the partitions (here and on the workers)."""
        self.placed.close()
