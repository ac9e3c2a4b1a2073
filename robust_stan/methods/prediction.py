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
