"""Calibrating a generalized posterior: its learning rate (Lyddon, Holmes and Walker 2019) and its
spread (the curvature adjustment of Ribatet, Cooley and Davison 2012 and Shaby 2014).

Both use the sandwich matrices of the loss at its minimum theta_hat, on the program's
unconstrained scale, per row (N rows):

    J = (1/N) sum_i Hessian of l_i(theta_hat),      I = (1/N) sum_i grad l_i grad l_i^T (theta_hat).

The minimum-loss estimate theta_hat has sampling covariance J^-1 I J^-1 / N, while the
posterior with learning rate w has covariance (w N J)^-1 for large N.

- LHW's information matching: w = tr(J I^-1 J) / tr(J), the scalar that makes the posterior's
  precision match the estimate's in trace (their section 3.2).
- Syring and Martin's (2019) general posterior calibration: w such that the (1 - alpha) credible
  sets of the w-posteriors of bootstrap resamples of the data cover theta_hat in a share 1 - alpha
  of them. The sets are the posterior's Mahalanobis ellipsoids about its mean (its normal-
  approximation HPD set); theta_hat is in the set iff the posterior mass nearer the mean than
  theta_hat is at most 1 - alpha. Each resample is one NUTS fit at some w0 whose draws serve every
  other w through importance ratios exp(-(w - w0) L(theta)), L the resample's total loss,
  Pareto-smoothed; where k-hat exceeds 0.7 the resample is fitted again at w. A smaller w widens
  the posterior, and then k is taken as at least 1 - w / w0, the weights' tail index for a
  near-normal posterior (:func:`tempering_k`), which k-hat from a finite sample can miss. The
  coverage falls as w grows, and w is found by bisection on log w.
- The curvature adjustment: draws theta_s become theta_hat + C (theta_s - theta_hat) with
  C = chol(S) chol(P)^-1, P the draws' covariance and S = J^-1 I J^-1 / N, so the adjusted
  draws have covariance S exactly. The map is centred on the estimate theta_hat, as Ribatet et
  al.'s theta* = theta_hat + C (theta - theta_hat) and Shaby's open-faced sandwich are: their mean
  becomes theta_hat + C (theta_bar - theta_hat), theta_bar the draws' mean. (Centred on theta_bar
  instead, a posterior spread over two modes keeps its mean between them and shrinks about it,
  away from both.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from ...common.errors import RobustStanInputError
from ..importance import K_HAT_LIMIT, psis


def loss_minimum(loss_and_gradient: Callable[[np.ndarray], tuple[float, np.ndarray]],
                 start: np.ndarray) -> np.ndarray:
    """theta_hat = argmin of the total loss by L-BFGS from ``start``; an error if it does not converge."""
    result = optimize.minimize(loss_and_gradient, np.asarray(start, dtype=float), jac=True, method="L-BFGS-B",
                               options={"maxiter": 5000, "gtol": 1e-9, "ftol": 1e-15})
    # L-BFGS-B can stop "ABNORMAL" in its line search once rounding swamps the last decrease; a
    # gradient already below 1e-6 of the loss's size is a minimum all the same
    settled = result.success or np.max(np.abs(result.jac)) <= 1e-6 * max(1.0, abs(float(result.fun)))
    if not (settled and np.all(np.isfinite(result.x))):
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


def curvature_adjusted(draws: np.ndarray, target_covariance: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """The draws (..., d) mapped affinely about ``centre`` (theta_hat) so that their covariance is
    ``target_covariance`` (module docstring)."""
    flat = draws.reshape(-1, draws.shape[-1])
    if flat.shape[0] <= flat.shape[1]:
        raise RobustStanInputError(f"fit: need more draws than parameters ({flat.shape[1]}) to adjust them")
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


def minimum_loss(posterior, prior, per_example, start: np.ndarray) -> MinimumLoss:
    """theta_hat = argmin sum_i l_i (prior left out) from ``start``, with J and I there from the
    per-example gradients.

    ``posterior`` is the model's log density at learning rate 1 and ``prior`` its prior alone
    (gradient oracles, Jacobians included, so they cancel); ``per_example`` gives grad l_i
    (``gradients(theta)``): a model's :class:`~robust_stan.methods.rob_ula.sampler.LangevinTarget`
    at learning rate 1 holds all three."""

    def loss_and_gradient(theta: np.ndarray) -> tuple[float, np.ndarray]:
        """sum_i l_i(theta) and its gradient: the posterior at w = 1 less the prior (Jacobians cancel)."""
        lp, gradient = posterior.log_density_gradient(theta)
        prior_lp, prior_gradient = prior.log_density_gradient(theta)
        return -(lp - prior_lp), -(gradient - prior_gradient)

    theta_hat = loss_minimum(loss_and_gradient, start)
    rows = per_example.gradients(theta_hat)
    curvature, information = sandwich_matrices(rows, lambda theta: loss_and_gradient(theta)[1], theta_hat)
    return MinimumLoss(theta_hat, curvature, information, rows.shape[0])


@dataclass(frozen=True)
class BootstrapPosterior:
    """Draws (S, d) of one resample's posterior at learning rate ``learning_rate`` (unconstrained),
    with the resample's total loss L at each draw (S,)."""

    draws: np.ndarray
    total_loss: np.ndarray
    learning_rate: float


def tempering_k(from_w: float, to_w: float) -> float:
    """The Pareto tail index of the importance weights that take a near-normal posterior at learning
    rate ``from_w`` to ``to_w``: the ratio exp(-(to_w - from_w) L) of two normals whose variances are in
    the ratio to_w / from_w has k = 1 - to_w / from_w when the target is wider (to_w < from_w), in any
    dimension, and 0 otherwise. k-hat, estimated from a finite sample, can fall below it, and sets
    reweighted on its word are then too narrow."""
    return max(0.0, 1.0 - to_w / from_w)


def covers(posterior: BootstrapPosterior, w: float, theta_hat: np.ndarray, level: float) -> tuple[bool, float]:
    """Whether the level-``level`` credible ellipsoid of the w-posterior (reweighted from the draws)
    holds theta_hat, and the reweighting's k-hat (0 when w is the draws' own), at least
    :func:`tempering_k` when the reweighting widens the posterior."""
    draws = posterior.draws
    if w == posterior.learning_rate:
        weights, khat = np.full(draws.shape[0], 1.0 / draws.shape[0]), 0.0
    else:
        log_weights, khat = psis(-(w - posterior.learning_rate) * posterior.total_loss)
        weights = np.exp(log_weights)
        if np.isnan(khat):
            khat = np.inf
        elif w < posterior.learning_rate:
            khat = max(khat, tempering_k(posterior.learning_rate, w))
    mean = weights @ draws
    centred = draws - mean
    precision = np.linalg.inv(np.atleast_2d(centred.T @ (centred * weights[:, None])))
    distance = np.einsum("sd,de,se->s", centred, precision, centred)
    gap = theta_hat - mean
    mass_nearer = float(weights[distance < gap @ precision @ gap].sum())
    return mass_nearer <= level, khat


def bootstrap_learning_rate(theta_hat: np.ndarray, posteriors: list[BootstrapPosterior],
                            refit: Callable[[int, float], BootstrapPosterior], level: float = 0.9,
                            start: float = 1.0, tolerance: float = 0.01, limits=(1e-4, 1e4)) -> tuple[float, list[dict]]:
    """The w whose bootstrap coverage of theta_hat is ``level`` (module docstring), to a relative
    ``tolerance`` in w; ``refit(b, w)`` fits resample b at w (where reweighting is not trusted,
    and replaces its draws). Returns w and the coverage at every w tried."""
    posteriors = list(posteriors)
    trace: list[dict] = []
    known: dict[float, float] = {}

    def coverage(w: float) -> float:
        if w in known:
            return known[w]
        hits = []
        for b, posterior in enumerate(posteriors):
            hit, khat = covers(posterior, w, theta_hat, level)
            if khat > K_HAT_LIMIT:
                posteriors[b] = refit(b, w)
                hit, _ = covers(posteriors[b], w, theta_hat, level)
            hits.append(hit)
        trace.append({"w": w, "coverage": float(np.mean(hits))})
        known[w] = trace[-1]["coverage"]
        return known[w]

    low, high = start, start  # widen until coverage(low) >= level >= coverage(high)
    while coverage(low) < level:
        low /= 4
        if low < limits[0]:
            raise RuntimeError(f"calibrate: the bootstrap coverage stays below {level} even at w = {low:.2g}")
    while coverage(high) > level:
        high *= 4
        if high > limits[1]:
            raise RuntimeError(f"calibrate: the bootstrap coverage stays above {level} even at w = {high:.2g}")
    while high / low > 1 + tolerance:
        middle = float(np.sqrt(low * high))
        if coverage(middle) > level:
            low = middle
        else:
            high = middle
    return float(np.sqrt(low * high)), trace
