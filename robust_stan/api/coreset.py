"""rs.coreset: robust Bayesian coresets (beta-Cores), SparseVI and uniform subsampling on any model."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ..building.data import PreparedData
from ..building.divergences import Divergence, DivergenceCode, as_divergence
from ..building.partitions import is_partitioned, refuse_cluster_for_rows_here
from ..common.cluster import Cluster
from ..common.errors import RobustStanInputError, require_count, require_positive
from ..common.seeds import seed_to_use
from ..methods.coresets.construction import METHODS, OPTIMIZERS, CoresetSettings, greedy_coreset, uniform_coreset
from ..methods.coresets.partitioned import PartitionedCoresetTarget
from ..methods.coresets.targets import INNER, SAMPLERS, CoresetTarget
from ..results.coreset import Coreset, ProgramCoreset
from .model import Model, require_builtin_model
from .stan_program import StanProgramModel


def coreset(model: Model, data: Mapping, size: int, method: str = "beta_cores", divergence: Divergence | None = None,
            draws: int = 100, iters_per_point: int = 100, select_batch: int = 1000, opt_batch: int = 200,
            inner: str = "beta", sampler: str = "laplace", groups=None, step_size: float = 1.0,
            optimizer: str = "adam", learning_rate: float = 1.0, start=None, refresh: Callable | None = None,
            seed: int | None = None, show_progress: bool = True, cluster: Cluster | None = None) -> Coreset:
    """A weighted subset of at most ``size`` rows (or groups) whose posterior stands in for the data's.

    Methods (``../shared/papers/beta-cores.txt``, Algorithm 1 and eq. 9-14):

    - ``"beta_cores"``: Manousakas and Mascolo's beta-Cores; the gains are minus the
      ``divergence``'s loss (``rs.BetaD(beta)``, or a decomposable ``rs.GammaD``), so rows
      the robust posterior disowns add nothing and are left out.
    - ``"sparse_vi"``: the same algorithm with the log-likelihood gains (Campbell and
      Beronov 2019).
    - ``"uniform"``: ``size`` rows drawn with replacement, weight N * count / size.

    The weighted posterior pi_w drawn from inside the loop uses the beta loss
    (``inner="beta"``, the paper's algorithm) or the classical likelihood
    (``inner="classical"``, the authors' code). ``sampler``: ``"laplace"`` (L-BFGS mode of the
    weighted program on the coreset rows, covariance from the finite-difference Hessian of
    the engine's gradients), ``"nuts"`` (the engine, one chain, 300 warmup iterations) or
    ``"exact"`` (the conjugate posterior of ``rs.location("multi_normal", covariance="known",
    priors={"mu": "normal(m0, s0)"})``, inner="classical" only). Each added point is followed by
    ``iters_per_point`` steps on the weights (``optimizer="adam"``, the authors' choice,
    restarted per point, or ``"sgd"`` as Algorithm 1 prints it; step ``step_size / (1 + t)``),
    each from ``draws`` fresh draws and a batch of ``opt_batch`` units; selection uses a batch
    of ``select_batch`` units.

    ``groups``: one label per row; the units are then the groups (a group's gain is the
    sum over its rows, its weight applies to each of them).

    ``start``: units (row numbers, or group labels with ``groups``) the greedy methods begin
    from, weight N / len(start) each (in units); ``size`` more are then added.
    ``refresh(weights)``: for models whose data depend on the coreset (a neural-linear model,
    whose features come from a network retrained on the coreset rows: the paper's
    section 4.3); it receives the row weights (N,) and returns new data for the same N rows,
    prepared like ``data`` and run by the same compiled program. It is called after
    every addition's weight steps (and once at the start, with ``start``); the returned
    ``Coreset`` holds the last data it returned.

    Cost model: each of the size x (iters_per_point + 1) steps makes one draw of S =
    ``draws`` parameters (Laplace: an L-BFGS run and 2 d gradients of the program on the
    coreset rows only, then S constrain calls) and one gains call, the program's
    standalone generated quantities on the B + M rows at the S draws (S x (B + M)
    pointwise losses, one engine call). Nothing costs O(N).

    Your own program (``rs.robustify``, one likelihood outcome) works too, with one difference:
    robust-stan cannot cut its rows out (its transformed data may use every row), so the
    weighted posterior is the program on all rows with the outcome's weights as data (0 off
    the coreset) and the gains come from its ``rs_robust_loss_<y>`` and ``rs_log_lik_<y>``;
    each draw and each gains call then costs O(N) rows. ``refresh`` returns the program's
    data (its data block's variables).

    Rows held in partitions (``data`` values that are Dask arrays split into row chunks, Dask
    DataFrames or Series, or lists of ``.npy`` or ``.parquet`` paths, one file per partition; a
    built-in model with ``standardize=False``): each batch's gains are computed where their partitions live (on
    ``cluster``'s workers, an :class:`rs.Cluster`; here without one) and only their reductions travel; the coreset's rows
    are fetched here as they join (:mod:`robust_stan.methods.coresets.partitioned`). The choices
    are the in-memory run's; the result's ``prepared`` then holds the fetched rows only
    (``local_rows``). Not with ``groups``, ``refresh`` or ``sampler="exact"``.

    Returns a :class:`~robust_stan.results.coreset.Coreset` (a
    :class:`~robust_stan.results.coreset.ProgramCoreset` for your own program);
    ``coreset.sample()`` and ``coreset.variational()`` fit its posterior with the same
    compiled program.
    """
    own_program = isinstance(model, StanProgramModel)
    if not own_program:
        require_builtin_model(model, "rs.coreset")
    if method not in METHODS:
        raise RobustStanInputError(f"method: must be one of {list(METHODS)}, got {method!r}")
    if inner not in INNER:
        raise RobustStanInputError(f"inner: must be one of {list(INNER)}, got {inner!r}")
    if sampler not in SAMPLERS:
        raise RobustStanInputError(f"sampler: must be one of {list(SAMPLERS)}, got {sampler!r}")
    if optimizer not in OPTIMIZERS:
        raise RobustStanInputError(f"optimizer: must be one of {list(OPTIMIZERS)}, got {optimizer!r}")
    divergence = as_divergence(divergence)  # None: KL
    if method == "beta_cores" and divergence.code not in (DivergenceCode.BETA, DivergenceCode.GAMMA):
        raise RobustStanInputError(f"divergence: beta_cores needs rs.BetaD(beta) or a decomposable rs.GammaD, "
                                   f"got {divergence!r} (for the log-likelihood gains use method='sparse_vi')")
    if method == "sparse_vi" and inner == "beta":
        inner = "classical"  # SparseVI's posterior is the classical one
    size = require_count("size", size)
    settings = CoresetSettings(
        size=size, draws=require_count("draws", draws, 2), iters_per_point=require_count("iters_per_point", iters_per_point, 0),
        select_batch=require_count("select_batch", select_batch), opt_batch=require_count("opt_batch", opt_batch),
        step_size=require_positive("step_size", step_size), optimizer=optimizer,
        seed=seed_to_use(seed), show_progress=bool(show_progress))
    if is_partitioned(data):
        return _partitioned_coreset(model, data, method, divergence, inner, sampler, settings, learning_rate,
                                    groups, start, refresh, cluster)
    refuse_cluster_for_rows_here(cluster, "rs.coreset")
    prepared = _prepared(model, data, divergence, learning_rate)
    n_rows = (int(prepared.stan_data["N"]) if not own_program
              else model.rows_of_outcome(prepared.stan_data))  # type: ignore[attr-defined]  # a StanProgramModel
    unit_rows, labels = _units(groups, n_rows)
    n_units = len(unit_rows) if unit_rows is not None else n_rows
    start_units = _checked_start(start, labels, n_units, size, method, refresh)
    if refresh is not None and not callable(refresh):
        raise RobustStanInputError(f"refresh: must be a function of the row weights, got {type(refresh).__name__}")

    def target_for(stan_data: dict):
        if own_program:
            return model.coreset_target(stan_data, divergence, inner, sampler, unit_rows)  # type: ignore[attr-defined]
        return CoresetTarget(model, stan_data, divergence, inner, sampler, unit_rows)

    result = ProgramCoreset if own_program else Coreset
    target = target_for(prepared.stan_data)
    if method == "uniform":
        out = uniform_coreset(target, size, settings.seed)
        return result(model, prepared, method, out.unit_weights, unit_rows, out.trace, out.seconds, labels, out.path)
    latest = [prepared]

    def refreshed_target(units, weights):
        rows, row_weights = target.rows_of(units, weights)
        all_weights = np.zeros(n_rows)
        all_weights[rows] = row_weights
        assert refresh is not None  # refreshed_target is used with refresh only
        new = _prepared(model, refresh(all_weights), divergence, learning_rate)
        new_rows = (model.rows_of_outcome(new.stan_data)  # type: ignore[attr-defined]  # a StanProgramModel
                    if own_program else int(new.stan_data["N"]))
        if new_rows != n_rows:
            raise RobustStanInputError(f"refresh: must return data for the same {n_rows} rows, got {new_rows}")
        latest[0] = new
        return target_for(new.stan_data)

    out = greedy_coreset(target, settings, "beta" if method == "beta_cores" else "classical", start_units,
                         refreshed_target if refresh is not None else None)
    return result(model, latest[0], method, out.unit_weights, unit_rows, out.trace, out.seconds, labels, out.path)


def _partitioned_coreset(model, data: Mapping, method: str, divergence: Divergence, inner: str, sampler: str,
                         settings: CoresetSettings, learning_rate: float, groups, start, refresh,
                         cluster: Cluster | None) -> Coreset:
    """rs.coreset on rows held in partitions (see its docstring)."""
    require_builtin_model(model, "rs.coreset with rows held in partitions")
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


def _prepared(model, data: Mapping, divergence: Divergence, learning_rate: float) -> PreparedData:
    """A built-in model's prepared data, or your program's Stan data in the same holder (no scaling)."""
    if isinstance(model, StanProgramModel):
        return PreparedData(data, model.stan_data(data, divergence, learning_rate), None,  # type: ignore[arg-type]
                            divergence)  # your program's data: nothing is standardised
    return model.prepare(data, divergence, learning_rate)


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
