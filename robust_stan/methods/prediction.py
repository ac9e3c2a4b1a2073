"""The linear predictor of a formula model at posterior draws, for new rows too: the group effects
from their non-centred parameters, effects of new group levels drawn from the group distribution,
and alpha + X b + sum over terms of Z u[level].

Draws carry any leading axes (chains, draws); the non-centred parameters of a group-level term
with K coefficients and G levels are ``z`` (..., K, G), ``sd`` (..., K) and, for correlated
coefficients, the Cholesky factor of their correlation ``L`` (..., K, K), and its effects are
``u = diag(sd) L z`` (..., K, G), column l the effects of level l.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from ..building.families import Family
from ..building.formulas import Design
from ..common.errors import RobustStanInputError


def group_effects(z: np.ndarray, sd: np.ndarray, L: np.ndarray | None = None) -> np.ndarray:
    """A group-level term's effects ``u = diag(sd) L z`` from its non-centred parameters.

    Parameters
    ----------
    z : numpy.ndarray
        (..., K, G) standard-normal parameters, one column per level.
    sd : numpy.ndarray
        (..., K) the coefficients' standard deviations across levels.
    L : numpy.ndarray or None, default None
        (..., K, K) the Cholesky factor of their correlation; None for independent coefficients.

    Returns
    -------
    numpy.ndarray
        (..., K, G) the effects, column l those of level l.
    """
    z = np.asarray(z, dtype=float)
    correlated = z if L is None else np.asarray(L, dtype=float) @ z
    return np.asarray(sd, dtype=float)[..., :, None] * correlated


def new_level_effects(sd: np.ndarray, L: np.ndarray | None, n_levels: int, rng: np.random.Generator) -> np.ndarray:
    """Effects of levels the model was not fitted to, drawn from the group distribution at each draw.

    Parameters
    ----------
    sd : numpy.ndarray
        (..., K) the coefficients' standard deviations across levels, at each draw.
    L : numpy.ndarray or None
        (..., K, K) the Cholesky factor of their correlation; None for independent coefficients.
    n_levels : int
        How many new levels.
    rng : numpy.random.Generator
        The source of the standard-normal draws.

    Returns
    -------
    numpy.ndarray
        (..., K, n_levels): one draw of each new level's effects per posterior draw.
    """
    sd = np.asarray(sd, dtype=float)
    return group_effects(rng.standard_normal(sd.shape + (n_levels,)), sd, L)


def linear_predictor(design: Design, alpha: np.ndarray | None, b: np.ndarray,
                     effects: Mapping[str, np.ndarray]) -> np.ndarray:
    """alpha + X b + sum over group-level terms of Z[n] u[:, level of n], at every draw.

    Parameters
    ----------
    design : Design
        The rows' design (training or new data).
    alpha : numpy.ndarray or None
        (...) the intercept's draws; None for a formula without an intercept.
    b : numpy.ndarray
        (..., P) the coefficients' draws.
    effects : mapping of str to numpy.ndarray
        Per group-level term, by its Stan name, the effects (..., K, G') of every level a row of
        ``design`` has: the fitted levels, then (for rows flagged as new) the new levels in the
        order of :attr:`~robust_stan.building.formulas.GroupTerm.levels`.

    Returns
    -------
    numpy.ndarray
        (..., N) the linear predictor of each row at each draw.

    Raises
    ------
    RobustStanInputError
        If a term's effects are missing or have too few levels or the wrong number of coefficients.
    """
    b = np.asarray(b, dtype=float)
    eta = b @ design.X.T
    if alpha is not None:
        eta = eta + np.asarray(alpha, dtype=float)[..., None]
    for term in design.groups:
        if term.stan_name not in effects:
            raise RobustStanInputError(f"effects: no effects of the group-level term {term.name!r}")
        u = np.asarray(effects[term.stan_name], dtype=float)
        if u.shape[-2] != len(term.coefficients) or u.shape[-1] < len(term.levels):
            raise RobustStanInputError(f"effects: {term.name!r} needs ({len(term.coefficients)}, "
                                       f">= {len(term.levels)}) effects per draw, got {u.shape[-2:]}")
        # row n takes column index[n] of u: (..., K, N), then its coefficients weighted by Z[n]
        eta = eta + np.einsum("...kn,nk->...n", u[..., term.index], term.Z)
    return eta


#: What :func:`predict_draws` returns: the mean of y at each draw, or a draw of y.
PREDICTION_KINDS = ("mean", "response")

#: What :func:`predict_draws` does with a group level the training data did not have.
PREDICTION_NEW_LEVELS = ("error", "sample")


def _as_rows(values, argument: str) -> tuple[np.ndarray, tuple[str, ...] | None, pd.Index]:
    """A plain design given as an array or a DataFrame: (N, P) floats, its column names, its row labels."""
    columns = tuple(str(c) for c in values.columns) if isinstance(values, pd.DataFrame) else None
    rows = values.index if isinstance(values, (pd.DataFrame, pd.Series)) else None
    try:
        X = np.asarray(values.to_numpy() if hasattr(values, "to_numpy") else values, dtype=float)
    except (TypeError, ValueError):
        raise RobustStanInputError(f"{argument}: X must be numbers, a matrix with one row per new row") from None
    if X.ndim == 1:
        X = X[:, None] if columns is None else X[None, :]
    if X.ndim != 2:
        raise RobustStanInputError(f"{argument}: X must be a matrix (rows, columns); got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise RobustStanInputError(f"{argument}: X contains non-finite values (NaN or inf)")
    return X, columns, pd.RangeIndex(X.shape[0]) if rows is None else rows


def plain_design(new_data, columns: tuple[str, ...] | None, n_columns: int, argument: str = "new_data") -> Design:
    """The design of new rows of a glm fitted to a plain ``X``: ``new_data`` is that X (an array or a
    DataFrame) or a mapping holding it as ``"X"``. A DataFrame's columns are matched by name to the
    training columns when those had names.

    Parameters
    ----------
    new_data : array_like, pandas.DataFrame or mapping
        The new rows' X.
    columns : tuple of str or None
        The training X's column names, None when it had none.
    n_columns : int
        The training X's number of columns.
    argument : str, default "new_data"
        The argument's name in error messages.

    Returns
    -------
    Design
        Without outcome, group-level terms or encoding.

    Raises
    ------
    RobustStanInputError
        If X is not a finite matrix with the training columns.
    """
    values = new_data["X"] if isinstance(new_data, Mapping) and "X" in new_data else new_data
    if isinstance(new_data, Mapping) and "X" not in new_data:
        raise RobustStanInputError(f"{argument}: give the new rows' X (as the array itself, or as {argument}['X'])")
    if isinstance(values, pd.Series):
        raise RobustStanInputError(f"{argument}: a pandas Series is read as one column; give one new row as a "
                                   "(1, P) array, or as a DataFrame of one row (series.to_frame().T)")
    if isinstance(values, pd.DataFrame):
        if columns is None:
            raise RobustStanInputError(f"{argument}: the model was fitted on an X without column names, so the "
                                       "columns of a DataFrame cannot be matched to its coefficients; give the new "
                                       "rows as an array in the training X's column order")
        missing = [c for c in columns if c not in {str(name) for name in values.columns}]
        if missing:
            raise RobustStanInputError(f"{argument}: X lacks the column(s) {missing} the model was fitted with "
                                       f"(its columns: {list(columns)})")
        values = values.rename(columns=str)[list(columns)]
    X, given, rows = _as_rows(values, argument)
    if X.shape[1] != n_columns:
        raise RobustStanInputError(f"{argument}: X has {X.shape[1]} columns; the model was fitted with {n_columns}")
    return Design(None, X, columns or given or tuple(str(j) for j in range(n_columns)), True, (), rows, None)


def predict_draws(family: Family, design: Design, posterior: Mapping[str, np.ndarray], kind: str,
                  rng: np.random.Generator, trials: np.ndarray | None = None,
                  flip_rate: str | None = None) -> np.ndarray:
    """The mean of y, or a draw of y, for every row of ``design`` at every posterior draw of a glm.

    The linear predictor is :func:`linear_predictor` at the draws (``alpha`` absent for a formula
    without an intercept), with the effects of the fitted levels from ``u_<s>`` and those of new levels
    (rows flagged by the design) drawn once per posterior draw from the group distribution, a level's
    rows sharing its draw. The mean is the family's inverse link (:attr:`Family.glm_mean`); under
    the mislabelling likelihood, that of the observed label, p (1 - e) + (1 - p) e. A response draws y
    from it (:attr:`Family.glm_draw`).

    Parameters
    ----------
    family : Family
        The glm's family.
    design : Design
        The rows.
    posterior : mapping
        The fit's draws in the outcome's own units: ``alpha``, ``b``, per group-level term ``u_<s>``,
        ``sd_<s>`` (and ``L_<s>``), and the family's other parameters.
    kind : {"mean", "response"}
        What to return.
    rng : numpy.random.Generator
        The source of new levels' effects and of response draws.
    trials : numpy.ndarray or None, default None
        The rows' numbers of trials (binomial).
    flip_rate : str or None, default None
        The name of the mislabelling likelihood's flip rate in ``posterior``; None without it.

    Returns
    -------
    numpy.ndarray
        (chains, draws, N).

    Raises
    ------
    RobustStanInputError
        If ``kind`` is unknown or the family has no predictions.
    """
    if kind not in PREDICTION_KINDS:
        raise RobustStanInputError(f"kind: must be one of {list(PREDICTION_KINDS)}, got {kind!r}")
    if family.glm_mean is None or family.glm_draw is None:
        raise RobustStanInputError(f"model: predictions are not offered for the {family.name} family yet")
    if family.class_labels or family.multivariate:
        return _predict_matrix_glm(family, design, posterior, kind, rng, flip_rate)
    effects = {}
    for term in design.groups:
        s = term.stan_name
        u = np.asarray(posterior[f"u_{s}"], dtype=float)
        new = len(term.levels) - term.n_fitted_levels
        if new:
            L = posterior.get(f"L_{s}") if term.correlated else None
            u = np.concatenate([u, new_level_effects(posterior[f"sd_{s}"], L, new, rng)], axis=-1)
        effects[s] = u
    eta = linear_predictor(design, posterior["alpha"] if design.intercept else None, posterior["b"], effects)
    data = {} if trials is None else {"trials": np.asarray(trials)}
    mean = family.glm_mean(eta, data)
    if flip_rate is not None:  # the observed label's probability
        rate = np.asarray(posterior[flip_rate], dtype=float)[..., None]
        mean = mean * (1 - rate) + (1 - mean) * rate
    if kind == "mean":
        return mean
    values = {name: np.asarray(posterior[name], dtype=float)[..., None] for name in ("sigma", "nu") if name in posterior}
    return family.glm_draw(mean, {**values, **data}, rng)


def _predict_matrix_glm(family: Family, design: Design, posterior: Mapping[str, np.ndarray], kind: str,
                        rng: np.random.Generator, flip_rate: str | None) -> np.ndarray:
    """:func:`predict_draws` for the glms whose linear predictor is a row per observation: categorical
    (logits alpha + x B against class 1, fixed at 0; the mean is the K class probabilities) and
    multi_normal (the mean alpha + x B, D values; covariance diag(tau) L_Omega L_Omega' diag(tau))."""
    assert family.glm_mean is not None and family.glm_draw is not None  # checked by predict_draws
    alpha, B = np.asarray(posterior["alpha"], dtype=float), np.asarray(posterior["B"], dtype=float)
    eta = alpha[..., None, :] + np.einsum("np,...pk->...nk", design.X, B)
    if family.class_labels:
        eta = np.concatenate([np.zeros(eta.shape[:-1] + (1,)), eta], axis=-1)
    mean = family.glm_mean(eta, {})
    if flip_rate is not None:  # the observed label's probabilities: another class with probability e / (K - 1)
        rate = np.asarray(posterior[flip_rate], dtype=float)[..., None, None]
        mean = mean * (1 - rate) + (1 - mean) * rate / (mean.shape[-1] - 1)
    if kind == "mean":
        return mean
    values = {}
    if family.multivariate:
        tau, L_omega = np.asarray(posterior["tau"], dtype=float), np.asarray(posterior["L_Omega"], dtype=float)
        values["L"] = tau[..., :, None] * L_omega
    return family.glm_draw(mean, values, rng)
