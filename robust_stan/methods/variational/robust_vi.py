"""Robust variational inference: a Gaussian q fitted to the generalized posterior.

Futami, Sato and Sugiyama (2018) replace the KL data term of variational
inference by the beta or gamma cross-entropy; the optimal q is then the
Gaussian closest (in KL(q || pi)) to the generalized posterior
pi(theta) propto prior(theta) exp(-w sum_i v_i l_i(theta)) (the losses l_i as in
:mod:`robust_stan.building.divergences`), which is the target here for every divergence. q lives on the
unconstrained scale, so the target includes the log-Jacobian of the
constraining transforms.

The driver maximises ELBO(q) = E_q[log pi(theta)] + H(q) by Adam on
reparameterisation gradients: theta_s = mu + L eps_s with eps_s ~ N(0, I),
g_s the gradient of log pi at theta_s, through the "sticking the landing" path
estimator (see _Parameters.elbo_gradient). Mean-field q has diagonal L.

Minibatches: each step draws B rows without replacement and evaluates the
program on those rows only, with weights v_i N / B, which makes the batch log
density an unbiased estimate of the full one (prior included, once). This costs
a vectorised pass over B rows per draw, cheaper than the per-example mode (one
parameter copy per row), which the step does not need: it uses only the sum
over the batch. The original gamma form is not a sum over rows and runs
full-batch only.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace

import numpy as np
from tqdm.auto import tqdm

from ...building.data import slice_rows, with_switches
from ...building.divergences import refuse_original_gamma
from ...common.errors import RobustStanInputError, require_count, require_positive, require_seed
from ...engines import RawDraws
from ...gradients.oracles import GradientOracle, constrained_draws, make_oracle
from ...gradients.program import GeneratedProgram

FAMILIES = ("meanfield", "fullrank")


@dataclass(frozen=True)
class GaussianQ:
    """A Gaussian on the unconstrained scale: ``mean`` (d,) and lower-triangular
    ``cholesky`` (d, d) with positive diagonal; ``cov`` = cholesky cholesky'."""

    family: str
    mean: np.ndarray
    cholesky: np.ndarray

    @property
    def cov(self) -> np.ndarray:
        return self.cholesky @ self.cholesky.T

    @property
    def sd(self) -> np.ndarray:
        return np.sqrt(np.diag(self.cov))

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """(size, d) draws."""
        return self.mean + rng.standard_normal((size, self.mean.size)) @ self.cholesky.T

    def entropy(self) -> float:
        d = self.mean.size
        return 0.5 * d * (1 + math.log(2 * math.pi)) + float(np.sum(np.log(np.diag(self.cholesky))))

    def log_density(self, thetas: np.ndarray) -> np.ndarray:
        """log q at each row of ``thetas`` (n, d)."""
        from scipy.linalg import solve_triangular

        z = solve_triangular(self.cholesky, (np.atleast_2d(thetas) - self.mean).T, lower=True)
        d = self.mean.size
        return (-0.5 * np.sum(z**2, axis=0) - 0.5 * d * math.log(2 * math.pi)
                - float(np.sum(np.log(np.diag(self.cholesky)))))


class _Parameters:
    """The variational parameters as one vector: mu, then log of L's diagonal,
    then (full-rank only) the strictly lower triangle of L, row by row.
    Mean-field steps work with the sd vector alone (no d x d matrices)."""

    def __init__(self, family: str, d: int):
        self.family, self.d = family, d
        self.meanfield = family == "meanfield"
        self.lower = (np.array([], int), np.array([], int)) if self.meanfield else np.tril_indices(d, -1)
        self.size = 2 * d + self.lower[0].size

    def initial(self, mean: np.ndarray, sd: float) -> np.ndarray:
        return np.concatenate([mean, np.full(self.d, math.log(sd)), np.zeros(self.size - 2 * self.d)])

    def from_q(self, q: GaussianQ) -> np.ndarray:
        """The vector of a given q (a warm start); a full-rank q loses its off-diagonal for mean-field."""
        if q.mean.shape != (self.d,):
            raise RobustStanInputError(f"warm_start: q has dimension {q.mean.size}, the model {self.d}")
        return np.concatenate([q.mean, np.log(np.diag(q.cholesky)), q.cholesky[self.lower]])

    def cholesky(self, vector: np.ndarray) -> np.ndarray:
        d = self.d
        L = np.diag(np.exp(vector[d:2 * d]))
        L[self.lower] = vector[2 * d:]
        return L

    def q(self, vector: np.ndarray) -> GaussianQ:
        return GaussianQ(self.family, vector[:self.d].copy(), self.cholesky(vector))

    def draws(self, vector: np.ndarray, eps: np.ndarray) -> np.ndarray:
        """theta_s = mu + L eps_s for each row of eps."""
        d = self.d
        if self.meanfield:
            return vector[:d] + eps * np.exp(vector[d:2 * d])
        return vector[:d] + eps @ self.cholesky(vector).T

    def elbo_gradient(self, vector: np.ndarray, eps: np.ndarray, g: np.ndarray) -> np.ndarray:
        """ELBO gradient from draws theta_s = mu + L eps_s and the target's gradients g_s there.

        The "sticking the landing" estimator (Roeder, Wu and Duvenaud 2017): the
        path derivative of log pi - log q, with grad_theta log q = -L^-T eps. It is
        unbiased, and exactly zero at the optimum when pi is Gaussian and q can
        match it, so Adam settles instead of jittering there.
        """
        from scipy.linalg import solve_triangular

        d = self.d
        if self.meanfield:
            sd = np.exp(vector[d:2 * d])
            path = g + eps / sd
            return np.concatenate([path.mean(axis=0), (path * eps).mean(axis=0) * sd])
        L = self.cholesky(vector)
        path = g + solve_triangular(L, eps.T, lower=True, trans="T").T  # g_s + L^-T eps_s
        outer = path.T @ eps / len(g)                                  # mean_s path_s eps_s'
        return np.concatenate([path.mean(axis=0), np.diag(outer) * np.diag(L), outer[self.lower]])


class VariationalTarget:
    """log pi and its gradient on the unconstrained scale, full-batch or on minibatches.

    The rows a step uses are drawn here, and evaluated by :meth:`evaluate` on the prepared data
    (a subclass evaluates them where they are held: see
    :mod:`robust_stan.methods.variational.partitioned`)."""

    def __init__(self, program: GeneratedProgram, stan_data: dict, batch_size: int | None, oracle: str,
                 rng: np.random.Generator, n_rows: int | None = None):
        self.program, self.stan_data, self.oracle_kind, self.rng = program, stan_data, oracle, rng
        self.full = program.oracle_for(stan_data, oracle)
        self.dimension = self.full.dimension
        self.n = int(stan_data["N"]) if n_rows is None else int(n_rows)
        self.batch_size = batch_size
        if batch_size is not None:
            refuse_original_gamma(stan_data["divergence"], "batch_size", "a minibatch gives no unbiased estimate "
                                  "of it", "run it full-batch (batch_size=None) or use rs.GammaD(gamma)")
        if batch_size is not None and batch_size > self.n:
            raise RobustStanInputError(f"batch_size: at most the {self.n} rows, got {batch_size}")
        # With minibatches the ELBO is tracked on a fixed random subset of rows (weights
        # N / m: an unbiased estimate that moves only with q); the final one uses all rows.
        self.tracking_rows: np.ndarray | None = None
        self._tracking_oracle: GradientOracle | None = None
        if batch_size is not None:
            m = min(self.n, max(1000, 10 * batch_size))
            if m < self.n:
                self.tracking_rows = np.sort(rng.choice(self.n, size=m, replace=False))

    def gradients(self, thetas: np.ndarray) -> np.ndarray:
        """(S, d) gradients of log pi (a minibatch estimate when batch_size is set) at each row."""
        if self.batch_size is not None and self.batch_size < self.n:
            rows = np.sort(self.rng.choice(self.n, size=self.batch_size, replace=False))
            return self.evaluate(thetas, rows, self.n / self.batch_size, gradient=True)
        return self.evaluate(thetas, None, 1.0, gradient=True)

    def log_density(self, thetas: np.ndarray, tracking: bool = False) -> np.ndarray:
        """log pi at each row of ``thetas``: all rows, or (tracking=True) the tracking subset's estimate."""
        if tracking and self.tracking_rows is not None:
            return self.evaluate(thetas, self.tracking_rows, self.n / self.tracking_rows.size, gradient=False)
        return self.evaluate(thetas, None, 1.0, gradient=False)

    def evaluate(self, thetas: np.ndarray, rows: np.ndarray | None, weight_factor: float, gradient: bool) -> np.ndarray:
        """log pi (S,) or its gradients (S, d) at ``thetas``, with the data term on ``rows`` (None:
        all) weighted by ``weight_factor``."""
        if rows is None:
            oracle = self.full
        elif rows is self.tracking_rows:
            if self._tracking_oracle is None:
                self._tracking_oracle = self._oracle_on(rows, weight_factor)
            oracle = self._tracking_oracle
        else:
            oracle = self._oracle_on(rows, weight_factor)
        if gradient:
            return np.array([oracle.gradient(theta, jacobian=True) for theta in thetas])
        return np.array([oracle.log_density(theta, jacobian=True) for theta in thetas])

    def _oracle_on(self, rows: np.ndarray, weight_factor: float):
        return make_oracle(self.program.stan_code, slice_rows(self.program.spec, self.stan_data, rows, weight_factor),
                           self.dimension, self.oracle_kind)


@dataclass(frozen=True)
class VariationalSettings:
    """How the variational fit is run (CmdStanPy's names where it has them), checked when made (an
    error names the argument); the run fills in ``iterations_run`` and ``converged``.

    Parameters
    ----------
    family : {"meanfield", "fullrank"}
        The Gaussian q's covariance.
    draws, grad_samples, iter, eval_elbo : int
        Draws kept, draws per gradient step, the most steps, steps between ELBO evaluations (each >= 1).
    elbo_samples : int
        Draws per ELBO estimate (>= 2).
    eta, tol_rel_obj : float
        The step size and the relative ELBO change that stops the run (both positive).
    batch_size : int or None
        Rows per step (>= 1); None is every row.
    seed : int or None
        The seed; None: the run draws its own and cannot be repeated.
    show_progress : bool
        Show a progress bar.
    iterations_run : int, default 0
        Steps taken (the run's).
    converged : bool, default False
        Whether the relative ELBO change fell below ``tol_rel_obj`` (the run's).
    chains : int, default 1
        One: q's draws are one chain.
    method : str, default "robust-stan"
        The driver.

    Raises
    ------
    RobustStanInputError
        If a value is out of range.
    """

    family: str
    draws: int
    grad_samples: int
    elbo_samples: int
    eta: float
    iter: int
    tol_rel_obj: float
    eval_elbo: int
    batch_size: int | None
    seed: int | None  # None: the run drew its own and cannot be repeated
    show_progress: bool
    iterations_run: int = 0
    converged: bool = False
    chains: int = 1
    method: str = "robust-stan"

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise RobustStanInputError(f"family: the variational driver knows {list(FAMILIES)}, not {self.family!r}")
        for name, low in (("draws", 1), ("grad_samples", 1), ("elbo_samples", 2), ("iter", 1), ("eval_elbo", 1)):
            object.__setattr__(self, name, require_count(name, getattr(self, name), low))
        for name in ("eta", "tol_rel_obj"):
            object.__setattr__(self, name, require_positive(name, getattr(self, name)))
        if self.batch_size is not None:
            object.__setattr__(self, "batch_size", require_count("batch_size", self.batch_size))
        object.__setattr__(self, "seed", require_seed(self.seed))


@dataclass(frozen=True)
class VariationalOutput:
    """What the driver returns: draws from q (``raw``), its settings, ``q`` itself, the final ELBO
    estimate ``elbo`` with its Monte Carlo error ``elbo_se``, and ``elbo_trace`` (iteration, ELBO)."""

    raw: RawDraws
    settings: VariationalSettings
    q: GaussianQ
    elbo: float
    elbo_se: float
    elbo_trace: dict


def _tail_average(window_sums: list[np.ndarray], window: int) -> np.ndarray:
    """Average of the iterates in the later half of the windows so far (Polyak-Ruppert
    tail averaging: Adam's noise shrinks like 1/sqrt(iterations), the start is forgotten)."""
    later = window_sums[len(window_sums) // 2:]
    return np.sum(later, axis=0) / (window * len(later))


def fit_variational(program: GeneratedProgram, stan_data: dict, family: str = "meanfield", draws: int = 1000,
                    grad_samples: int = 5, elbo_samples: int = 100, eta: float = 0.05, iter: int = 10_000,
                    tol_rel_obj: float = 1e-5, eval_elbo: int = 100, batch_size: int | None = None,
                    seed: int | None = None, start: np.ndarray | None = None, init_radius: float = 2.0,
                    init_sd: float = 1.0, warm_start: GaussianQ | None = None, show_progress: bool = True,
                    oracle: str = "auto", target=None) -> VariationalOutput:
    """Fit a Gaussian q to the generalized posterior of prepared ``stan_data``; see
    :meth:`robust_stan.Model.variational` for the options. ``start`` is q's starting mean on the
    unconstrained scale (by default uniform on (-init_radius, init_radius)). ``target(batch_size,
    oracle, rng)``, when given, makes the :class:`VariationalTarget` (rows held elsewhere);
    ``stan_data`` then serves only to constrain the draws."""
    settings = VariationalSettings(family, draws, grad_samples, elbo_samples, eta, iter, tol_rel_obj, eval_elbo,
                                   batch_size, seed, show_progress)
    draws, grad_samples, elbo_samples = settings.draws, settings.grad_samples, settings.elbo_samples
    eta, iter, tol_rel_obj, eval_elbo = settings.eta, settings.iter, settings.tol_rel_obj, settings.eval_elbo
    batch_size, seed = settings.batch_size, settings.seed
    init_sd = require_positive("init_sd", init_sd)
    if not (isinstance(init_radius, (int, float)) and init_radius >= 0):
        raise RobustStanInputError(f"init_radius: must be a number >= 0, got {init_radius!r}")
    if batch_size is not None:
        program.require_rows("batch_size", "a minibatch (run full-batch: batch_size=None)")
    rng = np.random.default_rng(seed)  # None: fresh entropy from the operating system
    if target is None:
        target = VariationalTarget(program, stan_data, batch_size, oracle, rng)
    else:
        target = target(batch_size, oracle, rng)
    parameters = _Parameters(family, target.dimension)
    if warm_start is not None:
        vector = parameters.from_q(warm_start)
    else:
        if start is None:
            start = rng.uniform(-init_radius, init_radius, target.dimension)
        vector = parameters.initial(np.asarray(start, dtype=float), init_sd)

    # Adam, ascending the ELBO; step size eta / sqrt(1 + t / eval_elbo). q is reported as the
    # average of the later half of the iterates (see _tail_average).
    beta1, beta2, tiny = 0.9, 0.99, 1e-8
    m, v = np.zeros_like(vector), np.zeros_like(vector)
    # The ELBO is judged at fixed standard-normal draws (common random numbers), so
    # its changes between evaluations reflect q, not fresh Monte Carlo noise.
    elbo_eps = rng.standard_normal((elbo_samples, target.dimension))
    trace_iterations, trace_elbo = [], []
    window_sums, window_sum = [], np.zeros_like(vector)
    previous, converged, quiet_evaluations, t = None, False, 0, 0
    with tqdm(total=iter, desc=f"variational ({family})", unit="it", disable=not show_progress,
              file=sys.stderr) as bar:
        for t in range(1, iter + 1):
            eps = rng.standard_normal((grad_samples, target.dimension))
            g = target.gradients(parameters.draws(vector, eps))
            if not np.all(np.isfinite(g)):
                raise RuntimeError(f"variational: the target's gradient is not finite at iteration {t}; try a "
                                   "smaller eta, or start from the ordinary (KL) fit with inits=...")
            grad = parameters.elbo_gradient(vector, eps, g)
            m = beta1 * m + (1 - beta1) * grad
            v = beta2 * v + (1 - beta2) * grad**2
            step = eta / math.sqrt(1 + t / eval_elbo)
            vector = vector + step * (m / (1 - beta1**t)) / (np.sqrt(v / (1 - beta2**t)) + tiny)
            window_sum += vector
            bar.update()
            if t % eval_elbo and t < iter:
                continue
            window_sums.append(window_sum)
            window_sum = np.zeros_like(vector)
            vector_mean = _tail_average(window_sums, eval_elbo)
            q = parameters.q(vector_mean)
            elbo = float(np.mean(target.log_density(parameters.draws(vector_mean, elbo_eps), tracking=True)))
            elbo += q.entropy()
            trace_iterations.append(t)
            trace_elbo.append(elbo)
            bar.set_postfix(elbo=f"{elbo:.5g}")
            if previous is not None:
                small = abs(elbo - previous) / max(abs(elbo), 1e-12) < tol_rel_obj
                quiet_evaluations = quiet_evaluations + 1 if small else 0
            previous = elbo
            if quiet_evaluations >= 2:  # two evaluations in a row: one can be a lucky pause
                converged = True
                break

    thetas = q.sample(rng, draws)
    lp = target.log_density(thetas)
    log_q = q.log_density(thetas)
    elbo_terms = lp - log_q  # unbiased for the ELBO; its variance vanishes as q approaches pi
    variables = constrained_draws(program.oracle_for(with_switches(stan_data, pointwise=False), oracle), thetas[None])
    sampler = {"lp__": lp[None], "log_q": log_q[None]}
    settings = replace(settings, iterations_run=t, converged=converged)
    return VariationalOutput(RawDraws(variables, sampler), settings, q, elbo=float(np.mean(elbo_terms)),
                             elbo_se=float(np.std(elbo_terms, ddof=1) / np.sqrt(draws)),
                             elbo_trace={"iteration": np.array(trace_iterations), "elbo": np.array(trace_elbo)})
