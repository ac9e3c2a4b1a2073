"""rs.rob_ula: the public entry of the Rob-ULA sampler (robust_stan.methods.rob_ula.sampler)."""

from __future__ import annotations

from collections.abc import Mapping

from ..building.divergences import Divergence, as_divergence
from ..building.partitions import is_partitioned, refuse_cluster_for_rows_here
from ..common.cluster import Cluster
from ..methods.rob_ula.partitioned import partitioned_target
from ..methods.rob_ula.sampler import builtin_target, run_rob_ula
from ..results.method_fits import PartitionedRobULAFit, RobULAFit
from ..results.program_fit import ProgramFit
from .model import Model, require_builtin_model
from .stan_program import StanProgramModel


def rob_ula(model: Model, data: Mapping, epsilon: float, step_size: float | None = None, iters: int = 5000,
            warmup: int = 500, thin: int = 1, chains: int = 4, estimator="auto",
            divergence: Divergence | None = None, learning_rate: float = 1.0, init: str = "mode",
            init_scale: float = 1.0, metric: str = "dense", seed: int | None = None, show_progress: bool = True,
            oracle: str = "auto", log_density: bool = True,
            gradient_total: str = "n", cluster: Cluster | None = None,
            combine: str = "median") -> RobULAFit | ProgramFit:
    """Sample with Rob-ULA; returns a fit like :meth:`Model.sample`'s.

    ``model`` is a built-in model (its per-example mode gives the gradients in one call) or a
    program from :func:`robust_stan.robustify` with one likelihood outcome (gradients by mixed
    second derivatives, :mod:`robust_stan.gradients.weight_derivatives`; the fit is then a
    :class:`~robust_stan.results.program_fit.ProgramFit`).

    ``epsilon`` in [0, 0.5) is the assumed fraction of corrupted observations
    (:func:`robust_stan.tune_rob_ula` chooses it on held-out rows, as the paper does);
    ``estimator`` is "auto" (:func:`~robust_stan.methods.rob_ula.sampler.default_estimator`: for
    continuous outcomes the row-trimmed mean, which drops the epsilon n rows whose gradients lie
    farthest from the coordinate-wise median; for discrete ones the coordinate-wise trimmed
    mean), a name from :data:`robust_stan.methods.rob_ula.estimators.ESTIMATORS`
    ("row_trimmed_mean", "lrv" = the paper's Algorithm 2 read literally, "lrv_once",
    "trimmed_mean" = coordinate-wise, "mean" = plain ULA, "coordinate_median",
    "median_of_means", "geometric_median") or a callable ``(G, epsilon)``.
    ``iters`` kept iterations (before thinning) follow ``warmup`` discarded ones.
    The robust mean of the per-example gradients is multiplied by n
    (``gradient_total="n"``, the paper's choice) or by (1 - epsilon) n
    (``"clean"``, the expected number of clean rows).

    What Rob-ULA aims at is the posterior given the clean rows, and it reaches it only where
    the estimator keeps exactly the clean rows. The default does when the corrupted rows'
    gradients are the farthest and epsilon is their share. Otherwise the estimator keeps some
    outliers or drops clean rows, and the rows it drops are those with the largest residuals,
    so scale parameters (sigma) come out too small and coefficients move too. Measured
    (``examples/results/rob_ula_bias``, where every estimator is compared): outliers that
    nearly fit the model (a leverage point whose shifted y the line almost predicts) are not
    separable by any of the estimators; and a chain can settle where the outliers are fitted
    (a second rest point of the robust drift, as least trimmed squares has local minima),
    which R-hat cannot see because every chain starts from the same trimmed mode. Flipped labels
    are not separable either: no estimator centres on the clean rows' posterior there. Where the
    coefficients must be right, NUTS on the beta posterior (``model.sample(data,
    rs.BetaD(...), inits="mode")``) is the alternative.

    Why "auto" is not the paper's ``lrv``: ``lrv`` keeps (1 - epsilon)^2 of the rows at every
    level of its recursion, so it cuts ever more clean rows; on the regressions of
    ``examples/results/rob_ula_bias`` it is the most biased of the robust estimators, and
    on logistic regression with flipped labels it drifts towards predicting the majority
    class.

    Warmup (robust-stan's; the paper starts anywhere with a fixed step):

    - ``init="mode"``: L-BFGS finds the maximum of the model's log density (its
      divergence and learning rate, Jacobian included) from a N(0, init_scale^2)
      point; for a robust estimator, concentration steps then move it to the
      trimmed mode (maximise with only the rows Algorithm 3 keeps there, repeat
      until they stop changing), near the robust drift's rest point. Every
      chain starts there plus init_scale times a draw of the preconditioner's
      normal (a Laplace draw), so chains start spread over the posterior's scale
      and R-hat can see whether they meet. ``"random"``: each chain at
      N(0, init_scale^2 I) on the unconstrained scale.
    - ``metric``: the chain runs in coordinates z with theta = L z, chosen so that
      the drift's slope at the start is the identity (``"dense"``), has a unit
      diagonal (``"diag"``), or left alone (``"unit"``: the paper's update). L
      comes in two stages: the forward-difference Hessian (d + 1 gradient calls)
      of -log prior + w * total * (mean loss over the rows Algorithm 3 keeps, all
      rows for the plain mean), so rows the estimator drops do not shrink the
      step; then the central-difference slope of the drift the estimator
      actually produces, over +-0.5 posterior sd (2 d calls), which rescales each
      direction by 1/2 to 2. The estimator sees the whitened gradients G L, on
      which every row's noise has about the same scale. L is computed once, at
      the (deterministic) trimmed mode and not from the chains' random states:
      a robust drift is not the gradient of a log density, so the law the chain
      settles to depends on L, and an L drawn from the warmup would make it
      depend on the seed (measured: intercept means 0.515 / 0.507 / 0.650 for
      seeds 11 / 12 / 13 on the regression of tests/test_rob_ula.py, against
      0.425 / 0.425 / 0.428 with L fixed).
    - the step size is 0.2 / (largest |eigenvalue| of the slope in z), which is
      0.2 for the dense metric. On a normal target this is an AR(1) chain with
      correlation 0.8 per step in the stiffest direction, and ULA's stationary
      variance is 1 / (1 - 0.2/2) = 1.11 times the target's (sds 5.4% too wide; the
      paper's analysis has this bias too); ``step_size`` sets it in z's units
      (the paper's units when ``metric="unit"``). Robust estimators mix about
      half as fast as the plain mean at this step (bulk ESS 630-750 against
      1100-1340 per 4 x 3000 draws on that regression), hence 5000 draws per chain.

    Stan's warmup adapts to an acceptance rate, which ULA does not have, and a
    covariance from a few hundred autocorrelated warmup draws is noisier than
    the Hessian, which the engine gives exactly. ``fit.inverse_metric`` is the
    final M = L L^T and ``fit.unconstrained_draws`` the draws of theta. A chain
    whose state or gradient stops being finite is stopped with a warning; its
    later draws are NaN. Like NUTS, a run whose R-hat or ESS is poor warns
    (:meth:`Fit.warn_if_not_converged`).

    Rows held in partitions (``data`` values that are Dask arrays split into row chunks, Dask
    DataFrames or Series, or lists of ``.npy`` or ``.parquet`` paths, one file per partition; a
    built-in model with ``standardize=False``): each partition's per-example gradients and the estimator on them are
    computed where the partition lives (on ``cluster``'s workers, an :class:`rs.Cluster`; here without one), and only each
    partition's robust mean travels; ``combine`` ("median", default, or "mean") joins them
    (:mod:`robust_stan.methods.rob_ula.partitioned` states each one's guarantee). The warmup is done the
    same way: ``init="mode"`` starts from each partition's robust mode (the prior plus its rows'
    loss scaled to all rows) joined by ``combine``, and the metric and default step come from the
    Hessian of the mean loss over the rows each partition keeps, summed over partitions, and the
    estimator's slope (with one partition, the in-memory warmup's; with the plain mean,
    ``combine="mean"`` and ``init="random"``, the in-memory metric and step: the partitions'
    modes joined are not the mode of all rows). Each kept draw's log density is the prior here
    plus each partition's data term computed where it lives (one task per partition after the
    run, for every draw at once). The fit
    (:class:`~robust_stan.results.method_fits.PartitionedRobULAFit`) has no per-observation
    quantities. The results do not depend on the number of workers.

    Each kept draw costs, besides the step, one full log density (``lp`` in
    sample_stats; ``log_density=False`` skips it) and one constrain call for its
    parameters. ``log_lik``, ``robust_loss`` and ``y_rep`` are computed on demand,
    as for every fit (:class:`~robust_stan.Fit`).
    """
    own_program = isinstance(model, StanProgramModel)
    if is_partitioned(data):
        require_builtin_model(model, "rs.rob_ula with rows held in partitions")
        divergence = as_divergence(divergence)
        target, gradients, prepared = partitioned_target(model, data, divergence, learning_rate, cluster, combine)
        try:
            out = run_rob_ula(target, epsilon, step_size=step_size, iters=iters, warmup=warmup, thin=thin,
                              chains=chains, estimator=estimator, init=init, init_scale=init_scale, metric=metric,
                              seed=seed, show_progress=show_progress, log_density=log_density,
                              gradient_total=gradient_total)
        finally:
            gradients.close()
        fit: RobULAFit | ProgramFit = PartitionedRobULAFit(model, out.raw, prepared, out.settings,
                                                           inverse_metric=out.inverse_metric,
                                                           unconstrained_draws=out.unconstrained_draws)
        fit.warn_if_not_converged()
        return fit
    refuse_cluster_for_rows_here(cluster, "Rob-ULA")
    if own_program:
        stan_data = model.stan_data(data, divergence, learning_rate)
        target = model.langevin_target(stan_data, oracle)  # type: ignore[attr-defined]  # a StanProgramModel
    else:
        require_builtin_model(model, "rs.rob_ula")
        prepared = model.prepare(data, divergence, learning_rate)
        target = builtin_target(model, prepared.stan_data, oracle)
    out = run_rob_ula(target, epsilon, step_size=step_size, iters=iters, warmup=warmup, thin=thin, chains=chains,
                      estimator=estimator, init=init, init_scale=init_scale, metric=metric, seed=seed,
                      show_progress=show_progress, log_density=log_density, gradient_total=gradient_total)
    if own_program:
        fit = ProgramFit(model, out.raw, stan_data, out.settings, as_divergence(divergence), learning_rate,
                         method="rob_ula", inverse_metric=out.inverse_metric,
                         unconstrained_draws=out.unconstrained_draws)
    else:
        fit = RobULAFit(model, out.raw, prepared, out.settings, inverse_metric=out.inverse_metric,
                        unconstrained_draws=out.unconstrained_draws)
    fit.warn_if_not_converged()
    return fit
