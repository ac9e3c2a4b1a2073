"""Gradient oracles: one program with its data fixed, evaluated at many points.

The samplers and optimisers that drive Stan programs from Python (Rob-ULA,
variational inference) need the log density, its gradient, the unconstrained
dimension and the constrain/unconstrain maps, called thousands of times with
the same data. An oracle prepares the data once and then only moves theta.

Two implementations give identical numbers:

- ``bridgestan``: a BridgeStan model (``pip install 'robust-stan[bridgestan]'``
  and a BridgeStan source tree in ``$BRIDGESTAN``); the data are read once.
- ``httpstan``: the program's httpstan extension module (always available),
  through robust-stan's C interface compiled into it: the model is built once
  with its data, and theta and the gradient pass as NumPy buffers.

``oracle="auto"`` takes BridgeStan when it is available, else httpstan.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from ..common.errors import RobustStanInputError
from ..engines import compile_program
from ..engines.base import named_values
from ..engines.bridgestan_oracle import bridgestan_available

ORACLES = ("auto", "bridgestan", "httpstan")


class GradientOracle(ABC):
    """Log density and gradient of one program with fixed data, on the unconstrained scale."""

    name = "oracle"

    @property
    @abstractmethod
    def dimension(self) -> int:
        """Number of unconstrained parameters."""

    @abstractmethod
    def log_density_gradient(self, theta: np.ndarray, jacobian: bool = True) -> tuple[float, np.ndarray]:
        """Log density (Stan's, dropping constants of ``~`` statements) and its gradient.

        Parameters
        ----------
        theta : numpy.ndarray
            The point on the unconstrained scale, length d.
        jacobian : bool, default True
            Whether the change of variables' log Jacobian is included.

        Returns
        -------
        tuple of (float, numpy.ndarray)
            Stan's log density and its gradient.
        """

    @abstractmethod
    def gradient(self, theta: np.ndarray, jacobian: bool = True) -> np.ndarray:
        """Gradient only (one call where the engine allows it).

        Parameters
        ----------
        theta, jacobian
            As for :meth:`log_density_gradient`.

        Returns
        -------
        numpy.ndarray
            The gradient.
        """

    @abstractmethod
    def constrain(self, theta: np.ndarray, include_gqs: bool = True, seed: int | None = None) -> dict[str, np.ndarray]:
        """Every Stan variable (parameters, transformed parameters, generated quantities) at theta.

        Parameters
        ----------
        theta : numpy.ndarray
            The unconstrained point.
        include_gqs : bool, default True
            Also the transformed parameters and generated quantities.
        seed : int or None, default None
            Starts the generated quantities' random numbers; later calls without a seed continue
            that stream.

        Returns
        -------
        dict of numpy.ndarray
            Values by variable name.
        """

    @abstractmethod
    def unconstrain(self, values: dict) -> np.ndarray:
        """Unconstrained vector of constrained parameter values given by name.

        Parameters
        ----------
        values : dict
            Constrained values by parameter name, every parameter given.

        Returns
        -------
        numpy.ndarray
            theta, length d.
        """

    def log_density(self, theta: np.ndarray, jacobian: bool = True) -> float:
        """Log density only.

        Parameters
        ----------
        theta : numpy.ndarray
            The unconstrained point.
        jacobian : bool, default True
            As for :meth:`log_density_gradient`.

        Returns
        -------
        float
            The log density.
        """
        return self.log_density_gradient(theta, jacobian)[0]

    def _check(self, theta) -> list[float]:
        theta = np.asarray(theta, dtype=float).ravel()
        if theta.shape != (self.dimension,):
            raise RobustStanInputError(f"theta: expected {self.dimension} unconstrained values, got {theta.size}")
        return theta


class HttpstanOracle(GradientOracle):
    """A program's httpstan extension module, its model built once with the data.

    Each constrain call draws the generated quantities' random numbers from a
    new seed taken from a stream started by ``seed``, so posterior predictive
    draws (``y_rep``) are fresh at every point and reproducible.
    """

    name = "httpstan"

    def __init__(self, program, stan_data: dict, dimension: int):
        self._program = program
        self._stan_data = stan_data
        self._model = program.native_model(stan_data)
        if self._model.dimension != int(dimension):
            raise RuntimeError(f"the program has {self._model.dimension} unconstrained parameters with these data, "
                               f"expected {dimension}")
        self._shapes: dict[str, tuple[int, ...]] | None = None
        self._seeds: np.random.Generator | None = None

    @property
    def dimension(self) -> int:
        return self._model.dimension

    def log_density_gradient(self, theta, jacobian=True):
        return self._model.log_density_gradient(self._check(theta), jacobian)

    def log_density(self, theta, jacobian=True):
        return self._model.log_density_gradient(self._check(theta), jacobian, gradient=False)[0]

    def gradient(self, theta, jacobian=True):
        return self._model.log_density_gradient(self._check(theta), jacobian)[1]

    def constrain(self, theta, include_gqs=True, seed=None):
        if self._shapes is None:
            self._shapes = self._program.variable_shapes(self._stan_data)
        if seed is not None or self._seeds is None:
            self._seeds = np.random.default_rng(0 if seed is None else seed)
        flat = self._model.write_array(self._check(theta), True, include_gqs, int(self._seeds.integers(2**32)))
        return named_values(flat, self._shapes)

    def unconstrain(self, values):
        return self._program.unconstrain(self._stan_data, values)


class BridgeStanOracle(GradientOracle):
    """A BridgeStan model of the program, built once with its data."""

    name = "bridgestan"

    def __init__(self, stan_code: str, stan_data: dict):
        from ..engines.bridgestan_oracle import bridgestan_model

        self._model = bridgestan_model(stan_code, stan_data)
        self._rng = None

    @property
    def dimension(self) -> int:
        return int(self._model.model.param_unc_num())

    def log_density_gradient(self, theta, jacobian=True):
        return self._model.log_density_gradient(self._check(theta), jacobian=jacobian)

    def gradient(self, theta, jacobian=True):
        return self.log_density_gradient(theta, jacobian)[1]

    def constrain(self, theta, include_gqs=True, seed=None):
        if seed is not None or self._rng is None:
            self._rng = self._model.new_rng(0 if seed is None else seed)
        return self._model.constrain(self._check(theta), include_gqs, self._rng)

    def unconstrain(self, values):
        return np.asarray(self._model.unconstrain(values), dtype=float)


def resolve_oracle(oracle: str = "auto") -> str:
    """'bridgestan' or 'httpstan' for a request ('auto' prefers BridgeStan when it is available)."""
    if oracle not in ORACLES:
        raise RobustStanInputError(f"oracle: unknown oracle {oracle!r}; choose one of {list(ORACLES)}")
    if oracle == "auto":
        return "bridgestan" if bridgestan_available() else "httpstan"
    if oracle == "bridgestan" and not bridgestan_available():
        raise RuntimeError("oracle: 'bridgestan' needs the bridgestan package and a BridgeStan source tree "
                           "(set BRIDGESTAN); use oracle='httpstan' or 'auto'")
    return oracle


def make_oracle(stan_code: str, stan_data: dict, dimension: int, oracle: str = "auto",
                show_progress: bool = False) -> GradientOracle:
    """A gradient oracle for a program, its prepared Stan data and its unconstrained dimension."""
    kind = resolve_oracle(oracle)
    if kind == "bridgestan":
        found = BridgeStanOracle(stan_code, stan_data)
        if found.dimension != dimension:
            raise RuntimeError(f"BridgeStan reports {found.dimension} unconstrained parameters, expected {dimension}")
        return found
    return HttpstanOracle(compile_program(stan_code, "httpstan", show_progress=show_progress), stan_data, dimension)


def constrained_draws(oracle, thetas: np.ndarray) -> dict[str, np.ndarray]:
    """Every Stan variable at every unconstrained draw ``thetas`` (chains, draws, d), as
    (chains, draws, *shape); NaN where a draw is not finite (a chain that stopped). Give an
    oracle whose data have ``pointwise = 0``: the per-observation quantities are the fit's to
    compute on demand."""
    chains, draws, _ = thetas.shape
    first = next((i for i in np.ndindex(chains, draws) if np.all(np.isfinite(thetas[i]))), None)
    if first is None:
        raise RuntimeError("every chain diverged before its first draw (all states non-finite); try a smaller step size")
    template = oracle.constrain(thetas[first], True, seed=0)
    out = {name: np.full((chains, draws) + np.shape(v), np.nan) for name, v in template.items()}
    for c, t in np.ndindex(chains, draws):
        if np.all(np.isfinite(thetas[c, t])):
            values = oracle.constrain(thetas[c, t], True)
            for name in out:
                out[name][c, t] = values[name]
    return out


def unconstrained_draws(oracle, variables: dict[str, np.ndarray], names: list[str]) -> np.ndarray:
    """The draws (chains, draws, d) on the unconstrained scale of the parameters ``names`` of
    ``variables`` (as an engine's draws hold them, (chains, draws, *shape))."""
    chains, draws = np.shape(variables[names[0]])[:2]
    first = oracle.unconstrain({name: variables[name][0, 0] for name in names})
    out = np.empty((chains, draws, first.size))
    for c, t in np.ndindex(chains, draws):
        out[c, t] = oracle.unconstrain({name: variables[name][c, t] for name in names})
    return out
