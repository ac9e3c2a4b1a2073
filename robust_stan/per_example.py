"""Per-example gradients from one call of a program's per-example mode (DESIGN.md section 3).

In mode 1 the program declares one copy of every parameter per batch row and
adds -l_{batch[c]}(theta_c) for copy c, without the prior. Evaluated at every
copy equal to the same theta, the gradient of that target, cut into one block
per copy, is minus the per-example gradients: all n of them from one reverse
pass instead of n. That pass carries one autodiff variable per parameter copy
(n d of them), so it costs more than a full gradient of a vectorised program
(``benchmarks/per_example_cost.py`` measures by how much). The data are
prepared once; a minibatch's program is built from its own rows only.
Memory is O(n d).

Several chains can share one call: each chain's rows are one more run of
copies, each at its own theta.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .data import slice_rows
from .divergences import Divergence, as_divergence
from .errors import RobustStanInputError
from .oracles import GradientOracle, make_oracle


class PerExampleGradients:
    """grad l_i(theta) for the rows of a data set, for one model and divergence.

    ``gradients(theta)`` gives the (rows, d) array at one point;
    ``gradients_many(thetas)`` one such array per point (chains), from one call.
    """

    def __init__(self, model, data: Mapping, divergence: Divergence | None = None, oracle: str = "auto"):
        self.model = model
        self.divergence = as_divergence(divergence)
        if self.divergence.code == 3:
            raise RobustStanInputError(
                "divergence: the original gamma form is not a sum over observations, so it has no per-example "
                "gradients; use rs.GammaD(gamma) (decomposable), rs.BetaD or rs.KL()")
        self.shared_data = model.stan_data(data, self.divergence)
        self.n = int(self.shared_data["N"])
        self._per_copy_sizes = [size for _, _, size in model._parameter_layout(self.shared_data)]
        self.dimension = int(sum(self._per_copy_sizes))
        self._oracle_kind = oracle
        self._oracles: dict[bytes, GradientOracle] = {}

    def _check_rows(self, batch) -> np.ndarray:
        rows = np.arange(self.n) if batch is None else np.asarray(batch)
        if rows.ndim != 1 or rows.size == 0 or not np.issubdtype(rows.dtype, np.integer):
            raise RobustStanInputError("batch: must be a non-empty 1-D array of row indices (0-based)")
        if rows.min() < 0 or rows.max() >= self.n:
            raise RobustStanInputError(f"batch: row indices must lie in 0..{self.n - 1}")
        return rows

    def _oracle(self, rows: np.ndarray) -> GradientOracle:
        key = rows.astype(np.int64).tobytes()
        if key not in self._oracles:
            if len(self._oracles) > 8:  # minibatches: keep a few, not one per batch ever seen
                self._oracles.clear()
            used, position = np.unique(rows, return_inverse=True)
            # A minibatch's program holds only its own rows: a small model to build per batch.
            data = slice_rows(self.model.spec, self.shared_data, used) if used.size < self.n else dict(self.shared_data)
            data.update(mode=1, n_batch=int(rows.size), batch=(position + 1).astype(np.int64))
            self._oracles[key] = make_oracle(self.model.stan_code, data, rows.size * self.dimension,
                                             self._oracle_kind)
        return self._oracles[key]

    def copies(self, thetas: np.ndarray, n_rows: int) -> np.ndarray:
        """The per-example program's unconstrained vector for ``n_rows`` rows at each row of ``thetas``.

        It holds, per parameter, its copies in order: copy (point p, row r) is
        number p * n_rows + r.
        """
        blocks, start = [], 0
        for size in self._per_copy_sizes:
            blocks.append(np.repeat(thetas[:, start:start + size], n_rows, axis=0).ravel())
            start += size
        return np.concatenate(blocks)

    def gradients_many(self, thetas: np.ndarray, batch=None) -> np.ndarray:
        """(points, rows, d): per-example gradients at each row of ``thetas`` (points, d), one call."""
        thetas = np.atleast_2d(np.asarray(thetas, dtype=float))
        if thetas.shape[1] != self.dimension:
            raise RobustStanInputError(f"theta: expected {self.dimension} unconstrained values, got {thetas.shape[1]}")
        rows = self._check_rows(batch)
        points, n_rows = thetas.shape[0], rows.size
        oracle = self._oracle(np.tile(rows, points))
        grad = oracle.gradient(self.copies(thetas, n_rows), jacobian=False)
        out = np.empty((points * n_rows, self.dimension))
        pos = start = 0
        for size in self._per_copy_sizes:
            count = points * n_rows * size
            out[:, start:start + size] = grad[pos:pos + count].reshape(points * n_rows, size)
            pos += count
            start += size
        return -out.reshape(points, n_rows, self.dimension)

    def gradients(self, theta, batch=None) -> np.ndarray:
        """(rows, d): grad l_i(theta) for the rows in ``batch`` (all rows by default)."""
        theta = np.asarray(theta, dtype=float).ravel()
        return self.gradients_many(theta[None, :], batch)[0]
