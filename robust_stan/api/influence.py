"""rs.influence: the public entry of the refitting influence curves (robust_stan.methods.variational.influence)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from ..building.divergences import Divergence
from ..common.errors import RobustStanInputError
from ..common.seeds import seed_to_use
from ..methods.variational.influence import influence_curve
from ..results.fits.variational import VariationalFit
from .any_model import AnyModel
from .model import Model


def influence(fit_or_model: VariationalFit | Model, data: Mapping, index: int, values: Sequence, test_data: Mapping,
              *, variable: str = "y", column: int | None = None, draws: int = 200, seed: int | None = None,
              divergence: Divergence | None = None, **options) -> pd.DataFrame:
    """How the test log-likelihood moves when training point ``index`` takes each of ``values``.

    Every refit starts from the fit's q with the same seed, and so does a baseline refit on the
    unchanged data, so ``change`` (the refit's test log-likelihood minus the baseline's) is free
    of the optimiser's own noise. The baseline is kept with the fit, so further calls with the
    same data, test data and settings (``seed`` included) do not refit it.

    Parameters
    ----------
    fit_or_model : VariationalFit or Model
        A variational fit of the model to ``data`` (:meth:`robust_stan.Model.variational`), whose
        divergence, learning rate and family are reused; or a Model, first fitted by
        ``model.variational(data, divergence, seed=seed, **options)``.
    data : mapping
        The training data.
    index : int
        The 0-based training row that moves.
    values : sequence of float
        The values it takes.
    test_data : mapping
        The data the log-likelihood is computed on.
    variable : str, default "y"
        What is moved: ``"y"``, or ``"X"`` with ``column``.
    column : int or None, default None
        The column of ``X`` that moves.
    draws : int, default 200
        Draws from q for each test log-likelihood.
    seed : int or None, default None
        Seed of the refits and draws; None draws one from fresh entropy for this call (every refit
        of the call shares it; the table cannot be repeated, and the baseline is refitted).
    divergence : Divergence or None, default None
        Only with a Model: the divergence of its first fit.
    **options
        Passed to :meth:`robust_stan.Model.variational` for the refits (and the first fit of a
        Model).

    Returns
    -------
    pandas.DataFrame
        One row per value: ``value``, ``test_loglik`` and ``change``.

    Raises
    ------
    RobustStanInputError
        If ``divergence`` comes with a fit, or ``variable``, ``column`` or ``index`` is invalid.
    """
    for name in ("warm_start", "show_progress"):
        if name in options:
            raise RobustStanInputError(f"{name}: influence sets it for every refit (each starts from the fit's q, "
                                       "quietly)")
    model = fit_or_model.model if isinstance(fit_or_model, VariationalFit) else fit_or_model
    if not isinstance(model, AnyModel):
        raise RobustStanInputError("fit_or_model: give a variational fit (model.variational(...)) or a Model; "
                                   "influence refits it from its q at each value")
    model.require_rows("fit_or_model", "rs.influence's moved row and test rows")
    if getattr(getattr(model, "spec", None), "formula", None) is not None:
        raise RobustStanInputError("fit_or_model: rs.influence moves a value of the model's own data, not of a data "
                                   "frame a formula reads; not offered for a model built from a formula yet (build "
                                   "X and y and use rs.glm without a formula)")
    if isinstance(fit_or_model, VariationalFit):
        fit = fit_or_model
        for name, value in (("divergence", divergence), *((k, options.get(k)) for k in ("learning_rate", "family"))):
            if value is not None:
                raise RobustStanInputError(f"{name}: give it with a Model; a variational fit keeps its own {name}")
    else:
        first_fit = {"learning_rate": options.pop("learning_rate", 1.0), "family": options.pop("family", "meanfield")}
        made = model.variational(data, divergence, seed=seed, show_progress=False, **first_fit, **options)
        if not isinstance(made, VariationalFit):
            raise RobustStanInputError("options: influence refits robust-stan's own VI from its q; give no method")
        fit = made
    n = len(np.asarray(data["y"]))
    if not isinstance(index, (int, np.integer)) or not 0 <= index < n:
        raise RobustStanInputError(f"index: must be a row number in 0..{n - 1}, got {index!r}")
    if variable not in data:
        raise RobustStanInputError(f"variable: {variable!r} is not in the data")
    value_array = np.asarray(values, dtype=float).ravel()
    if value_array.size == 0 or not np.all(np.isfinite(value_array)):
        raise RobustStanInputError("values: give at least one finite value")
    return influence_curve(fit, data, index, value_array, test_data, variable=variable, column=column, draws=draws,
                           seed=seed_to_use(seed), **options)  # None: one drawn for every refit of this call
