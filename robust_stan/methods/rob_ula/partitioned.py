"""Rob-ULA's steps over rows held in partitions: robust means of per-example gradients, computed
where each partition lives (the workers of an :class:`rs.Cluster`) and reduced there, so that
only one d-vector per partition and chain travels back to the driver. The partitions are placed
by :mod:`robust_stan.methods.partition_placement`.

Each step, partition k computes its rows' per-example gradients at every chain's state (one
per-example call, in the chain's coordinates) and the run's estimator on them (its robust mean
m_k and kept share); the driver combines the partitions' means coordinate by coordinate:

- ``combine="median"`` (default): the median of m_1..m_K. Guarantee: if more than half of the
  partitions hold at most a fraction epsilon of corrupted rows, each of those partitions' m_k
  is within the estimator's error bound b of its clean rows' mean, and so is the median in every
  coordinate (more than half of the m_k lie in [mu_j - b, mu_j + b], hence the median does).
  It also resists whole partitions of bad rows (fewer than half of them). With
  ``estimator="mean"`` it is the median of means. Its price: even on clean data the median of
  K means moves about 1.25 sd(m_k) from the pooled mean, which shifts the chain's
  stationary point by a fraction of a posterior sd.
- ``combine="mean"``: the row-weighted mean of m_1..m_K. If every partition holds at most a
  fraction epsilon of corrupted rows, each m_k is within b of its clean mean, and so is the
  average; it is closer to the estimator applied to all rows at once, but one partition full of
  bad rows moves it by (its rows / n) times its error.

On each worker a partition's prepared Stan data and gradient object are kept between steps
(:func:`~robust_stan.methods.partition_placement.kept_on_worker`), so a step costs one per-example call per
partition plus the estimator. Each draw's log density is computed after the run, one task per
partition for all draws, from the same prepared data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ...building.data import with_switches
from ...building.divergences import Divergence
from ...building.partitions import Partitions
from ...common.cluster import Cluster
from ...common.errors import RobustStanInputError
from ...gradients.oracles import GradientOracle
from ...gradients.per_example import PerExampleGradients
from ...gradients.program import GeneratedProgram
from ..partition_placement import PlacedPartitions, kept_on_worker, partition_stan_data, prepare_partitioned
from .estimators import estimate_each
from .sampler import LangevinTarget, default_estimator, drift_hessian, kept_rows, robust_mode, rows_weighted

COMBINES = ("median", "mean")


def partition_gradients(part: dict, run: str, index: int, program: GeneratedProgram, shared: dict,
                        divergence: Divergence, learning_rate: float) -> PerExampleGradients:
    """The partition's per-example gradient object (its prepared data in ``shared_data``), built on
    first use where the partition is and kept for the run."""
    return kept_on_worker(run, index, lambda: PerExampleGradients(
        program, partition_stan_data(program, part, shared, divergence, learning_rate)))


def partition_log_densities(part: dict, run: str, index: int, program: GeneratedProgram, shared: dict,
                            divergence: Divergence, learning_rate: float, thetas: np.ndarray) -> np.ndarray:
    """The log density (prior and Jacobian included) of the partition's program on its rows at
    each of ``thetas``, from the prepared data its gradient object keeps (run where the partition
    is; nothing more is kept)."""
    stan_data = partition_gradients(part, run, index, program, shared, divergence, learning_rate).shared_data
    oracle = program.oracle_for(stan_data)
    return np.array([oracle.log_density(theta, jacobian=True) for theta in thetas])


def partition_robust_means(part: dict, run: str, index: int, program: GeneratedProgram, shared: dict,
                           divergence: Divergence, learning_rate: float, thetas: np.ndarray, factor: np.ndarray,
                           estimate: Callable, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """One partition's step (run where the partition is): its rows' per-example gradients at
    every chain's state, in the coordinates of ``factor``, and the estimator's mean and kept share
    per chain."""
    per_example = partition_gradients(part, run, index, program, shared, divergence, learning_rate)
    with np.errstate(over="ignore", invalid="ignore"):
        G = per_example.gradients_many_in(thetas, factor)
    return estimate_each(G, estimate, epsilon)


def partition_robust_mode(part: dict, run: str, index: int, program: GeneratedProgram, shared: dict,
                          divergence: Divergence, learning_rate: float, start: np.ndarray, epsilon: float,
                          total: float, metric: str, plain: bool) -> tuple[np.ndarray, bool]:
    """The partition's own start for ``inits="mode"`` (run where the partition is): Rob-ULA's
    robust mode of the prior plus its rows' loss, the rows weighted total / (their number) as if
    they were all the data."""
    per_example = partition_gradients(part, run, index, program, shared, divergence, learning_rate)
    stan_data = per_example.shared_data
    weighted_oracle = rows_weighted(lambda weights: program.oracle_for(with_switches(stan_data, weights=weights)),
                                    per_example.n, total)
    prior = program.oracle_for(with_switches(stan_data, mode="prior"))
    return robust_mode(weighted_oracle, per_example, prior, start, epsilon, learning_rate * total, metric, plain)


def partition_kept_loss_hessian(part: dict, run: str, index: int, program: GeneratedProgram, shared: dict,
                                divergence: Divergence, learning_rate: float, point: np.ndarray,
                                epsilon: float) -> tuple[np.ndarray, int]:
    """The Hessian at ``point`` of the summed loss of the partition's rows that Algorithm 3 keeps
    there (every row at epsilon 0), and their number (run where the partition is)."""
    per_example = partition_gradients(part, run, index, program, shared, divergence, learning_rate)
    rows = kept_rows(per_example, point, np.eye(per_example.dimension), epsilon)
    return drift_hessian(lambda theta: per_example.gradients(theta, batch=rows).sum(axis=0), point), rows.size


class PartitionedGradients:
    """Robust means of a built-in model's per-example gradients over row partitions, each
    partition's share computed where it lives (on ``cluster``'s workers, or here without one)
    and combined by ``combine`` (module docstring)."""

    def __init__(self, program: GeneratedProgram, partitions: Partitions, divergence: Divergence,
                 learning_rate: float, prior: GradientOracle, dimension: int, cluster: Cluster | None = None,
                 combine: str = "median"):
        if combine not in COMBINES:
            raise RobustStanInputError(f"combine: must be one of {list(COMBINES)}, got {combine!r}")
        self.program, self.divergence, self.learning_rate, self.prior = program, divergence, learning_rate, prior
        self.combine = combine
        self.placed = PlacedPartitions(program, partitions, cluster)
        self.n, self.dimension = partitions.n, dimension
        self.row_shares = self.placed.rows / self.placed.rows.sum()  # each partition's share of the rows

    def on_every_partition(self, function: Callable, *arguments) -> list:
        """``function(part, run, k, program, shared, divergence, learning_rate, *arguments)`` where
        each partition k is, in partition order."""
        placed = self.placed
        common = (self.program, placed.shared, self.divergence, self.learning_rate)
        return placed.gather([placed.call(k, function, *common, *arguments) for k in range(len(placed.parts))])

    def combined(self, values: np.ndarray) -> np.ndarray:
        """The partitions' values (partitions, ...) joined by ``combine``."""
        return np.median(values, axis=0) if self.combine == "median" else np.tensordot(self.row_shares, values, axes=1)

    def robust_means(self, thetas: np.ndarray, factor: np.ndarray, estimate: Callable,
                     epsilon: float) -> tuple[np.ndarray, np.ndarray]:
        """Each chain's combined robust mean (chains, d) and the row-weighted kept share."""
        results = self.on_every_partition(partition_robust_means, thetas, factor, estimate, epsilon)
        means = np.stack([m for m, _ in results])          # (partitions, chains, d)
        kept = np.stack([f for _, f in results])            # (partitions, chains)
        return self.combined(means), np.tensordot(self.row_shares, kept, axes=1)

    def robust_start(self, start: np.ndarray, epsilon: float, total: float, metric: str,
                     plain: bool) -> tuple[np.ndarray, bool]:
        """``inits="mode"``'s start: each partition's robust mode (:func:`partition_robust_mode`),
        joined by ``combine`` as the gradients are; converged if every partition's optimiser was."""
        results = self.on_every_partition(partition_robust_mode, start, epsilon, total, metric, plain)
        return self.combined(np.stack([point for point, _ in results])), all(ok for _, ok in results)

    def kept_loss_hessian(self, point: np.ndarray, epsilon: float) -> np.ndarray:
        """The Hessian at ``point`` of the mean loss over the rows each partition keeps (every row at
        epsilon 0: then the in-memory run's): the partitions' sums over their total count."""
        results = self.on_every_partition(partition_kept_loss_hessian, point, epsilon)
        return sum(hessian for hessian, _ in results) / sum(count for _, count in results)

    def log_densities(self, thetas: np.ndarray) -> np.ndarray:
        """log pi at each of ``thetas`` (S, d), Jacobian included, one task per partition for all
        S: every partition's program on its rows holds the prior once, so log pi is their sum
        minus (partitions - 1) priors (:func:`partition_log_densities`)."""
        per_partition = self.on_every_partition(partition_log_densities, thetas)
        prior = np.array([self.prior.log_density(t, jacobian=True) for t in thetas])
        return sum(per_partition) - (len(per_partition) - 1) * prior

    def close(self) -> None:
        """Forget the partitions' gradient objects (here and on the workers)."""
        self.placed.close()


def partitioned_target(program: GeneratedProgram, data: Mapping, divergence: Divergence, learning_rate: float,
                       cluster: Cluster | None, combine: str = "median"):
    """The :class:`~robust_stan.methods.rob_ula.sampler.LangevinTarget` of a built-in model whose rows are
    held in partitions, its :class:`PartitionedGradients` (close it after the run) and the data of
    its first row with the values every partition shares, prepared (for the fit's constraining)."""
    partitions, first = prepare_partitioned(program, data, divergence, learning_rate, cluster)
    stan_data = first.stan_data
    prior = program.oracle_for(with_switches(stan_data, mode="prior"))
    gradients = PartitionedGradients(program, partitions, divergence, learning_rate, prior,
                                     program.dimension(stan_data), cluster, combine)
    target = LangevinTarget(
        per_example=gradients,
        prior=prior,
        posterior=None,
        weighted=None,
        output=lambda: program.oracle_for(with_switches(stan_data, pointwise=False)),
        learning_rate=float(learning_rate),
        default_estimator=default_estimator(program.spec.family),
        robust_means=gradients.robust_means,
        robust_start=gradients.robust_start,
        kept_loss_hessian=gradients.kept_loss_hessian,
        log_densities=gradients.log_densities,
    )
    return target, gradients, first
