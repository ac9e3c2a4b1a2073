"""The noise-aware posterior of a DP-VI release (Alrawajfeh, Jälkö and Honkela 2025, arXiv:2410.19371).

From the post-burn-in trace (phi_t, g~_{t+1}), t = T*..T-1, the paper's
post-processing model (eq. 20 and A60, subsampling covariance 0, A = diag(softplus(v)))

    g~_{t+1} | phi_t  ~  N(kappa A (phi_t - phi*), diag(sigma^2 C^2 / beta^2))

with the data-free priors of appendix H.3, computed from the trace:

    phi*  ~ N(phi_bar, I)                                         (A61; or N(phi_bar, diag(trace sd^2)))
    v_i   ~ N(a_hat_i, sd_i),  a_hat_i = |sum_t g~_{t+1,i} (phi_t,i - phi_bar_i)| / (kappa sum_t (phi_t,i - phi_bar_i)^2)
                               sd_i    = sigma C / (kappa beta_i sqrt(sum_t (phi_t,i - phi_bar_i)^2))

phi*'s prior is N(phi_bar, I) as eq. A61 prints it (``phi_star_prior="unit"``), or, as in
the authors' code (DPBayes/noise-aware-dpvi), N(phi_bar, diag(s^2)) with s the post-burn-in
iterates' own sd (``"trace_sd"``; population sd, as ``jnp.std``), which keeps phi* within
the iterates' own spread.

The paper writes the noise variance as sigma^2 C^2 / beta; the mechanism
(A59) divides the noise by beta, so its variance is over beta^2, which we use.
The paper's prior sd of v_i is written as a variance; we use its square root,
the sampling sd of a_hat_i (its appendix E). The mean of v_i is a_hat_i itself
(as the paper writes; softplus(v) ~ v for the large curvatures of a sum over N
rows). The model is the Stan program ``stan/noise_aware_dpvi.stan``, sampled by
the engine's NUTS (the paper: 1000 warm-up, 4000 draws) or approximated by
Laplace at its mode (L-BFGS; the paper uses Adam to find the same mode). The
noise-aware posterior of theta is the mixture over draws of phi* of q(theta; phi*)
(eq. 23, A7). Nothing here sees the data.

NUTS samples the model in a non-centred form: v standardised by its prior, and
phi* written through its exact conditional posterior given a (normal, since the
likelihood is quadratic in phi*), so that the sampler sees v's marginal posterior
and an independent standard normal. The posterior is the same; the centred form
(phi*, v) has a ridge where a is weakly identified (small a lets phi* spread to its
prior), on which NUTS's chains stuck (R-hat above 2 on Table 2's regression).
Laplace keeps the centred form, standardised by an affine map, so it is the
paper's approximation in (phi*, v).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...common.errors import RobustStanInputError
from ...common.resources import stan_include_path
from ...engines import NutsSettings, compile_program
from ..laplace import LaplaceApproximation, laplace_approximation
from .mechanism import DPVIRelease, reparameterised, softplus

METHODS = ("nuts", "laplace")
PHI_STAR_PRIORS = ("unit", "trace_sd")  # phi*'s prior sd: eq. A61's 1, or the post-burn-in iterates' sd


def trace_model_program() -> str:
    """The post-processing model's Stan program (``stan/noise_aware_dpvi.stan``)."""
    return (Path(stan_include_path()) / "noise_aware_dpvi.stan").read_text()


def burn_in_steps(burn_in, steps: int) -> int:
    """T*: an iteration count, or a fraction of T in [0, 1)."""
    if isinstance(burn_in, bool) or not isinstance(burn_in, (int, float, np.integer, np.floating)):
        raise RobustStanInputError(f"burn_in: an iteration count or a fraction in [0, 1), got {burn_in!r}")
    if isinstance(burn_in, (float, np.floating)):
        if not 0 <= burn_in < 1:
            raise RobustStanInputError(f"burn_in: a fraction must lie in [0, 1), got {burn_in!r}")
        burn_in = int(burn_in * steps)
    if not 0 <= burn_in <= steps - 2:
        raise RobustStanInputError(f"burn_in: must leave at least 2 of the {steps} steps, got {burn_in}")
    return int(burn_in)


def require_phi_star_prior(phi_star_prior) -> str:
    """``phi_star_prior`` if it is one of :data:`PHI_STAR_PRIORS`; else an error naming it."""
    if phi_star_prior not in PHI_STAR_PRIORS:
        raise RobustStanInputError(f"phi_star_prior: must be one of {list(PHI_STAR_PRIORS)}, got {phi_star_prior!r}")
    return phi_star_prior


def trace_model_data(release: DPVIRelease, burn_in: int, phi_star_prior: str = "unit") -> dict:
    """Stan data of the post-processing model: the trace's sufficient statistics and the H.3 priors
    (phi*'s prior sd by ``phi_star_prior``, :data:`PHI_STAR_PRIORS`)."""
    return trace_statistics(release.iterates[burn_in:release.steps],  # phi_t, t = T*..T-1
                            release.noisy_gradients[burn_in:],        # g~_{t+1}
                            release.accounting.sampling_rate, release.noise_sd, phi_star_prior)


def trace_statistics(phis: np.ndarray, grads: np.ndarray, kappa: float, noise_sd,
                     phi_star_prior: str = "unit") -> dict:
    """The trace model's Stan data from pairs (phi_t, g~_{t+1}) (rows of ``phis`` and ``grads``):
    sufficient statistics centred at the trace mean, the H.3 prior of v (the least-squares
    slope |a_hat| of the gradients on the iterates and its sampling sd), and phi*'s prior sd
    (1, or the iterates' sd, by ``phi_star_prior``)."""
    phi_bar = phis.mean(axis=0)
    delta = phis - phi_bar
    sum_dd = np.sum(delta**2, axis=0)
    sum_gd = np.sum(grads * delta, axis=0)
    safe_dd = np.maximum(sum_dd, 1e-300)
    if require_phi_star_prior(phi_star_prior) == "unit":
        prior_sd = np.ones(phis.shape[1])
    else:
        prior_sd = np.sqrt(sum_dd / phis.shape[0])
        if not np.all(prior_sd > 0):
            raise RobustStanInputError("phi_star_prior: 'trace_sd' needs iterates that move; coordinate(s) "
                                       f"{np.flatnonzero(prior_sd <= 0).tolist()} stay constant after burn-in")
    return {"d": phis.shape[1], "n_obs": phis.shape[0], "kappa": kappa, "noise_sd": noise_sd,
            "phi_bar": phi_bar, "sum_g": grads.sum(axis=0), "sum_gg": np.sum(grads**2, axis=0), "sum_gd": sum_gd,
            "sum_dd": sum_dd, "v_prior_mean": np.abs(sum_gd) / (kappa * safe_dd),
            "v_prior_sd": noise_sd / (kappa * np.sqrt(safe_dd)), "phi_star_prior_sd": prior_sd}


def sample_trace_model(stan_data: dict, method: str, iter_sampling: int, iter_warmup: int, chains: int, seed: int,
                       engine: str = "auto", show_progress: bool = False) -> dict:
    """Draws of phi* and a = softplus(v): {"phi_star": (chains, iter_sampling, d), "a": (chains,
    iter_sampling, d)} by the engine's NUTS, or from the Laplace approximation of (phi*, v)."""
    if method not in METHODS:
        raise RobustStanInputError(f"method: must be one of {list(METHODS)}, got {method!r}")
    program = compile_program(trace_model_program(), engine, show_progress=show_progress)
    d = int(stan_data["d"])
    if method == "nuts":
        settings = NutsSettings(chains=chains, iter_warmup=iter_warmup, iter_sampling=iter_sampling, seed=seed,
                                show_progress=show_progress)
        raw = program.sample({**stan_data, "non_centred": 1}, settings, None)
        return {"phi_star": raw.variables["phi_star"], "a": raw.variables["a"]}
    approx = trace_model_laplace(program, stan_data)
    rng = np.random.default_rng(seed)
    joint = approx.draws(chains * iter_sampling, rng).reshape(chains, iter_sampling, 2 * d)
    v = stan_data["v_prior_mean"] + stan_data["v_prior_sd"] * joint[..., d:]
    return {"phi_star": stan_data["phi_bar"] + joint[..., :d], "a": softplus(v)}


def trace_model_laplace(program, stan_data: dict) -> LaplaceApproximation:
    """The paper's Laplace approximation of the trace model in (phi*, v), in the standardised
    coordinates (phi* - phi_bar, (v - v_prior_mean) / v_prior_sd) (an affine map) of the compiled
    trace-model ``program``."""
    centred = {**stan_data, "non_centred": 0}
    return laplace_approximation(lambda x: program.log_density_gradient(centred, x), np.zeros(2 * int(stan_data["d"])))


def q_draws(phis: np.ndarray, rng: np.random.Generator, q_scale: str = "variance") -> np.ndarray:
    """One draw of q(zeta; phi) = N(mu, diag(sd(u)^2)) for each row of ``phis`` (..., 2 n)."""
    return reparameterised(phis, rng.standard_normal(phis.shape[:-1] + (phis.shape[-1] // 2,)), q_scale)


def trace_predictive_check(release: DPVIRelease, burn_in: int, phi_star: np.ndarray, a: np.ndarray,
                           blocks: int = 20) -> dict[str, np.ndarray]:
    """A posterior predictive check of the trace model, coordinate by coordinate: does the
    released gradient trace drift in a way the linear model g~_{t+1} = kappa A (phi_t - phi*) +
    noise cannot explain?

    Under the model, given (phi*, a), the residuals r_t = g~_{t+1} - kappa a (phi_t - phi*) are
    independent N(0, noise_sd^2). The post-burn-in trace is cut into ``blocks`` consecutive blocks
    of (about) equal length L_b; the statistic T = sum_b (sum of r_t over block b)^2 / (L_b
    noise_sd^2) is then chi-square with ``blocks`` degrees of freedom, and a slow drift (a
    curvature or an optimum that moves, a coupling to another coordinate's wander) inflates it.
    The posterior predictive p-value is the posterior mean of that chi-square's upper tail at
    T(phi*, a), exact for each draw (no replicated traces are needed).

    Parameters
    ----------
    release : DPVIRelease
        The release the posterior came from.
    burn_in : int
        T*, the burn-in the posterior used.
    phi_star, a : ndarray
        Posterior draws of phi* and a = softplus(v), shape (..., d).
    blocks : int
        The number of blocks.

    Returns
    -------
    dict
        ``p_value`` (d,) and the posterior mean of ``T / blocks`` (``excess`` (d,): about 1 where
        the model holds).
    """
    from scipy import stats

    phis = release.iterates[burn_in:release.steps]
    grads = release.noisy_gradients[burn_in:]
    if phis.shape[0] < 2 * blocks:
        raise RobustStanInputError(f"blocks: the post-burn-in trace has {phis.shape[0]} steps, too few for "
                                   f"{blocks} blocks of at least 2")
    edges = np.linspace(0, phis.shape[0], blocks + 1).astype(int)
    lengths = np.diff(edges)[:, None]                                  # (B, 1)
    block_g = np.add.reduceat(grads, edges[:-1], axis=0)               # (B, d)
    block_phi = np.add.reduceat(phis, edges[:-1], axis=0)
    d = phis.shape[1]
    c = release.accounting.sampling_rate * a.reshape(-1, d)            # (S, d)
    m = phi_star.reshape(-1, d)
    residual_sums = block_g[None] - c[:, None, :] * (block_phi[None] - lengths[None] * m[:, None, :])
    statistic = np.sum(residual_sums**2 / (lengths[None] * np.asarray(release.noise_sd) ** 2), axis=1)  # (S, d)
    return {"p_value": stats.chi2.sf(statistic, blocks).mean(axis=0), "excess": statistic.mean(axis=0) / blocks}
