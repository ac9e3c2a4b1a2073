"""Per-example gradients from one call of a program's per-example mode.

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
  (the chain rule). n (k + 1) autodiff variables instead of n d. ``"auto"`` picks
  it whenever the program has it.

``benchmarks/per_example_cost.py`` measures both. The data are prepared once; a
minibatch's program is built from its own rows only. Memory is O(n d).

Several chains can share one call: each chain's rows are one more run of
copies, each at its own theta.
"""

from __future__ import annotations

import numpy as np

from ..building.data import Mode, slice_rows
from ..building.divergences import refuse_original_gamma
from ..building.spec import LINEAR_PREDICTOR_MODELS
from ..common.errors import RobustStanInputError
from .oracles import GradientOracle, make_oracle
from .program import GeneratedProgram


def checked_rows(batch, n: int) -> np.ndarray:
    """``batch`` (0-based row indices; None: all ``n`` rows) as an array, or an error naming it."""
    rows = np.arange(n) if batch is None else np.asarray(batch)
    if rows.ndim != 1 or rows.size == 0 or not np.issubdtype(rows.dtype, np.integer):
        raise RobustStanInputError("batch: must be a non-empty 1-D array of row indices (0-based)")
    if rows.min() < 0 or rows.max() >= n:
        raise RobustStanInputError(f"batch: row indices must lie in 0..{n - 1}")
    return rows


class PerExampleGradients:
    """grad l_i(theta) for the rows of a data set, for one model and divergence.

    Parameters
    ----------
    program : GeneratedProgram
        The model.
    stan_data : dict
        Its Stan data in per-example mode.
    oracle : {"auto", "bridgestan", "httpstan"}, default "auto"
        Engine of the gradients.
    strategy : {"auto", "copies", "linear_predictor"}, default "auto"
        "copies": one parameter copy per row (any model); "linear_predictor": dl/deta_i times
        (1, x_i) (built-in glms of the normal, bernoulli, binomial, poisson and exponential
        families); "auto": the cheaper one available.
    """

    def __init__(self, program: GeneratedProgram, stan_data: dict, oracle: str = "auto", strategy: str = "auto"):
        self.program = program
        self.strategy = _choose_strategy(program.spec, strategy)
        refuse_original_gamma(stan_data["divergence"], "divergence", "it has no per-example gradients")
        self.shared_data = stan_data
        self.n = int(self.shared_data["N"])
        layout = program.parameter_layout(self.shared_data)
        self._per_copy_sizes = [size for _, _, size in layout]
        self._starts = np.cumsum([0] + self._per_copy_sizes)  # each parameter's first column
        self.dimension = int(self._starts[-1])
        self._copied = list(range(len(layout)))  # the parameters the per-example program copies per row
        if self.strategy == "linear_predictor":
            lp = program.spec.linear_predictor
            assert lp is not None, "the linear_predictor strategy is chosen for linear-predictor models only"
            names = [p.name for p, _, _ in layout]
            self._intercept_parameter = names.index(lp.intercept)  # a real: one column
            at = names.index(lp.coefficients)
            self._coefficients = slice(int(self._starts[at]), int(self._starts[at + 1]))
            self._copied.remove(at)
            self._design = np.asarray(self.shared_data[lp.design], dtype=float)
        # what every batch's oracle shares: its mode and the size of one row's copies
        self._mode = int(Mode.PER_EXAMPLE_LINEAR_PREDICTOR if self.strategy == "linear_predictor" else Mode.PER_EXAMPLE)
        self._copy_size = sum(self._per_copy_sizes[i] for i in self._copied)
        self._oracle_kind = oracle
        self._oracles: dict[bytes, GradientOracle] = {}
        # (rows and shape, factor, [1, X] @ factor): see gradients_many_in
        self._design_times_factor: tuple[tuple[bytes, tuple], np.ndarray, np.ndarray] | None = None

    def _oracle(self, rows: np.ndarray) -> GradientOracle:
        key = rows.astype(np.int64).tobytes()
        if key not in self._oracles:
            if len(self._oracles) > 8:  # minibatches: keep a few, not one per batch ever seen
                self._oracles.clear()
            used, position = np.unique(rows, return_inverse=True)
            # A minibatch's program holds only its own rows: a small model to build per batch.
            data = slice_rows(self.program.spec, self.shared_data, used) if used.size < self.n else dict(self.shared_data)
            data.update(mode=self._mode, n_batch=int(rows.size), batch=(position + 1).astype(np.int64))
            self._oracles[key] = make_oracle(self.program.stan_code, data, rows.size * self._copy_size, self._oracle_kind)
        return self._oracles[key]

    def copies(self, thetas: np.ndarray, n_rows: int) -> np.ndarray:
        """The per-example program's unconstrained vector for ``n_rows`` rows at each row of ``thetas``.

        It holds, per parameter, its copies in order: copy (point p, row r) is number p * n_rows + r.

        Parameters
        ----------
        thetas : numpy.ndarray
            (points, d) unconstrained points.
        n_rows : int
            Rows per point.

        Returns
        -------
        numpy.ndarray
            The program's unconstrained vector.
        """
        return np.concatenate([self._repeated(thetas, i, n_rows) for i in range(len(self._per_copy_sizes))])

    def _repeated(self, thetas: np.ndarray, parameter: int, n_rows: int) -> np.ndarray:
        """One parameter's block of the per-example program's vector: its value at each point, n_rows times."""
        columns = thetas[:, self._starts[parameter]:self._starts[parameter + 1]]
        return np.repeat(columns, n_rows, axis=0).ravel()

    def _rows_from(self, grad: np.ndarray, points: int, n_rows: int) -> np.ndarray:
        """(points, rows, d) with each copied parameter's columns filled from its block of ``grad``
        (the per-example program's gradient, negated); other columns are left to the caller."""
        out = np.empty((points, n_rows, self.dimension))
        pos = 0
        for i in self._copied:
            size = self._per_copy_sizes[i]
            count = points * n_rows * size
            out[:, :, self._starts[i]:self._starts[i + 1]] = grad[pos:pos + count].reshape(points, n_rows, size)
            pos += count
        return out

    def gradients_many(self, thetas: np.ndarray, batch=None) -> np.ndarray:
        """Per-example gradients at several points, from one call.

        Parameters
        ----------
        thetas : numpy.ndarray
            (points, d) unconstrained points (e.g. one per chain).
        batch : array_like of int or None, default None
            0-based rows; None is every row.

        Returns
        -------
        numpy.ndarray
            (points, rows, d).
        """
        thetas = np.atleast_2d(np.asarray(thetas, dtype=float))
        if thetas.shape[1] != self.dimension:
            raise RobustStanInputError(f"theta: expected {self.dimension} unconstrained values, got {thetas.shape[1]}")
        rows = checked_rows(batch, self.n)
        points, n_rows = thetas.shape[0], rows.size
        oracle = self._oracle(np.tile(rows, points))
        if self.strategy == "linear_predictor":
            design = self._design if batch is None else self._design[rows]
            return self._through_linear_predictor(oracle, thetas, design)
        return self._rows_from(-oracle.gradient(self.copies(thetas, n_rows), jacobian=False), points, n_rows)

    def _linear_predictor_call(self, oracle: GradientOracle, thetas: np.ndarray, design: np.ndarray) -> np.ndarray:
        """Mode 3: one call at (eta of every row, copies of the other parameters); (points, rows, d) with
        the copied parameters' columns filled (the intercept's is dl/deta) and the coefficients' not;
        ``design`` holds the batch's rows of the design matrix."""
        points, n_rows = thetas.shape[0], design.shape[0]
        intercept = self._starts[self._intercept_parameter]
        eta = thetas[:, intercept, None] + thetas[:, self._coefficients] @ design.T  # (points, rows)
        blocks = [eta.ravel() if i == self._intercept_parameter else self._repeated(thetas, i, n_rows) for i in self._copied]
        return self._rows_from(-oracle.gradient(np.concatenate(blocks), jacobian=False), points, n_rows)

    def _through_linear_predictor(self, oracle: GradientOracle, thetas: np.ndarray, design: np.ndarray) -> np.ndarray:
        """:meth:`_linear_predictor_call`, then the chain rule: the coefficients' columns are dl/deta x the row."""
        out = self._linear_predictor_call(oracle, thetas, design)
        d_eta = out[:, :, self._starts[self._intercept_parameter]]
        np.multiply(d_eta[:, :, None], design[None, :, :], out=out[:, :, self._coefficients])
        return out

    def gradients_many_in(self, thetas: np.ndarray, factor: np.ndarray, batch=None) -> np.ndarray:
        """:meth:`gradients_many` times ``factor``: the gradients in the coordinates z of theta = factor z.

        Used by Rob-ULA's preconditioned chain. With the linear-predictor strategy, the product of
        [1, X] and the factor is computed once per factor and batch and kept, so a call costs
        O(rows x k) instead of O(rows x d x k).

        Parameters
        ----------
        thetas, batch
            As for :meth:`gradients_many`.
        factor : numpy.ndarray
            (d, k), with theta = factor z.

        Returns
        -------
        numpy.ndarray
            (points, rows, k).
        """
        factor = np.asarray(factor, dtype=float)
        thetas = np.atleast_2d(np.asarray(thetas, dtype=float))
        if thetas.shape[1] != self.dimension or factor.ndim != 2 or factor.shape[0] != self.dimension:
            raise RobustStanInputError(f"theta, factor: expected {self.dimension} unconstrained values and a factor "
                                       f"with {self.dimension} rows, got {thetas.shape[1]} and {factor.shape}")
        if self.strategy != "linear_predictor":
            return self.gradients_many(thetas, batch) @ factor
        rows = checked_rows(batch, self.n)
        design = self._design if batch is None else self._design[rows]
        out = self._linear_predictor_call(self._oracle(np.tile(rows, thetas.shape[0])), thetas, design)
        intercept = self._starts[self._intercept_parameter]
        on_eta = np.r_[intercept, np.arange(self.dimension)[self._coefficients]]
        others = np.setdiff1d(np.arange(self.dimension), on_eta)
        key = (rows.tobytes(), factor.shape)
        cached = self._design_times_factor
        if cached is None or cached[0] != key or not np.array_equal(cached[1], factor):
            augmented = np.column_stack([np.ones(design.shape[0]), design])  # columns in on_eta's order
            cached = self._design_times_factor = (key, factor.copy(), augmented @ factor[on_eta])
        in_z = out[:, :, intercept, None] * cached[2][None, :, :]
        if others.size:
            in_z += out[:, :, others] @ factor[others]
        return in_z

    def gradients(self, theta, batch=None) -> np.ndarray:
        """Per-example gradients at one point.

        Parameters
        ----------
        theta : array_like
            The unconstrained point, length d.
        batch : array_like of int or None, default None
            0-based rows; None is every row.

        Returns
        -------
        numpy.ndarray
            (rows, d): grad l_i(theta).
        """
        theta = np.asarray(theta, dtype=float).ravel()
        return self.gradients_many(theta[None, :], batch)[0]


STRATEGIES = ("auto", "copies", "linear_predictor")


def _choose_strategy(spec, strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise RobustStanInputError(f"strategy: must be one of {list(STRATEGIES)}, got {strategy!r}")
    if strategy == "linear_predictor" and spec.linear_predictor is None:
        raise RobustStanInputError(
            f"strategy: 'linear_predictor' needs {LINEAR_PREDICTOR_MODELS}; this model has only 'copies'")
    if strategy == "auto":
        return "linear_predictor" if spec.linear_predictor is not None else "copies"
    return strategy


class RowSubsetGradients:
    """The per-example gradients of some rows only: another per-example object seen through ``rows``.

    Its methods have :class:`PerExampleGradients`' signatures, its row ``k`` being ``rows[k]`` of
    ``inner``. A program whose data cannot be cut to rows (its rows' weights 0 instead) gives
    Rob-ULA the rows that count this way.

    Parameters
    ----------
    inner : object
        Gives grad l_i for every row (``n``, ``dimension``, ``gradients_many(thetas, batch)``).
    rows : array_like of int
        0-based rows of ``inner`` that are kept.
    """

    def __init__(self, inner, rows):
        self.inner = inner
        self.rows = checked_rows(np.asarray(rows), inner.n)
        self.n = len(self.rows)
        self.dimension = inner.dimension

    def gradients(self, theta, batch=None) -> np.ndarray:
        """(rows, d): grad l_i at one unconstrained point; ``batch`` indexes the kept rows.

        Parameters
        ----------
        theta : array_like
            The point, length d.
        batch : array_like of int or None, default None
            0-based positions among the kept rows; None is every kept row.

        Returns
        -------
        numpy.ndarray
            (rows, d).
        """
        return self.inner.gradients(theta, self.rows[checked_rows(batch, self.n)])

    def gradients_many(self, thetas: np.ndarray, batch=None) -> np.ndarray:
        """:meth:`gradients` at each of several points.

        Parameters
        ----------
        thetas : numpy.ndarray
            (points, d).
        batch : array_like of int or None, default None
            As for :meth:`gradients`.

        Returns
        -------
        numpy.ndarray
            (points, rows, d).
        """
        return self.inner.gradients_many(thetas, self.rows[checked_rows(batch, self.n)])

    def gradients_many_in(self, thetas: np.ndarray, factor: np.ndarray, batch=None) -> np.ndarray:
        """:meth:`gradients_many` times ``factor`` (d, k).

        Parameters
        ----------
        thetas, batch
            As for :meth:`gradients_many`.
        factor : numpy.ndarray
            (d, k).

        Returns
        -------
        numpy.ndarray
            (points, rows, k).
        """
        return self.inner.gradients_many_in(thetas, factor, self.rows[checked_rows(batch, self.n)])
