"""ArviZ output and diagnostics on both ArviZ lines, through each line's public API.

ArviZ 0.x keeps results in ``arviz.InferenceData`` and takes groups as keyword
arguments; ArviZ 1.x (arviz-base, arviz-stats) keeps them in an
``xarray.DataTree`` and has changed several signatures. Fit objects build
their groups as ``xarray.Dataset`` here, once, and :func:`native_inference_data`
wraps them in the installed line's own object, so that groups, variable names
and dims are the same on both lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..common.arviz_version import arviz_major
from ..methods.importance import psis

#: Dims of the Monte Carlo draws, first in every array of draws.
SAMPLE_DIMS = ("chain", "draw")

#: The tail quantiles of the tail ESS: ArviZ 0.x's default, which ArviZ 1.x wants given.
TAIL_PROBABILITIES = (0.05, 0.95)


def draws_dataset(variables: Mapping[str, np.ndarray], dims: Mapping[str, list[str]] | None = None,
                  attrs: Mapping | None = None, sample_dims: tuple[str, ...] = SAMPLE_DIMS,
                  coords: Mapping[str, Any] | None = None):
    """An xarray Dataset of arrays whose leading axes are ``sample_dims`` (chain, draw by default).

    ``dims`` names the remaining axes of each variable (default ``<name>_dim_<k>``,
    as ArviZ names them); an axis gets its coordinate from ``coords`` by dim name (column or
    level names), else 0..n-1.
    """
    import xarray as xr

    dims = dims or {}
    data_vars: dict[str, tuple] = {}
    given = {dim: [str(v) for v in values] for dim, values in (coords or {}).items()}
    axes: dict[str, np.ndarray] = {}
    for name, values in variables.items():
        values = np.asarray(values)
        extra = values.ndim - len(sample_dims)
        names = list(dims.get(name, [f"{name}_dim_{k}" for k in range(extra)]))
        if len(names) != extra:
            raise ValueError(f"dims: {name!r} has {extra} axes after {sample_dims}, but dims names {names}")
        all_dims = tuple(sample_dims) + tuple(names)
        data_vars[name] = (all_dims, values)
        for dim, size in zip(all_dims, values.shape):
            if dim in given and len(given[dim]) != size:
                raise ValueError(f"coords: {dim!r} has {len(given[dim])} names for {size} entries of {name!r}")
            axes.setdefault(dim, np.asarray(given[dim]) if dim in given else np.arange(size))
    return xr.Dataset(data_vars, coords=axes, attrs=dict(attrs or {}))


def native_inference_data(groups: Mapping[str, Any]):
    """``groups`` (name -> xarray Dataset) as the installed ArviZ's own object:
    ``arviz.InferenceData`` on ArviZ 0.x, ``xarray.DataTree`` on ArviZ 1.x."""
    if arviz_major() >= 1:
        import xarray as xr

        # xarray before 2024.10 (the oldest supported) has no DataTree; ArviZ 1.x installs a newer one
        return xr.DataTree.from_dict(dict(groups))  # type: ignore[attr-defined, unused-ignore]
    import warnings

    import arviz

    with warnings.catch_warnings():
        # ArviZ 0.x warns about groups outside its schema (robust_loss, variational_elbo); they are ours.
        warnings.filterwarnings("ignore", message=".*group.*not defined in the InferenceData scheme.*")
        return arviz.InferenceData(**groups)


def group_names(inference_data) -> list[str]:
    """Names of the groups of an InferenceData (ArviZ 0.x) or DataTree (ArviZ 1.x).

    Parameters
    ----------
    inference_data : arviz.InferenceData or xarray.DataTree
        A fit's :meth:`~robust_stan.Fit.to_arviz` output.

    Returns
    -------
    list of str
        The group names, e.g. ``['posterior', ...]``.
    """
    if hasattr(inference_data, "children"):  # xarray.DataTree
        return list(inference_data.children)
    return list(inference_data.groups())


def scalar_diagnostics(draws: np.ndarray) -> dict[str, float]:
    """MCSE of the mean, bulk and tail ESS and rank-normalised R-hat of one scalar's (chains, draws) array."""
    import arviz

    return {
        "mcse_mean": float(arviz.mcse(draws, method="mean")),
        "ess_bulk": float(arviz.ess(draws, method="bulk")),
        "ess_tail": float(arviz.ess(draws, method="tail", prob=TAIL_PROBABILITIES)),
        "r_hat": float(arviz.rhat(draws)),
    }


def mcse_sd(draws: np.ndarray) -> float:
    """Monte Carlo standard error of the sd of one scalar's (chains, draws) array, the same on
    both ArviZ lines: by the delta method, sd(s^2) / (2 s) with sd(s^2) the MCSE of the mean
    of the centred squares (x - mean)^2, from their ESS (ArviZ 0.17's own mcse(method="sd")
    underestimates it: over 32 NUTS runs its z-scores of the sd had sd ~1.7, not 1)."""
    import arviz

    draws = np.asarray(draws, dtype=float)
    squares = (draws - draws.mean()) ** 2
    ess = float(arviz.ess(squares, method="mean"))
    return float(np.sqrt(squares.var(ddof=1) / ess) / (2 * np.sqrt(squares.mean())))


def pareto_khat(log_weights: np.ndarray) -> float:
    """Pareto k-hat of PSIS on a vector of log importance ratios (ArviZ's own estimate)."""
    return psis(np.asarray(log_weights, dtype=float).ravel())[1]
