"""The noise-aware posterior of a DP-VI release (``../shared/papers/noise-aware-dpvi.txt``).

From the post-burn-in trace (phi_t, g~_{t+1}), t = T*..T-1, the paper's
post-processing model (eq. 20 and A60, subsampling covariance 0, A = diag(softplus(v)))

    g~_{t+1} | phi_t  ~  N(kappa A (phi_t - phi*), diag(sigma^2 C^2 / beta^2))

with the data-free priors of appendix H.3, computed from the trace:

    phi*  ~ N(phi_bar, I)                                         (A61)
    v_i   ~ N(a_hat_i, sd_i),  a_hat_i = |sum_t g~_{t+1,i} (phi_t,i - phi_bar_i)| / (kappa sum_t (phi_t,i - phi_bar_i)^2)
                               sd_i    = sigma C / (kappa beta_i sqrt(sum_t (phi_t,i - phi_bar_i)^2))

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

from ..common.errors import RobustStanInputError
from ..common.resources import stan_include_path
from ..engines import NutsSettings, compile_program
from .dpvi import DPVIRelease, reparameterised, softplus
from .laplace import LaplaceApproximation, laplace_approximation

METHODS = ("nuts", "laplace")


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


def trace_model_data(release: DPVIRelease, burn_in: int) -> dict:
    """Stan data of the post-processing model: the trace's sufficient statistics and the H.3 priors."""
    return trace_statistics(release.iterates[burn_in:release.steps],  # phi_t, t = T*..T-1
                            release.noisy_gradients[burn_in:],        # g~_{t+1}
                            release.accounting.sampling_rate, release.noise_sd)


def trace_statistics(phis: np.ndarray, grads: np.ndarray, kappa: float, noise_sd) -> dict:
    """The trace model's Stan data from pairs (phi_t, g~_{t+1}) (rows of ``phis`` and ``grads``):
    sufficient statistics centred at the trace mean, and the H.3 prior of v (the least-squares
    slope |a_hat| of the gradients on the iterates and its sampling sd)."""
    phi_bar = phis.mean(axis=0)
    delta = phis - phi_bar
    sum_dd = np.sum(delta**2, axis=0)
    sum_gd = np.sum(grads * delta, axis=0)
    safe_dd = np.maximum(sum_dd, 1e-300)
    return {"d": phis.shape[1], "n_obs": phis.shape[0], "kappa": kappa, "noise_sd": noise_sd,
            "phi_bar": phi_bar, "sum_g": grads.sum(axis=0), "sum_gg": np.sum(grads**2, axis=0), "sum_gd": sum_gd,
            "sum_dd": sum_dd, "v_prior_mean": np.abs(sum_gd) / (kappa * safe_dd),
            "v_prior_sd": noise_sd / (kappa * np.sqrt(safe_dd))}


def sample_trace_model(stan_data: dict, method: str, draws: int, warmup: int, chains: int, seed: int,
                       engine: str = "auto", show_progress: bool = False) -> dict:
    """Draws of phi* and a = softplus(v): {"phi_star": (chains, draws, d), "a": (chains, draws, d)}
    by the engine's NUTS, or (one chain) from the Laplace approximation of (phi*, v)."""
    if method not in METHODS:
        raise RobustStanInputError(f"method: must be one of {list(METHODS)}, got {method!r}")
    program = compile_program(trace_model_program(), engine, show_progress=show_progress)
    d = int(stan_data["d"])
    if method == "nuts":
        settings = NutsSettings(chains=chains, iter_warmup=warmup, iter_sampling=draws, seed=seed,
                                show_progress=show_progress)
        raw = program.sample({**stan_data, "non_centred": 1}, settings, None)
        return {"phi_star": raw.variables["phi_star"], "a": raw.variables["a"]}
    approx = trace_model_laplace(program, stan_data)
    rng = np.random.default_rng(seed)
    joint = approx.draws(chains * draws, rng).reshape(chains, draws, 2 * d)
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
