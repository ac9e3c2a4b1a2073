"""Rob-ULA: the unadjusted Langevin algorithm with a robust mean of per-example gradients.

Bhatia, Ma, Dragan, Bartlett and Jordan (2019). With g_i the loss of
observation i (minus its log-likelihood, or the robust loss of a divergence),
each step on the unconstrained scale is

    G = [grad g_i(theta) for every i]                       (one per-example call)
    m = RobustGradientEstimate(G L, epsilon)                  (robust_stan.methods.rob_ula.estimators)
    z   <- z - eta * (w * n * m - L' grad log prior(theta)) + sqrt(2 eta) * xi,   theta = L z,

where the prior's gradient includes the log-Jacobian of the constraining
transforms, so the chain targets the posterior of the unconstrained parameters.
L is a fixed preconditioner (the paper's update is L = I); the warmup that
chooses it, the starting points and the step size are described in rob_ula().
epsilon, in the paper's notation kept by the helpers here, is the contamination
fraction (``rs.rob_ula``'s ``contamination``).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy import optimize
from tqdm.auto import tqdm

from ...building.data import with_switches
from ...common.errors import RobustStanInputError, RobustStanWarning, require_count, require_positive, require_seed
from ...engines import RawDraws
from ...gradients.oracles import GradientOracle, constrained_draws
from ...gradients.per_example import PerExampleGradients
from ...gradients.program import GeneratedProgram
from .estimators import estimate_each, get_estimator, mean as plain_mean, outlier_truncation


@dataclass(frozen=True)
class RobULASettings:
    """Rob-ULA run settings (``chains``, ``iter_warmup``, ``iter_sampling`` as for NUTS), checked when
    made (an error names the argument); the run fills in the estimator's name and the step size.

    Parameters
    ----------
    chains, iter_sampling, thin : int
        Counts, each >= 1.
    iter_warmup : int
        Warmup iterations, >= 0.
    seed : int or None
        The seed; None: the run draws its own and cannot be repeated.
    contamination : float
        The assumed share of corrupted rows, in [0, 0.5).
    estimator : str
        The robust mean's name (the run's; "" before it).
    step_size : float or None
        The step; None before the run when it is chosen there (positive when given).
    show_progress : bool
        Show a progress bar.
    inits : {"mode", "random"}, default "mode"
        Where the chains start.
    metric : {"dense", "diag", "unit"}, default "dense"
        The drift's preconditioning.

    Raises
    ------
    RobustStanInputError
        If a value is out of range.
    """

    chains: int
    iter_warmup: int
    iter_sampling: int
    thin: int
    seed: int | None  # None: the run drew its own and cannot be repeated
    contamination: float
    estimator: str
    step_size: float | None
    show_progress: bool
    inits: str = "mode"
    metric: str = "dense"

    def __post_init__(self) -> None:
        contamination = self.contamination
        if not (isinstance(contamination, (int, float)) and not isinstance(contamination, bool)
                and 0 <= contamination < 0.5):
            raise RobustStanInputError(f"contamination: must lie in [0, 0.5), got {contamination!r}")
        object.__setattr__(self, "contamination", float(contamination))
        for name, low in (("iter_sampling", 1), ("iter_warmup", 0), ("thin", 1), ("chains", 1)):
            object.__setattr__(self, name, require_count(name, getattr(self, name), low))
        if self.step_size is not None:
            object.__setattr__(self, "step_size", require_positive("step_size", self.step_size))
        if self.inits not in INITS:
            raise RobustStanInputError(f"inits: must be one of {', '.join(INITS)}, got {self.inits!r}")
        if self.metric not in METRICS:
            raise RobustStanInputError(f"metric: must be one of {', '.join(METRICS)}, got {self.metric!r}")
        object.__setattr__(self, "seed", require_seed(self.seed))


METRICS = ("dense", "diag", "unit")
INITS = ("mode", "random")
DEFAULT_STEP = 0.2  # in the preconditioned coordinates; see rob_ula's docstring


@dataclass(frozen=True)
class Preconditioner:
    """theta = L z: the chain moves in z, where the drift's Hessian at the adaptation point is
    (close to) the identity. ``factor`` is L; the inverse metric is M = L L^T, as in Stan."""

    kind: str
    factor: np.ndarray
    largest_curvature: float  # largest |eigenvalue| of L^T H L, which sets the default step

    @property
    def inverse_metric(self) -> np.ndarray:
        return self.factor @ self.factor.T

    def then(self, slope: np.ndarray) -> Preconditioner:
        """Rescaled so that ``slope`` (the drift's Jacobian in this preconditioner's coordinates)
        becomes the identity, each direction's scale changed by a factor 1/2 to 2 at most.

        The rescaling is the clipped slope's symmetric inverse square root, a continuous function
        of the slope: near the identity (an estimator that keeps the clean rows whole) the
        slope's eigenvectors are arbitrary, and a factor built from them would turn the chain's
        coordinates with every rounding difference (in-memory against partitions on workers)."""
        if not np.all(np.isfinite(slope)):
            return self
        if self.kind == "diag":
            inner = np.diag(np.clip(np.abs(np.diag(slope)), 0.25, 4.0) ** -0.5)
        else:
            values, vectors = np.linalg.eigh(slope)
            inner = (vectors * np.clip(np.abs(values), 0.25, 4.0) ** -0.5) @ vectors.T
        curvature = np.abs(np.linalg.eigvalsh(inner.T @ slope @ inner)).max()
        return Preconditioner(self.kind, self.factor @ inner, float(curvature))


@dataclass(frozen=True)
class RobULAOutput:
    """What the sampler returns: the draws (``raw``), its settings, the final inverse metric
    M = L L^T and the draws of theta on the unconstrained scale (chains, draws, d)."""

    raw: RawDraws
    settings: RobULASettings
    inverse_metric: np.ndarray
    unconstrained_draws: np.ndarray


def default_estimator(family) -> str:
    """The estimator ``estimator="auto"`` picks: "row_trimmed_mean" for continuous outcomes,
    "trimmed_mean" (coordinate-wise) for discrete ones.

    Parameters
    ----------
    family : Family
        The likelihood's family record; its ``continuous`` flag decides.

    Why (``examples/results/rob_ula_bias``, issue 51): Rob-ULA aims at the posterior given the
    clean rows. The row-trimmed mean drops the epsilon n rows whose whitened gradients lie
    farthest from the coordinate-wise median, so where the corrupted rows are those, its drift
    is the clean rows' own and the chain centres on their posterior (the measured bias, on normal
    regressions with outliers in y or bad leverage points, is in that results page). The
    coordinate-wise trimmed mean cuts epsilon n values from both ends of every coordinate: under
    one-sided outliers it also cuts clean rows from the other end, which moves the intercept and
    the scale by a fixed fraction of a residual sd, and the dense metric mixes that into the
    coefficients. A wrong label, though, has a gradient no larger than a clean misclassified
    row's, so on logistic regression with flipped labels the rows farthest away are the
    informative clean ones, and dropping them overstates the coefficients: there the trimmed
    mean was the less biased of the two in the study (neither is unbiased).
    """
    return "row_trimmed_mean" if family.continuous else "trimmed_mean"


def drift_hessian(drift, point: np.ndarray) -> np.ndarray:
    """Symmetrised forward-difference Jacobian of ``drift`` (the gradient of -log target) at point:
    d + 1 calls."""
    base = drift(point)
    d = point.size
    hessian = np.empty((d, d))
    for j in range(d):
        h = 1e-5 * max(1.0, abs(float(point[j])))
        shifted = point.copy()
        shifted[j] += h
        hessian[:, j] = (drift(shifted) - base) / h
    return (hessian + hessian.T) / 2


def preconditioner(hessian: np.ndarray, kind: str) -> Preconditioner:
    """L from a Hessian: ``dense`` L = V |Lambda|^(-1/2) (eigenvalues below 1e-8 of the largest
    raised to it, so a saddle or a flat direction gets a finite scale), ``diag`` L = diag(|H_jj|)^(-1/2),
    ``unit`` L = I. A Hessian that is not finite gives the unit metric."""
    d = hessian.shape[0]
    if kind == "unit" or not np.all(np.isfinite(hessian)) or not np.any(hessian):
        factor = np.eye(d)
    elif kind == "diag":
        scale = np.abs(np.diag(hessian))
        floor = max(scale.max(), 1e-300) * 1e-8
        factor = np.diag(1 / np.sqrt(np.maximum(scale, floor)))
    else:
        values, vectors = np.linalg.eigh(hessian)
        values = np.abs(values)
        values = np.maximum(values, values.max() * 1e-8)
        factor = vectors / np.sqrt(values)
    curvature = np.abs(np.linalg.eigvalsh(factor.T @ hessian @ factor)).max() if np.all(np.isfinite(hessian)) else 0.0
    return Preconditioner(kind, factor, float(curvature))


def estimator_drift_slope(z_drift, d: int, h: float = 0.5) -> np.ndarray:
    """Symmetrised central-difference Jacobian at z = 0 of the drift the chain follows, over
    +-h in the Laplace coordinates (h = 0.5 of a posterior sd): a truncating or trimming
    estimator's drift is piecewise smooth and its slope is not the kept rows' Hessian; steps
    this wide average over the jumps where its kept set changes. 2 d gradient calls."""
    slope = np.empty((d, d))
    for j in range(d):
        step = np.zeros(d)
        step[j] = h
        slope[:, j] = (z_drift(step) - z_drift(-step)) / (2 * h)
    return (slope + slope.T) / 2


def find_mode(posterior, start: np.ndarray) -> tuple[np.ndarray, bool]:
    """The maximum of the log density (Jacobian included: the density the chain targets) by
    L-BFGS from ``start``; the point reached and whether the optimiser reported success."""

    def objective(theta):
        lp, grad = posterior.log_density_gradient(theta, jacobian=True)
        if not np.isfinite(lp):
            return np.inf, np.zeros_like(theta)
        return -lp, -np.asarray(grad)

    result = optimize.minimize(objective, start, jac=True, method="L-BFGS-B", options={"maxiter": 2000})
    return result.x, bool(result.success and np.all(np.isfinite(result.x)))


def kept_rows(per_example, point: np.ndarray, whiten: np.ndarray, epsilon: float) -> np.ndarray:
    """Indices of the rows Algorithm 3 keeps at ``point``, looking at the gradients through
    ``whiten`` (every row when epsilon is 0 or a gradient is not finite)."""
    with np.errstate(over="ignore", invalid="ignore"):
        whitened = per_example.gradients_many_in(point[None, :], whiten)[0]
        if epsilon == 0 or not np.all(np.isfinite(whitened)):
            return np.arange(per_example.n)
        return np.flatnonzero(outlier_truncation(whitened, epsilon))


def kept_rows_hessian(per_example, prior, rows: np.ndarray, point: np.ndarray, loss_scale: float) -> np.ndarray:
    """Hessian at ``point`` of -log prior + loss_scale * (mean loss over ``rows``)."""

    def drift(theta: np.ndarray) -> np.ndarray:
        mean_gradient = per_example.gradients(theta, batch=rows).mean(axis=0)
        return loss_scale * mean_gradient - prior.gradient(theta, jacobian=True)

    return drift_hessian(drift, point)


def trimmed_mode(weighted_oracle, per_example, start: np.ndarray, epsilon: float, whiten: np.ndarray,
                 max_steps: int = 10) -> tuple[np.ndarray, bool]:
    """The robust drift's rest point, by concentration steps (as for least trimmed squares): keep
    the rows Algorithm 3 keeps at the current point, maximise the prior plus those rows' scaled
    log-likelihood, and repeat until the kept rows stop changing. ``weighted_oracle(rows)`` is the
    posterior with weight total / len(rows) on those rows and 0 elsewhere."""
    point, rows, converged = start, None, True
    for _ in range(max_steps):
        new_rows = kept_rows(per_example, point, whiten, epsilon)
        if rows is not None and np.array_equal(new_rows, rows):
            break
        rows = new_rows
        point, converged = find_mode(weighted_oracle(rows), point)
    return point, converged


def rows_weighted(weighted: Callable[[np.ndarray], GradientOracle] | None, n: int, total: float) -> Callable:
    """rows -> ``weighted(w)`` with w = total / len(rows) on those of the n rows and 0 elsewhere: the
    posterior as if those rows were all ``total`` of the data (the optimiser's view in
    :func:`trimmed_mode`)."""

    def oracle(rows: np.ndarray):
        weights = np.zeros(n)
        weights[rows] = total / rows.size
        assert weighted is not None, "a target without weighted(w) finds its modes by its own robust_mode"
        return weighted(weights)

    return oracle


def robust_mode(weighted_oracle, per_example, prior, start: np.ndarray, epsilon: float, loss_scale: float,
                metric: str, plain: bool) -> tuple[np.ndarray, bool]:
    """Where ``inits="mode"`` starts the chains: the posterior mode from ``start`` (L-BFGS), then,
    unless the estimator is the plain mean, the robust drift's rest point (:func:`trimmed_mode`,
    looking at the gradients through the metric of the Hessian at the mode). The point, and
    whether the optimiser converged. ``weighted_oracle(rows)`` is the posterior with weight
    total / len(rows) on those rows of ``per_example``; ``loss_scale`` the loss's total scale."""
    every_row = np.arange(per_example.n)
    point, converged = find_mode(weighted_oracle(every_row), start)
    if converged and not plain:
        whiten = preconditioner(kept_rows_hessian(per_example, prior, every_row, point, loss_scale), metric).factor
        point, converged = trimmed_mode(weighted_oracle, per_example, point, epsilon, whiten)
    return point, converged


@dataclass(frozen=True)
class LangevinTarget:
    """What Rob-ULA needs of a model with its data.

    Built by ``builtin_target`` for the built-in models and by
    ``StanProgramModel.langevin_target`` for robustified programs.

    Parameters
    ----------
    per_example : object
        Gives grad l_i: ``n``, ``dimension``, ``gradients(theta, batch=None)``,
        ``gradients_many(thetas)`` and ``gradients_many_in(thetas, factor)``.
    prior : GradientOracle
        The prior alone (Jacobian included).
    posterior : GradientOracle or None
        The model as prepared; None with ``log_densities`` given.
    weighted : callable or None
        ``w -> GradientOracle``: the prior plus the likelihood with weights w per row.
    output : callable
        ``() -> GradientOracle`` whose constrained values become the draws.
    learning_rate : float
        The loss's scale w.
    default_estimator : str
        What ``estimator="auto"`` means for this likelihood.
    robust_means : callable or None, default None
        Rows held in partitions: ``(thetas, factor, estimate, epsilon) -> (robust means, kept
        shares)``; ``per_example`` then gives only n and dimension.
    robust_start : callable or None, default None
        With ``robust_means``: ``(start, epsilon, total, metric, plain) -> (point, converged)``,
        the start of ``inits="mode"``.
    kept_loss_hessian : callable or None, default None
        With ``robust_means``: ``(point, epsilon) -> H``, the Hessian of the mean loss over the
        rows Algorithm 3 keeps at ``point``, for the metric and the default step.
    log_densities : callable or None, default None
        ``thetas (S, d) -> log pi`` at each, Jacobian included (when ``posterior`` is None).
    """

    per_example: Any
    prior: GradientOracle
    posterior: GradientOracle | None
    weighted: Callable[[np.ndarray], GradientOracle] | None
    output: Callable[[], GradientOracle]
    learning_rate: float
    default_estimator: str
    #: for rows held in partitions (robust_stan.methods.rob_ula.partitioned): ``(thetas, factor, estimate,
    #: epsilon) -> (robust means, kept shares)``; ``per_example`` then gives only n and dimension
    robust_means: Callable | None = None
    #: with ``robust_means``: ``(start, epsilon, total, metric, plain) -> (point, converged)``, the
    #: start of ``inits="mode"`` (``robust_mode`` over the rows, as the partitions give it) ...
    robust_start: Callable | None = None
    #: ... and ``(point, epsilon) -> H``, the Hessian of the mean loss over the rows Algorithm 3
    #: keeps at ``point`` (every row at epsilon 0), for the metric and the default step
    kept_loss_hessian: Callable | None = None
    #: ``(thetas (S, d)) -> log pi`` at each, Jacobian included (when ``posterior`` is None)
    log_densities: Callable | None = None

    def log_density_at(self, thetas: np.ndarray) -> np.ndarray:
        """log pi (Jacobian included) at each of several states.

        Parameters
        ----------
        thetas : numpy.ndarray
            (..., d) unconstrained states.

        Returns
        -------
        numpy.ndarray
            (...), NaN where a state is not finite.
        """
        flat = thetas.reshape(-1, thetas.shape[-1])
        values = np.full(flat.shape[0], np.nan)
        finite = np.all(np.isfinite(flat), axis=1)
        if finite.any():
            if self.log_densities is not None:
                values[finite] = self.log_densities(flat[finite])
            else:
                assert self.posterior is not None  # given where log_densities is not
                values[finite] = [self.posterior.log_density(theta, jacobian=True) for theta in flat[finite]]
        return values.reshape(thetas.shape[:-1])


def builtin_target(program: GeneratedProgram, stan_data: dict, oracle: str = "auto") -> LangevinTarget:
    """The :class:`LangevinTarget` of a built-in model's program with prepared ``stan_data``: its
    per-example mode, its prior-only mode, and weights and per-observation output chosen by data."""
    return LangevinTarget(
        per_example=PerExampleGradients(program, stan_data, oracle),
        prior=program.oracle_for(with_switches(stan_data, mode="prior"), oracle),
        posterior=program.oracle_for(stan_data, oracle),
        weighted=lambda weights: program.oracle_for(with_switches(stan_data, weights=weights), oracle),
        output=lambda: program.oracle_for(with_switches(stan_data, pointwise=False), oracle),
        learning_rate=float(stan_data["learning_rate"]),
        default_estimator=default_estimator(program.spec.family),
    )


def run_rob_ula(target: LangevinTarget, contamination: float, step_size: float | None = None,
                iter_sampling: int = 5000, iter_warmup: int = 500, thin: int = 1, chains: int = 4, estimator="auto",
                inits: str = "mode", init_scale: float = 1.0, metric: str = "dense", seed: int | None = None,
                show_progress: bool = True, log_density: bool = True,
                gradient_total: str = "n") -> RobULAOutput:
    """Rob-ULA on a model with its data (``target``, learning rate included): the warmup and the
    chains that :func:`robust_stan.rob_ula` describes, whose options these are.
    """
    settings = RobULASettings(chains, iter_warmup, iter_sampling, thin, seed, contamination, "", step_size,
                              show_progress, inits, metric)
    chains, iter_warmup, iter_sampling, thin = settings.chains, settings.iter_warmup, settings.iter_sampling, settings.thin
    contamination, step_size, seed = settings.contamination, settings.step_size, settings.seed
    init_scale = require_positive("init_scale", init_scale)
    estimate = get_estimator(target.default_estimator if estimator == "auto" else estimator)
    if gradient_total not in ("n", "clean"):
        raise RobustStanInputError(f"gradient_total: must be 'n' or 'clean', got {gradient_total!r}")
    learning_rate = target.learning_rate
    per_example, prior = target.per_example, target.prior
    n, d = per_example.n, per_example.dimension
    total = n if gradient_total == "n" else (1 - contamination) * n
    plain = estimate is plain_mean  # ULA follows every row
    rng = np.random.default_rng(seed)  # None: fresh entropy from the operating system

    loss_scale = learning_rate * total
    truncated_share = 0.0 if plain else contamination

    weighted_oracle = rows_weighted(target.weighted, n, total)

    def robust_means(thetas: np.ndarray, factor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each state's robust mean of the per-example gradients in the coordinates z of
        theta = factor z (G factor), and the share of rows kept; NaN where G is not finite."""
        if target.robust_means is not None:
            return target.robust_means(thetas, factor, estimate, contamination)
        with np.errstate(over="ignore", invalid="ignore"):
            return estimate_each(per_example.gradients_many_in(thetas, factor), estimate, contamination)

    def z_drift(mean_z: np.ndarray, theta: np.ndarray, L: np.ndarray) -> np.ndarray:
        """The drift the chain follows in the coordinates z of theta = L z, from the robust mean
        of the per-example gradients in those coordinates at theta."""
        return loss_scale * mean_z - prior.gradient(theta, jacobian=True) @ L

    def kept_hessian(point: np.ndarray) -> np.ndarray:
        """The Hessian at ``point`` of -log prior + loss_scale * (mean loss over the rows kept there)."""
        if target.kept_loss_hessian is None:
            rows = kept_rows(per_example, point, np.eye(d), truncated_share)
            return kept_rows_hessian(per_example, prior, rows, point, loss_scale)
        prior_hessian = drift_hessian(lambda theta: -prior.gradient(theta, jacobian=True), point)
        return loss_scale * target.kept_loss_hessian(point, truncated_share) + prior_hessian

    def adapted(point: np.ndarray) -> Preconditioner:
        """The preconditioner at ``point``: the kept rows' Hessian, then the estimator's own slope."""
        if metric == "unit" and step_size is not None:  # nothing to adapt or to take the step from
            return Preconditioner("unit", np.eye(d), np.nan)
        laplace = preconditioner(kept_hessian(point), metric)
        if metric == "unit":
            return laplace

        def drift_at(z: np.ndarray) -> np.ndarray:
            theta = point + laplace.factor @ z
            return z_drift(robust_means(theta[None, :], laplace.factor)[0][0], theta, laplace.factor)

        return laplace.then(estimator_drift_slope(drift_at, d))

    start = rng.normal(scale=init_scale, size=d)
    if inits == "mode":
        if target.robust_start is None:
            start, converged = robust_mode(weighted_oracle, per_example, prior, start, contamination, loss_scale,
                                           metric, plain)
        else:
            start, converged = target.robust_start(start, contamination, total, metric, plain)
        if not converged:
            warnings.warn("rob_ula: the optimiser did not converge to a mode; the chains start from where it "
                          "stopped. Pass inits='random' or check the model.", RobustStanWarning, stacklevel=3)
    scaling = adapted(start)
    if inits == "mode":
        theta = start + init_scale * rng.normal(size=(chains, d)) @ scaling.factor.T
    else:
        theta = np.vstack([start, rng.normal(scale=init_scale, size=(chains - 1, d))])

    if step_size is None and not scaling.largest_curvature > 0:
        raise RuntimeError("step_size: could not estimate the curvature at the starting point; give step_size")
    eta = step_size if step_size is not None else DEFAULT_STEP / scaling.largest_curvature
    L = scaling.factor
    kept_draws = iter_sampling // thin
    thetas = np.full((chains, kept_draws, d), np.nan)
    kept = np.full((chains, kept_draws), np.nan)
    alive = np.ones(chains, dtype=bool)
    with tqdm(total=iter_warmup + iter_sampling, desc=f"Rob-ULA ({estimate.__name__})", unit="it",
              disable=not show_progress, file=sys.stderr) as bar:
        for k in range(iter_warmup + iter_sampling):
            means, kept_shares = robust_means(theta[alive], L)  # in the chain's coordinates z
            step = np.zeros((chains, d))
            fractions = np.full(chains, np.nan)
            for slot, c in enumerate(np.flatnonzero(alive)):
                if not np.all(np.isfinite(means[slot])):
                    fractions[c], step[c] = np.nan, np.nan  # stopped below as diverged
                    continue
                fractions[c] = kept_shares[slot]
                step[c] = -eta * z_drift(means[slot], theta[c], L)
            with np.errstate(over="ignore", invalid="ignore"):  # a diverging chain is reported below
                proposal = theta + (step + np.sqrt(2 * eta) * rng.normal(size=(chains, d))) @ L.T
            broken = alive & ~np.all(np.isfinite(proposal), axis=1)
            if broken.any():
                warnings.warn(f"Rob-ULA: chain(s) {list(np.flatnonzero(broken) + 1)} diverged at iteration {k + 1} "
                              "(non-finite state); their remaining draws are NaN. Try a smaller step_size.",
                              RuntimeWarning, stacklevel=3)
                alive &= ~broken
                if not alive.any():
                    break
            theta[alive] = proposal[alive]
            j = k - iter_warmup
            if j >= 0 and j % thin == 0 and j // thin < kept_draws:
                thetas[alive, j // thin] = theta[alive]
                kept[:, j // thin] = fractions
            bar.update()

    variables = constrained_draws(target.output(), thetas)
    sampler = {"lp__": target.log_density_at(thetas)} if log_density else {}
    sampler.update(step_size=np.full((chains, kept_draws), eta), kept_fraction=kept)
    settings = replace(settings, estimator=getattr(estimate, "__name__", "custom"), step_size=float(eta))
    return RobULAOutput(RawDraws(variables, sampler), settings, scaling.inverse_metric, thetas)
