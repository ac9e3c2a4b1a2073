"""rs.coreset: robust Bayesian coresets (beta-Cores), SparseVI and uniform subsampling on any model."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ..building.divergences import Divergence, DivergenceCode, as_divergence
from ..building.partitions import is_partitioned, refuse_cluster_for_rows_here
from ..common.cluster import Cluster
from ..common.errors import RobustStanInputError
from ..common.seeds import seed_to_use
from ..methods.coresets.construction import METHODS, CoresetSettings, greedy_coreset, uniform_coreset
from ..methods.coresets.partitioned import PartitionedCoresetTarget
from ..methods.coresets.targets import INNER, SAMPLERS
from ..results.coreset import Coreset
from .any_model import AnyModel, require_model


def coreset(model: AnyModel, data: Mapping, size: int, method: str = "beta_cores",
            divergence: Divergence | None = None, draws: int = 100, iters_per_point: int = 100,
            select_batch: int = 1000, opt_batch: int = 200,
            inner: str = "beta", sampler: str = "laplace", groups=None, step_size: float = 1.0,
            optimizer: str = "adam", learning_rate: float = 1.0, start=None, refresh: Callable | None = None,
            seed: int | None = None, show_progress: bool = True, cluster: Cluster | None = None) -> Coreset:
    """A weighted subset of at most ``size`` rows (or groups) whose posterior stands in for the data's.

    The greedy methods follow Algorithm 1 of Manousakas and Mascolo (2020, arXiv:2008.13600):
    each added unit is followed by ``iters_per_point`` steps on the weights, each from ``draws``
    fresh draws of the weighted posterior pi_w and a batch of ``opt_batch`` units; selection uses a
    batch of ``select_batch`` units. Every step costs one draw of ``draws`` parameters on the
    coreset rows and one engine call for the batch's pointwise losses, so nothing costs O(N).
    Your own program (:func:`robustify`, one likelihood outcome) works too, but robust-stan cannot
    cut its rows out (its transformed data may use every row), so each draw and gains call then
    costs O(N) rows.

    Parameters
    ----------
    model : Model or StanProgramModel
        A built-in model or a robustified program with one likelihood outcome.
    data : mapping
        The model's data. Values that are Dask arrays split into row chunks, Dask DataFrames or
        Series, or lists of ``.npy`` or ``.parquet`` paths are rows held in partitions (built-in
        models with ``standardize=False``; not with ``groups``, ``refresh`` or
        ``sampler="exact"``): each batch's gains are computed where the partitions live and the
        coreset's rows are fetched as they join, with the in-memory run's choices.
    size : int
        The most units the coreset holds.
    method : {"beta_cores", "sparse_vi", "uniform"}, default "beta_cores"
        "beta_cores": the gains are minus the ``divergence``'s loss, so rows the robust posterior
        disowns add nothing; "sparse_vi": the same algorithm with log-likelihood gains (Campbell
        and Beronov 2019, arXiv:1906.03329); "uniform": ``size`` rows drawn with replacement,
        weight N * count / size.
    divergence : Divergence or None, default None
        ``rs.BetaD(beta)`` or a decomposable ``rs.GammaD`` for "beta_cores"; None is KL.
    draws : int, default 100
        Draws of pi_w per weight step.
    iters_per_point : int, default 100
        Weight steps after each added unit.
    select_batch : int, default 1000
        Units scored when choosing the next one.
    opt_batch : int, default 200
        Units in each weight step's batch.
    inner : {"beta", "classical"}, default "beta"
        The loss of pi_w: the beta loss (the paper's algorithm) or the classical likelihood (the
        authors' code).
    sampler : {"laplace", "nuts", "exact"}, default "laplace"
        How pi_w is drawn from: the L-BFGS mode of the weighted program with the covariance from a
        finite-difference Hessian; the engine's NUTS (one chain, 300 warmup iterations); or the
        conjugate posterior of ``rs.location("multi_normal", covariance="known",
        priors={"mu": "normal(m0, s0)"})`` (``inner="classical"`` only).
    groups : array_like or None, default None
        One label per row; the units are then the groups (a group's gain is the sum over its
        rows, its weight applies to each of them).
    step_size : float, default 1.0
        The weight steps' size is ``step_size / (1 + t)``.
    optimizer : {"adam", "sgd"}, default "adam"
        Adam restarted per point (the authors' choice) or SGD as Algorithm 1 prints it.
    learning_rate : float, default 1.0
        Weight ``w`` on the data term of pi_w.
    start : sequence or None, default None
        Units (row numbers, or group labels with ``groups``) the greedy methods begin from,
        weight N / len(start) each; ``size`` more are then added.
    refresh : callable or None, default None
        For models whose data depend on the coreset (a neural-linear model whose features come
        from a network retrained on the coreset rows, the paper's section 4.3): called with the
        row weights (N,) after every addition's weight steps, it returns new data for the same N
        rows, run by the same compiled program.
    seed : int or None, default None
        Seed of the run; None draws fresh entropy (not reproducible).
    show_progress : bool, default True
        Show a progress bar.
    cluster : Cluster or None, default None
        Workers for rows held in partitions; None computes here.

    Returns
    -------
    Coreset
        The weights and the trace; ``coreset.sample()`` and ``coreset.variational()`` fit its
        posterior with the same compiled program.

    Raises
    ------
    RobustStanInputError
        If an argument is invalid or the combination is not supported (the message says which).
    """
    require_model(model, "rs.coreset")
    if method not in METHODS:
        raise RobustStanInputError(f"method: must be one of {list(METHODS)}, got {method!r}")
    if inner not in INNER:
        raise RobustStanInputError(f"inner: must be one of {list(INNER)}, got {inner!r}")
    if sampler not in SAMPLERS:
        raise RobustStanInputError(f"sampler: must be one of {list(SAMPLERS)}, got {sampler!r}")
    divergence = as_divergence(divergence)  # None: KL
    if method == "beta_cores" and divergence.code not in (DivergenceCode.BETA, DivergenceCode.GAMMA):
        raise RobustStanInputError(f"divergence: beta_cores needs rs.BetaD(beta) or a decomposable rs.GammaD, "
                                   f"got {divergence!r} (for the log-likelihood gains use method='sparse_vi')")
    if method == "sparse_vi" and inner == "beta":
        inner = "classical"  # SparseVI's posterior is the classical one
    settings = CoresetSettings(size, draws, iters_per_point, select_batch, opt_batch, step_size, optimizer,
                               seed_to_use(seed), show_progress)
    size = settings.size
    if is_partitioned(data):
        return _partitioned_coreset(model, data, method, divergence, inner, sampler, settings, learning_rate,
                                    groups, start, refresh, cluster)
    refuse_cluster_for_rows_here(cluster, "rs.coreset")
    prepared = model.prepare(data, divergence, learning_rate)
    n_rows = model.rows_of_outcome(prepared.stan_data)
    unit_rows, labels = _units(groups, n_rows)
    n_units = len(unit_rows) if unit_rows is not None else n_rows
    start_units = _checked_start(start, labels, n_units, size, method, refresh)
    if refresh is not None and not callable(refresh):
        raise RobustStanInputError(f"refresh: must be a function of the row weights, got {type(refresh).__name__}")

    def target_for(stan_data: dict):
        return model.coreset_target(stan_data, divergence, inner, sampler, unit_rows)

    target = target_for(prepared.stan_data)
    if method == "uniform":
        out = uniform_coreset(target, size, settings.seed)
        return Coreset(model, prepared, method, out.unit_weights, unit_rows, out.trace, out.seconds, labels, out.path)
    latest = [prepared]

    def refreshed_target(units, weights):
        rows, row_weights = target.rows_of(units, weights)
        all_weights = np.zeros(n_rows)
        all_weights[rows] = row_weights
        assert refresh is not None  # refreshed_target is used with refresh only
        new = model.prepare(refresh(all_weights), divergence, learning_rate)
        new_rows = model.rows_of_outcome(new.stan_data)
        if new_rows != n_rows:
            raise RobustStanInputError(f"refresh: must return data for the same {n_rows} rows, got {new_rows}")
        latest[0] = new
        return target_for(new.stan_data)

    out = greedy_coreset(target, settings, "beta" if method == "beta_cores" else "classical", start_units,
                         refreshed_target if refresh is not None else None)
    return Coreset(model, latest[0], method, out.unit_weights, unit_rows, out.trace, out.seconds, labels, out.path)


def _partitioned_coreset(model, data: Mapping, method: str, divergence: Divergence, inner: str, sampler: str,
                         settings: CoresetSettings, learning_rate: float, groups, start, refresh,
                         cluster: Cluster | None) -> Coreset:
    """rs.coreset on rows held in partitions (see its docstring)."""
    model.require_rows("data", "rows held in partitions")
    for name, value, why in (("groups", groups, "units are rows"), ("refresh", refresh, "the data cannot be replaced")):
        if value is not None:
            raise RobustStanInputError(f"{name}: not with rows held in partitions ({why})")
    if sampler == "exact":
        raise RobustStanInputError("sampler: 'exact' needs every row here; use 'laplace' or 'nuts' with rows held "
                                   "in partitions")
    target = PartitionedCoresetTarget(model, data, divergence, inner, sampler, learning_rate, cluster)
    try:
        start_units = _checked_start(start, None, target.n_units, settings.size, method, None)
        if method == "uniform":
            out = uniform_coreset(target, settings.size, settings.seed)
        else:
            out = greedy_coreset(target, settings, "beta" if method == "beta_cores" else "classical", start_units)
        target.fetch(np.flatnonzero(out.unit_weights))
        prepared = target.local_prepared
    finally:
        target.close()
    return Coreset(model, prepared, method, out.unit_weights, None, out.trace, out.seconds, None, out.path,
                   target.local_rows)


def _checked_start(start, labels, n_units: int, size: int, method: str, refresh) -> np.ndarray:
    """The unit numbers of ``start``, once ``size`` more units are known to fit among the
    ``n_units`` and the method is known to take a start (and a refresh)."""
    units = "groups" if labels is not None else "rows"
    if size > n_units:
        raise RobustStanInputError(f"size: at most the number of {units} ({n_units}), got {size}")
    if method == "uniform" and (start is not None or refresh is not None):
        raise RobustStanInputError("start, refresh: only for the greedy methods 'beta_cores' and 'sparse_vi'")
    start_units = _start_units(start, labels, n_units)
    if size + start_units.size > n_units:
        raise RobustStanInputError(f"size: start ({start_units.size}) plus size ({size}) exceeds the number of "
                                   f"{units} ({n_units})")
    return start_units


def _start_units(start, labels, n_units: int) -> np.ndarray:
    """The unit numbers of ``start`` (row numbers, or group labels when there are groups)."""
    if start is None:
        return np.zeros(0, dtype=int)
    values = np.atleast_1d(np.asarray(start))
    if values.size == 0:
        return np.zeros(0, dtype=int)
    if labels is None:
        if values.dtype.kind not in "iu" or values.min() < 0 or values.max() >= n_units:
            raise RobustStanInputError(f"start: must be row numbers in 0..{n_units - 1}, got {start!r:.60}")
        units = values.astype(int)
    else:
        found = np.searchsorted(labels, values)
        found = np.minimum(found, labels.size - 1)
        if not np.all(labels[found] == values):
            raise RobustStanInputError(f"start: must be labels of groups, got {start!r:.60}")
        units = found
    if np.unique(units).size != units.size:
        raise RobustStanInputError("start: repeats a unit")
    return units


def _units(groups, n_rows: int):
    """Each unit's rows and the group labels, or (None, None) when every row is a unit."""
    if groups is None:
        return None, None
    labels_per_row = np.asarray(groups)
    if labels_per_row.shape != (n_rows,):
        raise RobustStanInputError(f"groups: need one label per row, shape ({n_rows},); got {labels_per_row.shape}")
    labels, codes = np.unique(labels_per_row, return_inverse=True)
    order = np.argsort(codes, kind="stable")
    bounds = np.cumsum(np.bincount(codes, minlength=labels.size))[:-1]
    return np.split(order, bounds), labels
