"""Robust variational inference over rows held in partitions: each step's data term is computed
where its rows live and only its sum travels.

log pi(theta) = log prior(theta) + log|J| + sum over the partitions of partition k's data term,
and partition k's data term is its program's log density on its rows (with the step's weight
factor) minus that program's prior part. So at S draws, a step sends S parameter vectors to each
partition that holds rows of the step and receives S gradients (d numbers each) or S log
densities. The prior part is computed here, once per draw. The minibatch rows are drawn here
with the same random numbers as in memory, so the fit is the in-memory fit's up to the order of
the partitions' additions.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ...building.data import slice_rows, with_switches
from ...building.divergences import Divergence
from ...common.cluster import Cluster
from ...gradients.oracles import make_oracle
from ...gradients.program import GeneratedProgram
from ..partition_placement import PlacedPartitions, kept_on_worker, partition_stan_data, prepare_partitioned
from .robust_vi import VariationalTarget


def partition_data_terms(part: dict, run: str, index: int, program: GeneratedProgram, shared: dict,
                         divergence: Divergence, learning_rate: float, oracle_kind: str, rows: np.ndarray | None,
                         weight_factor: float, thetas: np.ndarray, gradient: bool) -> np.ndarray:
    """Partition ``index``'s data term of log pi (its program's log density on its rows minus that
    program's prior part) at each of ``thetas``: its gradient (S, d), or its value (S,), on its
    rows ``rows`` (None: all) weighted by ``weight_factor``; run where the partition is (its
    prepared data and oracles are kept for the run)."""
    def build():
        stan_data = partition_stan_data(program, part, shared, divergence, learning_rate)
        return (stan_data, program.oracle_for(stan_data, oracle_kind),
                program.oracle_for(with_switches(stan_data, mode="prior"), oracle_kind))

    stan_data, full, prior = kept_on_worker(run, index, build, what=f"data terms, {oracle_kind} oracle")
    oracle = full if rows is None else make_oracle(
        program.stan_code, slice_rows(program.spec, stan_data, rows, weight_factor), full.dimension, oracle_kind)
    if gradient:
        return np.array([oracle.gradient(t, jacobian=True) - prior.gradient(t, jacobian=True) for t in thetas])
    return np.array([oracle.log_density(t, jacobian=True) - prior.log_density(t, jacobian=True) for t in thetas])


class PartitionedVariationalTarget(VariationalTarget):
    """A :class:`VariationalTarget` whose rows are held in partitions (module docstring);
    ``stan_data`` is the prepared data of the first row (for the prior and the transforms)."""

    def __init__(self, program: GeneratedProgram, placed: PlacedPartitions, stan_data: dict, divergence: Divergence,
                 learning_rate: float, batch_size: int | None, oracle: str, rng: np.random.Generator):
        super().__init__(program, stan_data, batch_size, oracle, rng, n_rows=placed.n)
        self.placed, self.divergence, self.learning_rate = placed, divergence, float(learning_rate)
        self.prior = program.oracle_for(with_switches(stan_data, mode="prior"), oracle)

    def evaluate(self, thetas: np.ndarray, rows: np.ndarray | None, weight_factor: float, gradient: bool) -> np.ndarray:
        placed = self.placed
        if rows is None:
            pieces = [(k, None) for k in range(len(placed.parts))]
        else:
            index, inside = placed.locate(rows)
            pieces = [(int(k), inside[index == k]) for k in np.unique(index)]
        arguments = (self.program, placed.shared, self.divergence, self.learning_rate, self.oracle_kind)
        terms = placed.gather([placed.call(k, partition_data_terms, *arguments, these, weight_factor, thetas, gradient)
                               for k, these in pieces])
        if gradient:
            prior = np.array([self.prior.gradient(t, jacobian=True) for t in thetas])
        else:
            prior = np.array([self.prior.log_density(t, jacobian=True) for t in thetas])
        return prior + sum(terms)


def partitioned_variational_target(program: GeneratedProgram, data: Mapping, divergence: Divergence,
                                   learning_rate: float, cluster: Cluster | None):
    """The first row with the shared values, prepared (for the fit's constraining), the placed
    partitions (close them after the fit) and a maker of the fit's target for
    :func:`~robust_stan.methods.variational.robust_vi.fit_variational` (``target=``)."""
    partitions, first = prepare_partitioned(program, data, divergence, learning_rate, cluster)
    stan_data = first.stan_data
    placed = PlacedPartitions(program, partitions, cluster)

    def make_target(batch_size, oracle, rng):
        return PartitionedVariationalTarget(program, placed, stan_data, divergence, learning_rate, batch_size,
                                            oracle, rng)

    return first, placed, make_target
