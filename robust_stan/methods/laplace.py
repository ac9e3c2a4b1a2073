"""Laplace approximation of a posterior on the unconstrained scale, from the engine's gradients.

The mode is found by L-BFGS on the program's log density (log-Jacobian
included, so the approximation is of the unconstrained parameters' posterior).
The Hessian there is the central finite difference of the engine's exact
gradient, column by column (2 d gradient calls), symmetrised; its error is
O(h^2) times the third derivatives, h = 1e-4 (1 + |theta_j|). The covariance is
minus its inverse, computed from the precision scaled to unit diagonal, so that
the units of a coordinate cannot make a genuine but small curvature look flat
(``covariance_of_precision``). Each positive curvature is checked against rounding
(``curvatures_at_rounding_level``: differenced again with twice the step, a real
curvature barely moves and one made of rounding does), with a warning where it
fails. Then

    log Z  ~=  log p(mode) + (d / 2) log(2 pi) + (1 / 2) log det(covariance)

estimates the log normalising constant of the density the program computes.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from ..common.errors import RobustStanWarning


@dataclass(frozen=True)
class LaplaceApproximation:
    """A Gaussian N(mode, covariance) on the unconstrained scale.

    Parameters
    ----------
    mode : numpy.ndarray
        The mode, length d.
    covariance : numpy.ndarray
        d x d.
    cholesky : numpy.ndarray
        The lower Cholesky factor of ``covariance``.
    log_normaliser : float
        The Laplace estimate of log Z.
    converged : bool
        Whether the search for the mode converged.
    """

    mode: np.ndarray
    covariance: np.ndarray
    cholesky: np.ndarray
    log_normaliser: float
    converged: bool

    def draws(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """Independent draws of the Gaussian.

        Parameters
        ----------
        count : int
            How many draws.
        rng : numpy.random.Generator
            The generator they come from.

        Returns
        -------
        numpy.ndarray
            (count, d).
        """
        return self.mode + rng.standard_normal((count, self.mode.size)) @ self.cholesky.T


def hessian_by_differences(gradient, theta: np.ndarray, relative_step: float = 1e-4) -> np.ndarray:
    """The symmetrised central-difference Jacobian of ``gradient`` (a function of theta) at ``theta``."""
    d = theta.size
    out = np.empty((d, d))
    for j in range(d):
        h = relative_step * (1.0 + abs(theta[j]))
        up, down = theta.copy(), theta.copy()
        up[j] += h
        down[j] -= h
        out[:, j] = (gradient(up) - gradient(down)) / (2 * h)
    return 0.5 * (out + out.T)


def curvatures_at_rounding_level(gradient, theta: np.ndarray, precision: np.ndarray,
                                  relative_step: float = 1e-4) -> list[int]:
    """The coordinates j whose curvature P_jj (``precision`` = minus the differenced Hessian) is
    positive and changes by more than 10% when differenced with twice the step: there P_jj is
    rounding in the gradient (which moves a central difference by e / h), or the step is too large
    for how fast the curvature varies (a smooth log density's difference moves by O(h^2) relative to
    itself). Every positive diagonal is checked: rounding scales with the size of the gradient's
    terms, which a small P_jj does not reveal. Costs one more differenced Hessian (2 d gradient calls)."""
    diagonal = np.diag(precision)
    twice_the_step = -np.diag(hessian_by_differences(gradient, theta, 2 * relative_step))
    return [int(j) for j in np.flatnonzero((diagonal > 0) & (np.abs(twice_the_step - diagonal) > 0.1 * diagonal))]


def covariance_of_precision(precision: np.ndarray) -> tuple[np.ndarray, float]:
    """The inverse of a symmetric ``precision`` matrix and the log of its determinant.

    The inverse is taken of the precision scaled by 1 / sqrt|P_jj| (where P_jj is not 0), so that
    its eigenvalues do not depend on the coordinates' units. An eigenvalue of the scaled matrix at
    or below 1e-10 times its largest (a flat, improper or saddle direction) is floored there, with
    a warning. (Flooring the unscaled eigenvalues would flatten a coordinate whose curvature is
    merely small in its units: the noise-aware trace model's v, at 1e-10 of phi*'s curvature, kept
    only 0.2-4% of its sd that way. A curvature that is tiny but positive in every direction it
    touches is taken as genuine.)"""
    magnitude = np.abs(np.diag(precision))
    magnitude[magnitude == 0] = 1.0  # a coordinate with no curvature of its own stays unscaled
    scale = 1.0 / np.sqrt(magnitude)
    scaled = precision * np.outer(scale, scale)
    eigenvalues, vectors = np.linalg.eigh(0.5 * (scaled + scaled.T))
    floor = 1e-10 * max(1.0, float(np.max(np.abs(eigenvalues))))
    if np.any(eigenvalues <= floor):
        warnings.warn(f"Laplace approximation: the Hessian at the mode is not negative definite (smallest "
                      f"eigenvalue {eigenvalues.min():.3g} of minus the Hessian scaled to unit diagonal); floored "
                      f"to {floor:.3g}", RobustStanWarning, stacklevel=4)
        eigenvalues = np.maximum(eigenvalues, floor)
    covariance = ((vectors / eigenvalues) @ vectors.T) * np.outer(scale, scale)
    return covariance, float(np.sum(np.log(eigenvalues)) - 2 * np.sum(np.log(scale)))


def laplace_approximation(log_density_gradient, init: np.ndarray, max_iterations: int = 2000) -> LaplaceApproximation:
    """Laplace approximation at the mode of ``log_density_gradient`` (theta -> (log p, grad)),
    started from ``init``. A Hessian that is not negative definite (a flat or improper
    direction) is made so by flooring its eigenvalues, with a warning. A positive curvature made
    of rounding (``curvatures_at_rounding_level``) is kept, with a warning."""
    def negative(theta):
        value, grad = log_density_gradient(theta)
        if not np.isfinite(value):
            return np.inf, np.zeros_like(theta)
        return -value, -grad

    result = optimize.minimize(negative, np.asarray(init, dtype=float), jac=True, method="L-BFGS-B",
                               options={"maxiter": max_iterations, "gtol": 1e-9, "ftol": 1e-14})
    mode = result.x
    gradient = lambda t: log_density_gradient(t)[1]  # noqa: E731
    precision = -hessian_by_differences(gradient, mode)
    unreliable = curvatures_at_rounding_level(gradient, mode, precision)
    if unreliable:
        warnings.warn(f"Laplace approximation: the curvature at the mode of coordinate(s) {unreliable} changes by "
                      f"more than 10% with the differencing step (rounding in the gradient, or a step too large for "
                      f"the density's shape), so their variance is not reliable; the density may be flat there",
                      RobustStanWarning, stacklevel=3)
    covariance, log_det_precision = covariance_of_precision(precision)
    cholesky = np.linalg.cholesky(0.5 * (covariance + covariance.T))
    log_normaliser = -float(result.fun) + 0.5 * mode.size * np.log(2 * np.pi) - 0.5 * log_det_precision
    return LaplaceApproximation(mode, covariance, cholesky, log_normaliser, bool(result.success))
