"""rs.dpvi, rs.noise_aware and rs.dpvi_baseline: noise-aware differentially private VI on any model."""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping

import numpy as np
import pandas as pd

from ..building.data import Scaling, zero_row_data
from ..building.divergences import as_divergence
from ..building.partitions import is_partitioned, refuse_cluster_for_rows_here
from ..common.cluster import Cluster
from ..common.errors import RobustStanInputError, RobustStanWarning, require_count, require_positive, require_seed
from ..common.seeds import seed_to_use
from ..methods.dpvi.accounting import check_privacy_arguments, solve_noise_multiplier
from ..methods.dpvi.mechanism import (
    DPVIRelease,
    DPVISettings,
    PerExampleObjective,
    heuristic_step_size,
    require_q_scale,
    run_dp_sgd,
)
from ..methods.dpvi.noise_aware import (
    burn_in_steps,
    q_draws,
    sample_trace_model,
    trace_model_data,
    trace_predictive_check,
)
from ..methods.dpvi.partitioned import partitioned_dpvi_setup
from ..methods.dpvi.randomness import warn_seeded_release
from ..results.dpvi import DPVIFit, PrivatePosterior
from .model import Model, require_builtin_model


def dpvi(model: Model, data: Mapping, epsilon: float, delta: float = 1e-5, clip: float = 1.0, steps: int = 10_000,
         sampling_rate: float = 0.1, lambda_c=1.0, precondition=None,
         draws_per_step: int = 10, initial_variance: float = 1.0, divergence=None, seed: int | None = None,
         show_progress: bool = True, cluster: Cluster | None = None, inits: Mapping | None = None,
         q_scale: str = "variance") -> DPVIFit:
    """(epsilon, delta)-differentially private mean-field VI by DP-SGD.

    The mechanism of Alrawajfeh, Jälkö and Honkela (2025, arXiv:2410.19371), noise-aware DPVI;
    ``robust_stan/methods/dpvi/mechanism.py`` has the objective.

    q is a Gaussian on the unconstrained scale with independent coordinates, phi = (mu, u).
    Each step: a Poisson subsample at rate ``sampling_rate`` (kappa); each row's gradient of its
    share of the negative ELBO (the prior, Jacobian and entropy terms divided by N and folded
    in), from ``draws_per_step`` draws of q and one per-example call; u's gradients times
    ``precondition`` (beta_u); each row clipped to norm ``clip`` (C); N(0, sigma^2 C^2) noise on
    the sum; the step lambda_heur = sqrt(2) lambda_c / (sigma C sqrt(T d)) times beta. sigma is
    solved for (``epsilon``, ``delta``, ``steps``, kappa) by dp-accounting's PLD accountant
    (``robust_stan/methods/dpvi/accounting.py``).

    **What is private, and under which assumptions.** The release (``fit.release``) is all that
    leaves: phi_0..phi_T, the noisy gradients and the public settings, never the seed or the
    generator's state. Neighbouring data sets differ by adding or removing one row *with the
    number of rows N public*: every row's clipped term holds the prior, Jacobian and entropy
    terms divided by N (``release.accounting.adjacency``). Without ``seed`` the subsamples and
    the noise come from ChaCha20 keyed with 256 bits of the operating system's entropy, which
    nobody can replay. With ``seed`` the run is reproducible and **only as private as the seed
    is secret** (a :class:`~robust_stan.RobustStanWarning` says so): anyone who knows or guesses
    it can redraw the noise and subtract it. Against attacks on floating-point noise (Mironov
    2012) a private run sums 4 normals per noise value, a mitigation, not a proof
    (``robust_stan/methods/dpvi/randomness.py``). The data must not shape anything released:
    the model must be built with ``standardize=False``, a glm's ``prior_scale_b`` and a
    categorical model's ``K`` given in ``data``, and phi_0 chosen without the data.

    Parameters
    ----------
    model : Model
        A built-in model (``rs.glm``, ``rs.location``, ``rs.custom``) with ``standardize=False``.
    data : mapping
        The rows, as for the model; or rows held in partitions (Dask arrays split into row
        chunks, Dask DataFrames or Series, or lists of ``.npy`` / ``.parquet`` paths): each
        partition then draws its rows of a step's subsample and sums their clipped gradients
        where it lives, only the sums travel and the noise is added here
        (``robust_stan/methods/dpvi/partitioned.py``); this process and the workers are the
        trusted curator.
    epsilon, delta : float
        The guarantee.
    clip : float
        C, the bound on each row's (preconditioned) gradient norm.
    steps : int
        T, the number of DP-SGD steps.
    sampling_rate : float
        kappa, each row's probability of joining a step.
    lambda_c : float or array
        The step's constant: one number, or one per entry of phi (mu's, then u's).
    precondition : float or array, optional
        beta_u, u's gradient multiplier (mu's is 1): one number or one per entry of u.
    draws_per_step : int
        Draws of q per step.
    initial_variance : float
        q's variances at phi_0.
    divergence : optional
        The loss (KL by default; a robust one gives private generalized-Bayes VI).
    seed : int, optional
        None (the default) for a private run. An integer only for tests and examples: the
        release is then only as private as the seed is secret.
    show_progress : bool
        A progress bar over the steps.
    cluster : rs.Cluster, optional
        Where partitioned rows are processed.
    inits : mapping, optional
        Every parameter's value for phi_0's mean (e.g. the prior's means), not from the data.
    q_scale : {"variance", "sd"}
        What softplus(u) is: q's variance (the paper's section 4.1) or its sd (the authors' code,
        whose published settings were chosen for that form).

    Returns
    -------
    DPVIFit
        Its ``release`` is everything the mechanism released; posteriors come from it alone
        (:func:`robust_stan.noise_aware`, :func:`robust_stan.dpvi_baseline`).
    """
    require_builtin_model(model, "rs.dpvi", reason=(
        "Their data enter the release only through the clipped per-row terms, which robust-stan checks (no "
        "standardising, no prior scales from the data); your own program's transformed data, priors and sizes may "
        "read the private rows, and robust-stan cannot check that, so it releases nothing from one."))
    epsilon, delta, sampling_rate, steps = check_privacy_arguments(epsilon, delta, sampling_rate, steps)
    clip = require_positive("clip", clip)
    draws_per_step = require_count("draws_per_step", draws_per_step)
    initial_variance = require_positive("initial_variance", initial_variance)
    q_scale = require_q_scale(q_scale)
    seed = require_seed(seed)
    warn_seeded_release(seed, stacklevel=2)
    _refuse_data_dependent_settings(model, data)
    divergence = as_divergence(divergence)
    placed = make_batches = None
    if is_partitioned(data):
        stan_data, placed, n_rows, make_batches = partitioned_dpvi_setup(model, data, divergence, cluster)
    else:
        refuse_cluster_for_rows_here(cluster, "rs.dpvi")
        stan_data = model.prepare(data, divergence).stan_data
        n_rows = int(stan_data["N"])
    try:
        start_mean = None if inits is None else model.unconstrain_init(inits, stan_data, Scaling())
        objective = PerExampleObjective.of_program(model, stan_data, n_rows, q_scale)
        n = objective.dimension
        lambda_c = _positive_per_coordinate("lambda_c", lambda_c, 2 * n, "one per entry of phi: mu's, then u's")
        beta_u = _positive_per_coordinate("precondition", 1.0 if precondition is None else precondition, n,
                                          "one per entry of u")
        accounting = solve_noise_multiplier(epsilon, delta, sampling_rate, steps)
        step_size = heuristic_step_size(lambda_c, accounting.noise_multiplier, clip, steps, 2 * n)
        beta = np.concatenate([np.ones(n), np.broadcast_to(beta_u, (n,))])
        settings = DPVISettings(clip, steps, sampling_rate, accounting.noise_multiplier, step_size, beta,
                                draws_per_step, seed, bool(show_progress), initial_variance, start_mean, q_scale)
        start = time.perf_counter()
        iterates, noisy = run_dp_sgd(objective, settings, make_batches(n, settings) if make_batches else None)
    finally:
        if placed is not None:
            placed.close()
    release = DPVIRelease(iterates, noisy, accounting, clip, step_size, lambda_c, beta, draws_per_step,
                          model, zero_row_data(model.spec, stan_data), q_scale)
    return DPVIFit(release, time.perf_counter() - start)


def _positive_per_coordinate(name: str, value, length: int, what: str):
    """A positive number, or ``length`` of them (``what``) as an array; else an error naming ``name``."""
    if np.ndim(value) == 0:
        return require_positive(name, value)
    try:
        values = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        values = None
    if values is None or values.shape != (length,) or not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise RobustStanInputError(f"{name}: must be a positive number or {length} positive numbers ({what}); got "
                                   f"{value!r:.80}")
    return values


def _refuse_data_dependent_settings(model: Model, data: Mapping) -> None:
    spec = model.spec
    if spec.standardize:
        raise RobustStanInputError("model: DP-VI needs a model built with standardize=False (standardising "
                                   "scales y by the data's own centre and spread, which would not be private)")
    if "prior_scale_b" in spec.data_names() and "prior_scale_b" not in data:
        raise RobustStanInputError("data: give 'prior_scale_b' (the default, 2.5 / sd of each column of X, "
                                   "comes from the data and would not be private)")
    if spec.family.class_labels and "K" not in data:
        raise RobustStanInputError("data: give 'K' (the number of categories; read from y it would not be private)")


def _release_of(release) -> DPVIRelease:
    if isinstance(release, DPVIFit):
        return release.release
    if not isinstance(release, DPVIRelease):
        raise RobustStanInputError(f"release: expected a DPVIFit or its .release, got {type(release).__name__}")
    return release


def noise_aware(release, burn_in=0.5, method: str = "nuts", iter_sampling: int = 2000, iter_warmup: int = 1000,
                chains: int = 2, seed: int | None = None, show_progress: bool = False,
                phi_star_prior: str = "unit") -> PrivatePosterior:
    """The noise-aware posterior from a DP-VI release alone (paper section 3.3, eq. 20-23; the
    model and priors are in ``robust_stan/methods/dpvi/noise_aware.py``). Each draw of phi* gives one
    draw of theta from q(theta; phi*). There is no data argument: nothing here can see the data.

    Parameters
    ----------
    release : DPVIFit or DPVIRelease
        What :func:`robust_stan.dpvi` released.
    burn_in : int or float
        T*, an iteration count or a fraction of T (default half).
    method : {"nuts", "laplace"}
        The engine's NUTS on the Stan program ``noise_aware_dpvi.stan`` (``chains`` chains of
        ``iter_warmup`` + ``iter_sampling`` iterations: the paper's 1000 warmup iterations and
        4000 draws in all by default), or a Gaussian at the mode (``chains`` x ``iter_sampling``
        draws).
    iter_sampling : int, default 2000
        Draws per chain.
    iter_warmup : int, default 1000
        NUTS warmup iterations per chain.
    chains : int, default 2
        Number of chains.
    seed : int or None, default None
        Seed of the sampler and of the draws from q (post-processing: not part of the privacy);
        None draws fresh entropy (not reproducible).
    show_progress : bool
        Progress bars.
    phi_star_prior : {"unit", "trace_sd"}
        phi*'s prior N(phi_bar, s^2) around the post-burn-in iterates' mean: s = 1, as the
        paper's eq. A61 prints it, or s = the iterates' own sd per coordinate, as the authors'
        code has it.

    Returns
    -------
    PrivatePosterior
        Draws of the model's parameters, and of phi* and A in ``trace_draws``.
    """
    release = _release_of(release)
    t_star = burn_in_steps(burn_in, release.steps)
    iter_sampling = require_count("iter_sampling", iter_sampling)
    iter_warmup = require_count("iter_warmup", iter_warmup, 0)
    chains = require_count("chains", chains)
    seed = seed_to_use(seed)  # drawn once for the sampler and q's draws; the posterior records no seed
    rng = np.random.default_rng(seed)
    traced = sample_trace_model(trace_model_data(release, t_star, phi_star_prior), method, iter_sampling,
                                iter_warmup, chains, seed, release.model.engine, show_progress)
    thetas = q_draws(traced["phi_star"], rng, release.q_scale)
    return PrivatePosterior(release, "noise_aware", thetas, {"phi_star": traced["phi_star"], "a": traced["a"]}, method,
                            burn_in=t_star)


def check_trace_model(posterior: PrivatePosterior, blocks: int = 20, level: float = 0.01) -> pd.DataFrame:
    """Check the noise-aware posterior's trace model against its own release, coordinate by
    coordinate of phi: a posterior predictive check for drift in the released gradients that the
    linear model kappa A (phi_t - phi*) cannot explain (the statistic and its exact predictive
    p-value are in ``robust_stan.methods.dpvi.noise_aware.trace_predictive_check``).

    A small p-value says the trace model's assumptions fail for that coordinate, and its
    noise-aware marginal may be miscalibrated. It needs only the release.

    Parameters
    ----------
    posterior : PrivatePosterior
        A result of :func:`robust_stan.noise_aware`.
    blocks : int
        Consecutive blocks the post-burn-in trace is cut into (the test looks at drift on the
        scale of a block).
    level : float
        The family-wise level: a :class:`~robust_stan.RobustStanWarning` names every coordinate
        whose p-value is below ``level`` divided by the number of coordinates (Bonferroni).

    Returns
    -------
    pandas.DataFrame
        One row per entry of phi (``mu[j]`` and ``u[j]`` for the j-th unconstrained parameter):
        ``p_value``, ``excess`` (the statistic over its expectation; about 1 where the model holds)
        and ``flagged``.
    """
    if not isinstance(posterior, PrivatePosterior) or posterior.kind != "noise_aware":
        raise RobustStanInputError(f"posterior: expected the result of rs.noise_aware, got {posterior!r:.80}")
    blocks = require_count("blocks", blocks, 2)
    if not 0 < level < 1:
        raise RobustStanInputError(f"level: must lie in (0, 1), got {level!r}")
    release = posterior.release
    assert posterior.burn_in is not None and posterior.trace_draws is not None  # a noise-aware posterior's
    check = trace_predictive_check(release, posterior.burn_in, posterior.trace_draws["phi_star"],
                                   posterior.trace_draws["a"], blocks)
    n = release.dimension
    names = [f"mu[{j}]" for j in range(n)] + [f"u[{j}]" for j in range(n)]
    table = pd.DataFrame({"p_value": check["p_value"], "excess": check["excess"]}, index=pd.Index(names, name="phi"))
    table["flagged"] = table["p_value"] < level / len(names)
    if table["flagged"].any():
        flagged = ", ".join(f"{name} (p = {p:.2g}, excess {e:.2f})"
                            for name, p, e in table.loc[table["flagged"], ["p_value", "excess"]].itertuples())
        warnings.warn(f"the trace model does not explain the released gradients of {flagged}: they drift in a way "
                      f"kappa A (phi_t - phi*) cannot follow, so the noise-aware posterior of those coordinates "
                      f"may be miscalibrated (mu[j] and u[j] are q's mean and scale of unconstrained parameter j)",
                      RobustStanWarning, stacklevel=2)
    return table


def dpvi_baseline(release, kind: str = "last_iterate", burn_in=0.5, draws: int = 4000,
                  seed: int | None = None) -> PrivatePosterior:
    """A baseline posterior from the same DP-VI release, with no further privacy cost.

    Parameters
    ----------
    release : DPVIFit or DPVIRelease
        What :func:`dpvi` released.
    kind : {"last_iterate", "averaged"}, default "last_iterate"
        q(theta; phi_T) at the last iterate (naive), or q at the mean of the post-burn-in
        iterates (DPVIm).
    burn_in : float or int, default 0.5
        For "averaged": T*, the first iterate averaged, as an iteration count or a fraction of T.
    draws : int, default 4000
        Draws from q (even: two chains of independent draws).
    seed : int or None, default None
        Seed of the draws; None draws fresh entropy (not reproducible).

    Returns
    -------
    PrivatePosterior
        The baseline's draws.
    """
    release = _release_of(release)
    if kind not in ("last_iterate", "averaged"):
        raise RobustStanInputError(f"kind: must be 'last_iterate' or 'averaged', got {kind!r}")
    draws = require_count("draws", draws)
    rng = np.random.default_rng(require_seed(seed))
    if kind == "last_iterate":
        phi = release.iterates[-1]
    else:
        phi = release.iterates[burn_in_steps(burn_in, release.steps):release.steps].mean(axis=0)
    if draws % 2:
        raise RobustStanInputError(f"draws: must be even (two chains of independent draws), got {draws}")
    thetas = q_draws(np.tile(phi, (2, draws // 2, 1)), rng, release.q_scale)
    return PrivatePosterior(release, kind, thetas)
