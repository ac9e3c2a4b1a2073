"""Calibrating a generalized posterior: its learning rate (Lyddon, Holmes and Walker 2019) and its
spread (the curvature adjustment of Ribatet, Cooley and Davison 2012 and Shaby 2014).

Both use the sandwich matrices of the loss at its minimum theta_hat, on the program's
unconstrained scale, per row (N rows):

    J = (1/N) sum_i Hessian of l_i(theta_hat),      I = (1/N) sum_i grad l_i grad l_i^T (theta_hat).

The minimum-loss estimate theta_hat has sampling covariance J^-1 I J^-1 / N, while the
posterior with learning rate w has covariance (w N J)^-1 for large N.

- LHW's information matching: w = tr(J I^-1 J) / tr(J), the scalar that makes the posterior's
  precision match the estimate's in trace (their section 3.2).
- The curvature adjustment: draws theta_s become theta_bar + C (theta_s - theta_bar) with
  C = chol(S) chol(P)^-1, P the draws' covariance and S = J^-1 I J^-1 / N, so the adjusted
  draws have covariance S exactly and the same mean theta_bar.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from ..building.data import with_switches
from ..common.errors import RobustStanInputError
from ..gradients.per_example import PerExampleGradients


def loss_minimum(loss_and_gradient: Callable[[np.ndarray], tuple[float, np.ndarray]],
                 start: np.ndarray) -> np.ndarray:
    """theta_hat = argmin of the total loss by L-BFGS from ``start``; an error if it does not converge."""
    result = optimize.minimize(loss_and_gradient, np.asarray(start, dtype=float), jac=True, method="L-BFGS-B",
                               options={"maxiter": 5000, "gtol": 1e-9, "ftol": 1e-15})
    if not (result.success and np.all(np.isfinite(result.x))):
        raise RuntimeError(f"calibrate: the loss's minimum was not found ({result.message}); the sandwich "
                           "matrices need it")
    return result.x


def sandwich_matrices(row_gradients: np.ndarray, total_gradient: Callable[[np.ndarray], np.ndarray],
                      theta_hat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(J, I) at theta_hat from the rows' gradients there (N, d) and the total loss's gradient, whose
    Jacobian J N is taken by central differences (2 d calls, steps 1e-4 max(1, |theta_j|);
    exact for a quadratic loss) and symmetrised."""
    n, d = row_gradients.shape
    information = row_gradients.T @ row_gradients / n
    hessian = np.empty((d, d))
    for j in range(d):
        h = 1e-4 * max(1.0, abs(float(theta_hat[j])))
        step = np.zeros(d)
        step[j] = h
        hessian[:, j] = (total_gradient(theta_hat + step) - total_gradient(theta_hat - step)) / (2 * h)
    curvature = (hessian + hessian.T) / (2 * n)
    if np.any(np.linalg.eigvalsh(curvature) <= 0):
        raise RuntimeError("calibrate: the loss's Hessian at its minimum is not positive definite; the sandwich "
                           "matrices need a strict minimum (is a parameter not identified by the data?)")
    return curvature, information


def lhw_learning_rate(curvature: np.ndarray, information: np.ndarray) -> float:
    """w = tr(J I^-1 J) / tr(J) (Lyddon, Holmes and Walker 2019)."""
    if np.linalg.matrix_rank(information) < information.shape[0]:
        raise RuntimeError("calibrate: the rows' gradients do not span every direction (I is singular)")
    return float(np.trace(curvature @ np.linalg.solve(information, curvature)) / np.trace(curvature))


def sandwich_covariance(curvature: np.ndarray, information: np.ndarray, n_rows: int) -> np.ndarray:
    """J^-1 I J^-1 / N: the sampling covariance of the minimum-loss estimate."""
    inverse = np.linalg.inv(curvature)
    covariance = inverse @ information @ inverse / n_rows
    return (covariance + covariance.T) / 2


def curvature_adjusted(draws: np.ndarray, target_covariance: np.ndarray) -> np.ndarray:
    """The draws (..., d) mapped affinely about their mean so that their covariance is
    ``target_covariance`` (module docstring)."""
    flat = draws.reshape(-1, draws.shape[-1])
    if flat.shape[0] <= flat.shape[1]:
        raise RobustStanInputError(f"fit: need more draws than parameters ({flat.shape[1]}) to adjust them")
    centre = flat.mean(axis=0)
    current = np.linalg.cholesky(np.atleast_2d(np.cov(flat, rowvar=False)))
    wanted = np.linalg.cholesky(target_covariance)
    transform = wanted @ np.linalg.inv(current)
    return (centre + (flat - centre) @ transform.T).reshape(draws.shape)


@dataclass(frozen=True)
class MinimumLoss:
    """The loss's minimum theta_hat (unconstrained) and the sandwich matrices J, I there (N rows)."""

    theta_hat: np.ndarray
    curvature: np.ndarray
    information: np.ndarray
    n_rows: int

    @property
    def covariance(self) -> np.ndarray:
        """J^-1 I J^-1 / N."""
        return sandwich_covariance(self.curvature, self.information, self.n_rows)


def minimum_loss(program, stan_data: dict, start: np.ndarray) -> MinimumLoss:
    """theta_hat = argmin sum_i l_i (the program's divergence, learning rate 1, prior left out) from
    ``start``, with J and I there from the program's per-example gradients."""
    stan_data = with_switches(stan_data, learning_rate=1.0, pointwise=False)
    posterior, prior = program.oracle_for(stan_data), program.oracle_for(with_switches(stan_data, mode="prior"))

    def loss_and_gradient(theta: np.ndarray) -> tuple[float, np.ndarray]:
        """sum_i l_i(theta) and its gradient: the posterior at w = 1 less the prior (Jacobians cancel)."""
        lp, gradient = posterior.log_density_gradient(theta)
        prior_lp, prior_gradient = prior.log_density_gradient(theta)
        return -(lp - prior_lp), -(gradient - prior_gradient)

    theta_hat = loss_minimum(loss_and_gradient, start)
    rows = PerExampleGradients(program, stan_data).gradients(theta_hat)
    curvature, information = sandwich_matrices(rows, lambda theta: loss_and_gradient(theta)[1], theta_hat)
    return MinimumLoss(theta_hat, curvature, information, rows.shape[0])
