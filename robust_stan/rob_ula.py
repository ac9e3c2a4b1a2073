"""Rob-ULA: the unadjusted Langevin algorithm with a robust mean of per-example gradients.

Bhatia, Ma, Dragan, Bartlett and Jordan (2019). With g_i the loss of
observation i (minus its log-likelihood, or the robust loss of a divergence),
each step on the unconstrained scale is

    G = [grad g_i(theta) for every i]                       (one per-example call)
    m = RobustGradientEstimate(G, epsilon)                    (robust_stan.estimators)
    theta <- theta - eta * (w * n * m - grad log prior(theta)) + sqrt(2 eta) * xi,

where the prior's gradient includes the log-Jacobian of the constraining
transforms, so the chain targets the posterior of the unconstrained parameters.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from .data import prepare_data
from .divergences import Divergence, as_divergence
from .engines import RawDraws
from .errors import RobustStanInputError, require_count, require_positive
from . import estimators
from .estimators import get_estimator, outlier_truncation
from .fit import Fit
from .oracles import constrained_draws


@dataclass(frozen=True)
class RobULASettings:
    """Rob-ULA run settings (``chains``, ``iter_warmup``, ``iter_sampling`` as for NUTS)."""

    chains: int
    iter_warmup: int
    iter_sampling: int
    thin: int
    seed: int
    epsilon: float
    estimator: str
    step_size: float
    show_progress: bool


class RobULAFit(Fit):
    """Draws from Rob-ULA, with the same draws(), summary() and to_arviz() as a NUTS fit.

    ``sample_stats`` holds per draw: ``lp`` (log density, unless left out), ``step_size`` and
    ``kept_fraction`` (rows the robust estimator kept at that step).
    """

    method = "rob_ula"

    def diagnostics(self) -> dict:
        """Chains that diverged, the mean kept fraction and the largest R-hat."""
        return {
            "diverged_chains": int(sum(not np.all(np.isfinite(chain)) for chain in next(iter(self.posterior.values())))),
            "mean_kept_fraction": float(np.nanmean(self.raw.sampler["kept_fraction"])),
            "max_r_hat": float(self.summary()["r_hat"].max()),
        }

    def __repr__(self) -> str:
        s = self.settings
        return (f"<robust_stan.RobULAFit {self.divergence!r}, estimator {s.estimator!r}, epsilon {s.epsilon:g}, "
                f"{s.chains} chains x {s.iter_sampling // s.thin} draws, parameters {self.parameter_names}>")


def curvature_step_size(gradient, theta: np.ndarray, rng: np.random.Generator, iterations: int = 20,
                        fraction: float = 0.1) -> float:
    """``fraction`` / (largest eigenvalue of the Hessian of -log posterior at theta).

    The eigenvalue comes from power iteration on finite-difference
    Hessian-vector products of ``gradient`` (the gradient of -log posterior).
    """
    v = rng.normal(size=theta.size)
    v /= np.linalg.norm(v)
    g0 = gradient(theta)
    h = 1e-5 * max(1.0, float(np.linalg.norm(theta)))
    largest = 0.0
    for _ in range(iterations):
        hv = (gradient(theta + h * v) - g0) / h
        norm = float(np.linalg.norm(hv))
        if not np.isfinite(norm) or norm == 0:
            break
        largest = max(abs(float(v @ hv)), largest if largest else 0.0)
        v = hv / norm
    if not largest > 0:
        raise RuntimeError("step_size: could not estimate the curvature at the starting point; give step_size")
    return fraction / largest


def rob_ula(model, data: Mapping, epsilon: float, step_size: float | None = None, iters: int = 1000,
            warmup: int = 300, thin: int = 1, chains: int = 4, estimator="lrv",
            divergence: Divergence | None = None, learning_rate: float = 1.0, init_scale: float = 1.0,
            seed: int | None = None, show_progress: bool = True, oracle: str = "auto",
            generated_quantities: bool = True, log_density: bool = True,
            gradient_total: str = "n") -> RobULAFit:
    """Sample with Rob-ULA; returns a fit like :meth:`Model.sample`'s.

    ``epsilon`` in [0, 0.5) is the assumed fraction of corrupted observations;
    ``estimator`` is a name from :data:`robust_stan.estimators.ESTIMATORS`
    ("lrv", "mean" = plain ULA, "coordinate_median", "trimmed_mean",
    "median_of_means", "geometric_median") or a callable ``(G, epsilon)``.
    ``iters`` kept iterations (before thinning) follow ``warmup`` discarded ones.
    The robust mean of the per-example gradients is multiplied by n
    (``gradient_total="n"``, the paper's choice) or by (1 - epsilon) n
    (``"clean"``, the expected number of clean rows).
    Chains start at theta_0 ~ N(0, init_scale^2 I) on the unconstrained scale.

    Default step size: 0.1 / lambda_max, with lambda_max the largest eigenvalue
    of the Hessian of -log prior + w * total * (mean loss over the rows that
    Algorithm 3 keeps at the first chain's start; all rows when epsilon = 0), by
    power iteration on finite differences of its gradient. So outliers the
    estimator drops do not shrink the step. The paper's bound is eta <= 1/(n L). A chain whose state or gradient stops
    being finite is stopped with a warning; its later draws are NaN.

    Each kept draw costs, besides the step, one full log density (``lp`` in
    sample_stats; ``log_density=False`` skips it) and one constrain call with
    the generated quantities ``log_lik``, ``robust_loss`` and ``y_rep``
    (``generated_quantities=False`` keeps parameters only); ``y_rep`` draws its
    noise from a stream started by ``seed``.
    """
    if not (isinstance(epsilon, (int, float)) and 0 <= epsilon < 0.5):
        raise RobustStanInputError(f"epsilon: must lie in [0, 0.5), got {epsilon!r}")
    iters = require_count("iters", iters)
    warmup = require_count("warmup", warmup, low=0)
    thin = require_count("thin", thin)
    chains = require_count("chains", chains)
    if step_size is not None:
        step_size = require_positive("step_size", step_size)
    init_scale = require_positive("init_scale", init_scale)
    estimate = get_estimator(estimator)
    if gradient_total not in ("n", "clean"):
        raise RobustStanInputError(f"gradient_total: must be 'n' or 'clean', got {gradient_total!r}")
    divergence = as_divergence(divergence)
    learning_rate = require_positive("learning_rate", learning_rate)
    per_example = model.per_example(data, divergence, oracle)   # checks data and divergence
    stan_data = per_example.shared_data
    prior = model.oracle(data, divergence, mode="prior", oracle=oracle)
    posterior = model.oracle(data, divergence, learning_rate=learning_rate, oracle=oracle)
    n, d = per_example.n, per_example.dimension
    total = n if gradient_total == "n" else (1 - epsilon) * n
    rng = np.random.default_rng(seed)
    theta = rng.normal(scale=init_scale, size=(chains, d))

    if step_size is None:
        # Curvature of the mean loss over the rows Algorithm 3 keeps at the start: the
        # estimator's own drift is only piecewise smooth (its kept sets change under the
        # finite-difference probe), and the rows it drops must not shrink the step.
        plain = estimate is estimators.mean  # ULA follows every row's curvature
        with np.errstate(over="ignore", invalid="ignore"):
            rows = np.flatnonzero(outlier_truncation(per_example.gradients(theta[0]), 0.0 if plain else epsilon))

        def kept_rows_drift(point: np.ndarray) -> np.ndarray:
            mean_gradient = per_example.gradients(point, batch=rows).mean(axis=0)
            return learning_rate * total * mean_gradient - prior.gradient(point, jacobian=True)

        step_size = curvature_step_size(kept_rows_drift, theta[0], rng)

    kept_draws = iters // thin
    thetas = np.full((chains, kept_draws, d), np.nan)
    lp = np.full((chains, kept_draws), np.nan)
    kept = np.full((chains, kept_draws), np.nan)
    alive = np.ones(chains, dtype=bool)
    noise_scale = np.sqrt(2 * step_size)
    with tqdm(total=warmup + iters, desc=f"Rob-ULA ({estimate.__name__})", unit="it",
              disable=not show_progress, file=sys.stderr) as bar:
        for k in range(warmup + iters):
            G = per_example.gradients_many(theta[alive])
            step = np.zeros((chains, d))
            fractions = np.full(chains, np.nan)
            for slot, c in enumerate(np.flatnonzero(alive)):
                if not np.all(np.isfinite(G[slot])):
                    fractions[c], step[c] = np.nan, np.nan  # stopped below as diverged
                    continue
                with np.errstate(over="ignore", invalid="ignore"):
                    result = estimate(G[slot], epsilon)
                prior_grad = prior.gradient(theta[c], jacobian=True)
                step[c] = -step_size * (learning_rate * total * result.mean - prior_grad)
                fractions[c] = result.kept_fraction
            with np.errstate(over="ignore", invalid="ignore"):  # a diverging chain is reported below
                proposal = theta + step + noise_scale * rng.normal(size=(chains, d))
            broken = alive & ~np.all(np.isfinite(proposal), axis=1)
            if broken.any():
                warnings.warn(f"Rob-ULA: chain(s) {list(np.flatnonzero(broken) + 1)} diverged at iteration {k + 1} "
                              "(non-finite state); their remaining draws are NaN. Try a smaller step_size.",
                              RuntimeWarning, stacklevel=2)
                alive &= ~broken
                if not alive.any():
                    break
            theta[alive] = proposal[alive]
            j = k - warmup
            if j >= 0 and j % thin == 0 and j // thin < kept_draws:
                thetas[alive, j // thin] = theta[alive]
                kept[:, j // thin] = fractions
                for c in np.flatnonzero(alive) if log_density else ():
                    lp[c, j // thin] = posterior.log_density(theta[c], jacobian=True)
            bar.update()

    variables = constrained_draws(posterior, thetas, bool(generated_quantities), int(rng.integers(2**31)))
    sampler = {"lp__": lp} if log_density else {}
    sampler.update(step_size=np.full((chains, kept_draws), step_size), kept_fraction=kept)
    settings = RobULASettings(chains, warmup, iters, thin, int(seed or 0), float(epsilon),
                              getattr(estimate, "__name__", "custom"), float(step_size), show_progress)
    _, scaling = prepare_data(model.spec, data, divergence, learning_rate)
    fit = RobULAFit(model, RawDraws(variables, sampler), data=data, stan_data=stan_data, scaling=scaling,
                    divergence=divergence, learning_rate=learning_rate, settings=settings)
    fit.warn_if_not_converged()
    return fit
