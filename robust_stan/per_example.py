"""Per-example gradients from one call of a program's per-example mode (DESIGN.md section 3).

Two strategies, both exact:

- ``"copies"`` (mode 1, every model): the program declares one copy of every
  parameter per batch row and adds -l_{batch[c]}(theta_c) for copy c, without
  the prior. Evaluated at every copy equal to the same theta, the gradient of
  that target, cut into one block per copy, is minus the per-example gradients:
  all n of them from one reverse pass instead of n. That pass carries one
  autodiff variable per parameter copy (n d of them), so it costs several full
  gradients of a vectorised program.
- ``"linear_predictor"`` (mode 3, the built-in glms whose other arguments can
  vary by row): the intercept's copy c carries row c's whole linear predictor
  eta_c = alpha + x_c' b, computed here; the coefficients have no copies. One
  call gives dl_c/deta_c and the gradients of the other parameters' copies; the
  intercept's and coefficients' gradients are dl_c/deta_c and dl_c/deta_c x_c
  (the chain rule). n (k + 1) autodiff variables instead of n d: about the cost
  of one full gradient. ``"auto"`` picks it whenever the program has it.

``benchmarks/per_example_cost.py`` measures both. The data are prepared once; a
minibatch's program is built from its own rows only. Memory is O(n d).

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
    ``strategy`` is "auto", "copies" or "linear_predictor" (module docstring).
    """

    def __init__(self, model, data: Mapping, divergence: Divergence | None = None, oracle: str = "auto",
                 strategy: str = "auto"):
        self.model = model
        self.strategy = _choose_strategy(model.spec, strategy)
        self.divergence = as_divergence(divergence)
        if self.divergence.code == 3:
            raise RobustStanInputError(
                "divergence: the original gamma form is not a sum over observations, so it has no per-example "
                "gradients; use rs.GammaD(gamma) (decomposable), rs.BetaD or rs.KL()")
        self.shared_data = model.stan_data(data, self.divergence)
        self.n = int(self.shared_data["N"])
        layout = model._parameter_layout(self.shared_data)
        self._per_copy_sizes = [size for _, _, size in layout]
        self.dimension = int(sum(self._per_copy_sizes))
        if self.strategy == "linear_predictor":
            lp = model.spec.linear_predictor
            names = [p.name for p, _, _ in layout]
            self._starts = starts = np.cumsum([0] + self._per_copy_sizes)  # each parameter's first column
            self._intercept_index = names.index(lp.intercept)
            self._intercept = int(starts[self._intercept_index])
            at = names.index(lp.coefficients)
            self._coefficients = slice(int(starts[at]), int(starts[at + 1]))
            self._copied = [i for i in range(len(names)) if i != at]  # parameters with copies in mode 3
            self._design = np.asarray(self.shared_data[lp.design], dtype=float)
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
            if self.strategy == "linear_predictor":
                mode, per_copy = 3, self.dimension - (self._coefficients.stop - self._coefficients.start)
            else:
                mode, per_copy = 1, self.dimension
            data.update(mode=mode, n_batch=int(rows.size), batch=(position + 1).astype(np.int64))
            self._oracles[key] = make_oracle(self.model.stan_code, data, rows.size * per_copy, self._oracle_kind)
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
        if self.strategy == "linear_predictor":
            design = self._design if batch is None else self._design[rows]
            return self._through_linear_predictor(oracle, thetas, design)
        grad = oracle.gradient(self.copies(thetas, n_rows), jacobian=False)
        out = np.empty((points * n_rows, self.dimension))
        pos = start = 0
        for size in self._per_copy_sizes:
            count = points * n_rows * size
            out[:, start:start + size] = grad[pos:pos + count].reshape(points * n_rows, size)
            pos += count
            start += size
        return -out.reshape(points, n_rows, self.dimension)

    def _through_linear_predictor(self, oracle: GradientOracle, thetas: np.ndarray, design: np.ndarray) -> np.ndarray:
        """Mode 3: one call at (eta of every row, copies of the other parameters), then the chain rule;
        ``design`` holds the batch's rows of the design matrix."""
        points, n_rows = thetas.shape[0], design.shape[0]
        eta = thetas[:, self._intercept, None] + thetas[:, self._coefficients] @ design.T  # (points, rows)
        starts = self._starts
        blocks = [eta.ravel() if i == self._intercept_index else
                  np.repeat(thetas[:, starts[i]:starts[i + 1]], n_rows, axis=0).ravel() for i in self._copied]
        grad = -oracle.gradient(np.concatenate(blocks), jacobian=False)
        out = np.empty((points, n_rows, self.dimension))
        pos = 0
        for i in self._copied:
            size = int(self._per_copy_sizes[i])
            count = points * n_rows * size
            out[:, :, starts[i]:starts[i + 1]] = grad[pos:pos + count].reshape(points, n_rows, size)
            pos += count
        d_eta = out[:, :, self._intercept]
        np.multiply(d_eta[:, :, None], design[None, :, :], out=out[:, :, self._coefficients])
        return out

    def gradients(self, theta, batch=None) -> np.ndarray:
        """(rows, d): grad l_i(theta) for the rows in ``batch`` (all rows by default)."""
        theta = np.asarray(theta, dtype=float).ravel()
        return self.gradients_many(theta[None, :], batch)[0]


STRATEGIES = ("auto", "copies", "linear_predictor")


def _choose_strategy(spec, strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise RobustStanInputError(f"strategy: must be one of {list(STRATEGIES)}, got {strategy!r}")
    if strategy == "linear_predictor" and spec.linear_predictor is None:
        raise RobustStanInputError(
            "strategy: 'linear_predictor' needs a built-in glm whose family arguments can vary by row (normal, "
            "bernoulli, binomial, poisson, exponential); this model has only 'copies'")
    if strategy == "auto":
        return "linear_predictor" if spec.linear_predictor is not None else "copies"
    return strategy
