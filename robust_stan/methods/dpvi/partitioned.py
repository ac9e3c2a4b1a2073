"""DP-VI over rows held in partitions: each step's Poisson subsample is drawn, and its rows'
gradients clipped and summed, where the rows live; only each partition's clipped sum travels.

Step t: every partition k draws its rows of the subsample itself, each row independently with
probability kappa, from a generator of (a subsample key, t, k) (:class:`SubsampleKey`: a fresh
ChaCha20 key, or one derived from the seed; the workers are never given the noise's key or the
seed); it computes those rows' per-example
phi-gradients at this process's draws eps (the prior, entropy and Jacobian terms divided by the
total N, as in memory), preconditions and clips each, and returns their sum (2 n numbers; not
its batch size, which is not public). Here the sums are added and the Gaussian noise is drawn.
Each row is still in the subsample independently with probability kappa, so the accounting is
the in-memory one's; the random numbers differ from an in-memory run's (the subsample is drawn
per partition), but not with the number of workers. This process reads the data's first row
to learn the program's sizes (it is not released).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ...building.divergences import Divergence
from ...common.cluster import Cluster
from ...gradients.program import GeneratedProgram
from ..partition_placement import PlacedPartitions, kept_on_worker, partition_stan_data, prepare_partitioned
from .mechanism import DPVISettings, PerExampleObjective, poisson_batch
from .randomness import SubsampleKey


def partition_clipped_sum(part: dict, run: str, index: int, program: GeneratedProgram, shared: dict,
                          divergence: Divergence, n_rows: int, rows_here: int, key: SubsampleKey, step: int,
                          sampling_rate: float, phi: np.ndarray, eps: np.ndarray, beta: np.ndarray,
                          clip: float, q_scale: str) -> np.ndarray:
    """Partition ``index``'s share of step ``step``: its Poisson subsample's clipped, preconditioned
    phi-gradients summed (run where the partition is; its objective is kept for the run)."""
    objective = kept_on_worker(run, index, lambda: PerExampleObjective.of_program(
        program, partition_stan_data(program, part, shared, divergence, 1.0), n_rows, q_scale))
    rows = poisson_batch(key.generator(step, index), rows_here, sampling_rate)
    return objective.clipped_sum(phi, eps, rows, beta, clip)


class PartitionedBatches:
    """Each step's clipped sum over the partitions (module docstring): a ``batches`` for
    :func:`~robust_stan.methods.dpvi.mechanism.run_dp_sgd`."""

    def __init__(self, program: GeneratedProgram, placed: PlacedPartitions, divergence: Divergence,
                 dimension: int, settings: DPVISettings):
        self.program, self.placed, self.divergence = program, placed, divergence
        self.dimension, self.settings = dimension, settings
        self.key = SubsampleKey(settings.seed)

    def __call__(self, rng: np.random.Generator, t: int, phi: np.ndarray) -> np.ndarray:
        s, placed = self.settings, self.placed
        eps = rng.standard_normal((s.draws_per_step, self.dimension))
        sums = placed.gather([
            placed.call(k, partition_clipped_sum, self.program, placed.shared, self.divergence, placed.n,
                        int(placed.rows[k]), self.key, t, s.sampling_rate, phi, eps, s.precondition, s.clip,
                        s.q_scale)
            for k in range(len(placed.parts))])
        return np.sum(sums, axis=0)


def partitioned_dpvi_setup(program: GeneratedProgram, data: Mapping, divergence: Divergence,
                           cluster: Cluster | None) -> tuple[dict, PlacedPartitions, int, Callable]:
    """The first row's prepared Stan data (for the release's public data), the placed partitions
    (close them after the run), the total number of rows and a maker of the run's batches from
    its settings and the model's dimension."""
    partitions, first = prepare_partitioned(program, data, divergence, 1.0, cluster)
    placed = PlacedPartitions(program, partitions, cluster)

    def batches(dimension: int, settings: DPVISettings) -> PartitionedBatches:
        return PartitionedBatches(program, placed, divergence, dimension, settings)

    return first.stan_data, placed, placed.n, batches
