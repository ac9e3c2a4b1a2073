"""Per-example gradients of a robustified program from its weights as parameters.

A program made by :func:`robust_stan.robustify` adds
``rs_learning_rate * sum_i w_i * (-l_i(theta))`` to its target, linear in the
weights w. With its switch ``rs_weights_are_parameters = 1`` the weights become
its last parameters, and the mixed second derivative

    d^2 log density / (d w_i d theta) = -rs_learning_rate * grad l_i(theta)

holds every per-example gradient. Forward mode over reverse mode (Stan's
``fvar<var>``) gives the whole block from one sweep per coordinate of theta:
d sweeps, whatever the number of rows, and exact (automatic differentiation, no
differencing). The prior and the Jacobian do not depend on w, so they drop out.
Measured at N = 2000, d = 12 (``benchmarks/robustify_gradient.py``): a sweep costs
6 to 13 gradients of the program, all N gradients 71 to 161, against N + 1 for
one gradient per row.

The weights are set to 2 for the sweeps. Any value gives the same derivatives
(the target is linear in w), but at unit weights the library calls Stan's own
fused density, which does not see w, and a zero weight would put log(0) on the
tape.

It needs the program built with second-order autodiff (``STAN_MODEL_FVAR_VAR``),
a second build of the same text that only httpstan's back end makes; the first
use compiles it once (cached like every build).
"""

from __future__ import annotations

import numpy as np

from ..building.divergences import refuse_original_gamma
from ..engines import compile_program
from ..engines.httpstan_engine import httpstan_available
from ..engines.native_model import SECOND_ORDER_MARK
from .per_example import checked_rows

#: The weights' value during the sweeps (see the module docstring).
SWEEP_WEIGHT = 2.0


def second_order_available() -> bool:
    """Whether this machine can build programs with second-order autodiff (httpstan is installed)."""
    return httpstan_available()


class WeightDerivativeGradients:
    """grad l_i(theta) for every row of one outcome of a robustified program, from mixed derivatives.

    Its methods have :class:`~robust_stan.gradients.per_example.PerExampleGradients`' signatures.

    Parameters
    ----------
    stan_code : str
        The robustified program.
    stan_data : dict
        Its data with the switches (the learning rate is set to 1 here).
    outcome : str
        The likelihood's outcome.
    dimension : int
        The number of unconstrained parameters without the weights.
    show_progress : bool, default False
        Show the second-order program's compilation.

    Raises
    ------
    RobustStanInputError
        For the original gamma form, which has no per-example gradients.
    RuntimeError
        If httpstan, which gives the second derivatives, is not installed.
    """

    def __init__(self, stan_code: str, stan_data: dict, outcome: str, dimension: int, show_progress: bool = False):
        refuse_original_gamma(stan_data["rs_divergence"], "divergence", "it has no per-example gradients")
        if not second_order_available():
            raise RuntimeError("per-example gradients of a robustified program need httpstan (pip install httpstan), "
                               "which builds the program with second-order autodiff")
        self.n = len(np.atleast_1d(stan_data[f"rs_weights_{outcome}"]))
        self.dimension = int(dimension)
        program = compile_program(f"{SECOND_ORDER_MARK}\n{stan_code}", engine="httpstan", show_progress=show_progress)
        data = dict(stan_data, rs_weights_are_parameters=1, rs_learning_rate=1.0)
        self._native = program.native_model(data)  # type: ignore[attr-defined]  # httpstan's program
        if self._native.dimension != self.dimension + self.n:
            raise RuntimeError(f"the program has {self._native.dimension} parameters with its weights as parameters; "
                               f"expected {self.dimension} + {self.n} (is {outcome!r} its only likelihood outcome?)")

    def gradients(self, theta: np.ndarray, batch=None) -> np.ndarray:
        """(rows, d): grad l_i at an unconstrained point.

        Parameters
        ----------
        theta : numpy.ndarray
            The point, length d.
        batch : array_like of int or None, default None
            0-based rows; None is every row.

        Returns
        -------
        numpy.ndarray
            (rows, d).
        """
        rows = checked_rows(batch, self.n)
        point = np.concatenate([np.asarray(theta, dtype=float).ravel(), np.full(self.n, SWEEP_WEIGHT)])
        mixed = self._native.mixed_second_derivatives(point, self.dimension)
        return -mixed[rows]

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
        return np.stack([self.gradients(theta, batch) for theta in np.atleast_2d(thetas)])

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
        return self.gradients_many(thetas, batch) @ factor
