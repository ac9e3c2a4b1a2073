"""rs.rob_ula: the public entry of the Rob-ULA sampler (robust_stan.methods.rob_ula.sampler)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from ..building.data import PreparedData
from ..building.divergences import Divergence, as_divergence
from ..building.partitions import is_partitioned, refuse_cluster_for_rows_here
from ..common.cluster import Cluster
from ..methods.rob_ula.partitioned import partitioned_target
from ..methods.rob_ula.sampler import run_rob_ula
from ..results.fits.rob_ula import PartitionedRobULAFit, RobULAFit
from .any_model import AnyModel, require_model
from .model import Model


def rob_ula(model: AnyModel, data: Mapping, contamination: float, step_size: float | None = None,
            iter_sampling: int = 5000, iter_warmup: int = 500, thin: int = 1, chains: int = 4, estimator="auto",
            divergence: Divergence | None = None, learning_rate: float = 1.0, inits: str = "mode",
            init_scale: float = 1.0, metric: str = "dense", seed: int | None = None, show_progress: bool = True,
            oracle: str = "auto", log_density: bool = True,
            gradient_total: str = "n", cluster: Cluster | None = None,
            combine: str = "median") -> RobULAFit:
    """Sample a model's robust posterior with Rob-ULA.

    Rob-ULA (Bhatia, Ma, Dragan, Bartlett and Jordan 2019, arXiv:1907.11826) is the unadjusted
    Langevin algorithm whose drift replaces the sum of the per-example gradients by a robust mean
    of them times n, aiming at the posterior given the clean rows. A run whose R-hat or ESS is
    poor warns, as NUTS does.

    Parameters
    ----------
    model : Model or StanProgramModel
        A built-in model (its per-example mode gives the gradients in one call) or a program from
        :func:`robust_stan.robustify` with one likelihood outcome (gradients by mixed second
        derivatives).
    data : mapping
        The model's data. Values that are Dask arrays split into row chunks, Dask DataFrames or
        Series, or lists of ``.npy`` or ``.parquet`` paths (one per partition) are rows held in
        partitions (built-in models with ``standardize=False`` only): each partition's robust mean
        is computed where it lives and only that travels.
    contamination : float
        The assumed fraction of corrupted observations (the paper's epsilon), in [0, 0.5);
        :func:`robust_stan.tune_rob_ula` chooses it on held-out rows, as the paper does.
    step_size : float or None, default None
        Step in ``z``'s units (the paper's units when ``metric="unit"``). None: 0.2 over the largest
        absolute eigenvalue of the drift's slope in ``z`` (0.2 for the dense metric).
    iter_sampling : int, default 5000
        Kept iterations per chain, before thinning.
    iter_warmup : int, default 500
        Discarded iterations per chain before the kept ones.
    thin : int, default 1
        Keep every ``thin``-th iteration.
    chains : int, default 4
        Number of chains.
    estimator : str or callable, default "auto"
        Robust mean of the per-example gradients: "auto"
        (``robust_stan.methods.rob_ula.sampler.default_estimator``: the row-trimmed mean for
        continuous outcomes, the coordinate-wise trimmed mean for discrete ones), a name in
        ``robust_stan.methods.rob_ula.estimators.ESTIMATORS`` ("row_trimmed_mean", "lrv" = the
        paper's Algorithm 2 read literally, "lrv_once", "trimmed_mean", "mean" = plain ULA,
        "coordinate_median", "median_of_means", "geometric_median"), or a callable
        ``(G, contamination) -> mean`` on the n x d gradient matrix ``G`` (called positionally).
    divergence : Divergence or None, default None
        The divergence of the posterior the gradients come from; None is KL (the ordinary
        likelihood).
    learning_rate : float, default 1.0
        Weight ``w`` on the data term of the log density.
    inits : {"mode", "random"}, default "mode"
        "mode": L-BFGS from a N(0, init_scale^2) point, then concentration steps to the trimmed
        mode; each chain starts there plus ``init_scale`` times a draw of the preconditioner's
        normal. "random": each chain at N(0, init_scale^2 I) on the unconstrained scale.
    init_scale : float, default 1.0
        Scale of the starting points' spread (see ``inits``).
    metric : {"dense", "diag", "unit"}, default "dense"
        The drift's slope at the start is made the identity ("dense"), given a unit diagonal
        ("diag"), or left alone ("unit", the paper's update).
    seed : int or None, default None
        Seed of the run; None draws fresh entropy (not reproducible).
    show_progress : bool, default True
        Show a progress bar.
    oracle : str, default "auto"
        Engine of the log density and gradients ("auto", "bridgestan" or "httpstan").
    log_density : bool, default True
        Compute each kept draw's log density (``lp`` in sample_stats); False skips that call.
    gradient_total : {"n", "clean"}, default "n"
        The robust mean is multiplied by n (the paper's choice) or by (1 - contamination) n, the expected
        number of clean rows.
    cluster : Cluster or None, default None
        Workers that compute the partitions' gradients when rows are held in partitions; None
        computes them here.
    combine : {"median", "mean"}, default "median"
        How the partitions' robust means (and their modes, for ``inits="mode"``) are joined
        (``robust_stan/methods/rob_ula/partitioned.py`` states each one's guarantee).

    Returns
    -------
    RobULAFit
        The draws with the same methods as :meth:`Model.sample`'s fit, for a built-in model or a
        program alike; ``inverse_metric`` is the final ``M = L L^T`` and ``unconstrained_draws`` the
        draws of theta. With rows in partitions, a
        :class:`~robust_stan.results.fits.rob_ula.PartitionedRobULAFit` without per-observation
        quantities.

    Raises
    ------
    RobustStanInputError
        If an argument is out of range or the model cannot give per-example gradients.

    Notes
    -----
    Rob-ULA reaches the clean rows' posterior only where the estimator keeps exactly the clean
    rows (the default does when the corrupted rows' gradients lie farthest and ``contamination`` is
    their share); otherwise it drops clean rows with the largest residuals, so scale parameters
    come out too small. Outliers that nearly fit the model and flipped labels are not separable
    by any estimator; where the coefficients must be right, NUTS on the beta posterior
    (``model.sample(data, rs.BetaD(...), inits="mode")``) is the alternative.
    ``examples/results/rob_ula_bias/README.md`` compares the estimators.

    The warmup is robust-stan's (the paper starts anywhere with a fixed step): the chains start
    near the trimmed mode and run in coordinates ``z`` with ``theta = L z``, where ``L`` whitens
    the drift's slope at that mode; ``L`` is computed once, there, because a robust drift is not
    the gradient of a log density, so an ``L`` drawn from the chains would make the stationary
    law depend on the seed. A chain whose state or gradient stops being finite is stopped with a
    warning; its later draws are NaN.
    """
    options = dict(step_size=step_size, iter_sampling=iter_sampling, iter_warmup=iter_warmup, thin=thin,
                   chains=chains, estimator=estimator, inits=inits, init_scale=init_scale, metric=metric, seed=seed,
                   show_progress=show_progress, log_density=log_density, gradient_total=gradient_total)
    if not is_partitioned(data):
        refuse_cluster_for_rows_here(cluster, "Rob-ULA")
        model = require_model(model, "rs.rob_ula")
        return rob_ula_prepared(model, model.prepare(data, divergence, learning_rate), contamination, oracle, **options)
    require_model(model, "rs.rob_ula").require_rows("data", "rows held in partitions")
    target, gradients, prepared = partitioned_target(cast(Model, model), data, as_divergence(divergence),
                                                     learning_rate, cluster, combine)  # a built-in model
    try:
        out = run_rob_ula(target, contamination, **options)
    finally:
        gradients.close()
    fit = PartitionedRobULAFit(model, out.raw, prepared, out.settings, inverse_metric=out.inverse_metric,
                               unconstrained_draws=out.unconstrained_draws)
    fit.warn_if_not_converged()
    return fit


def rob_ula_prepared(model: AnyModel, prepared: PreparedData, contamination: float, oracle: str = "auto",
                     **options) -> RobULAFit:
    """:func:`rob_ula` on data the model has prepared (rows held here).

    Parameters
    ----------
    model : Model or StanProgramModel
        The model.
    prepared : PreparedData
        From ``model.prepare`` or ``model.with_row_weights`` (the posterior of some rows).
    contamination : float
        As for :func:`rob_ula`.
    oracle : str, default "auto"
        As for :func:`rob_ula`.
    **options
        :func:`rob_ula`'s options of the run itself (``step_size`` to ``gradient_total``).

    Returns
    -------
    RobULAFit
        The fit, warned about when it has not converged.
    """
    out = run_rob_ula(model.langevin_target(prepared.stan_data, oracle), contamination, **options)
    fit = RobULAFit(model, out.raw, prepared, out.settings, inverse_metric=out.inverse_metric,
                    unconstrained_draws=out.unconstrained_draws)
    fit.warn_if_not_converged()
    return fit
