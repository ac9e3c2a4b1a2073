"""Summaries of draws and the convergence warning every sampler's fit gives (R-hat, ESS)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from ..common.errors import RobustStanWarning
from .arviz_output import scalar_diagnostics

#: Convergence limits of :meth:`Fit.warn_if_not_converged` (Vehtari, Gelman, Simpson, Carpenter
#: and Buerkner 2021): R-hat at most 1.01, bulk and tail ESS at least 100.
R_HAT_LIMIT, ESS_LIMIT = 1.01, 100

# ArviZ's names for Stan's sampler statistics.
def _element_labels(name: str, shape: tuple[int, ...]) -> list[str]:
    if not shape:
        return [name]
    return [f"{name}[{','.join(str(i + 1) for i in idx)}]" for idx in np.ndindex(*shape)]


def named_element_labels(name: str, shape: tuple[int, ...], axis_labels: list | None = None) -> list[str]:
    """A label per element of a variable, in C order: ``name[<label of each axis>]`` with an axis's
    names where ``axis_labels`` gives them (``b[x1]``, ``u_g[Intercept, a]``; None for an axis
    counts from 1), else 1-based indices (``L[1,2]``)."""
    if not axis_labels or all(labels is None for labels in axis_labels):
        return _element_labels(name, shape)
    axes = [[str(i + 1) for i in range(size)] if labels is None else [str(v) for v in labels]
            for size, labels in zip(shape, axis_labels)]
    return [f"{name}[{', '.join(axes[k][i] for k, i in enumerate(idx))}]" for idx in np.ndindex(*shape)]


def summary_table(variables: dict[str, np.ndarray], percentiles: tuple[float, ...] = (5, 50, 95),
                  labels: dict[str, list[str | None]] | None = None) -> pd.DataFrame:
    """Per scalar element of ``variables`` (name -> (chains, draws, *shape)): mean, sd, percentiles,
    MCSE of the mean, ESS (bulk, tail) and R-hat. ``labels`` gives a variable's row labels, one per
    element in C order (None leaves the element out, as a correlation matrix's diagonal); by
    default ``name[i,j]`` counted from 1."""
    rows = {}
    for name, values in variables.items():
        shape = values.shape[2:]
        flat = values.reshape(values.shape[:2] + (-1,))
        names = (labels or {}).get(name) or _element_labels(name, shape)
        for j, label in enumerate(names):
            if label is None:
                continue
            if label in rows:
                raise ValueError(f"two elements of the summary are labelled {label!r}")
            x = flat[:, :, j]
            row = {"mean": x.mean(), "sd": x.std(ddof=1)}
            row.update({f"{p:g}%": np.percentile(x, p) for p in percentiles})
            row.update(scalar_diagnostics(x))
            rows[label] = row
    return pd.DataFrame.from_dict(rows, orient="index")


def warn_if_poor_convergence(summary: pd.DataFrame, method: str, stacklevel: int = 3) -> None:
    """A RobustStanWarning when a row of ``summary`` has R-hat above 1.01 or a bulk or tail ESS
    below 100 (Vehtari et al. 2021's limits), or is not finite; elements constant in every draw
    have no R-hat and are left out."""
    r_hat, ess_bulk, ess_tail = (summary[c].astype(float) for c in ("r_hat", "ess_bulk", "ess_tail"))
    bad = ~((r_hat <= R_HAT_LIMIT) & (ess_bulk >= ESS_LIMIT) & (ess_tail >= ESS_LIMIT))  # NaN counts as bad
    bad &= ~(summary["sd"].astype(float) == 0)  # a constant element (the 1 on a Cholesky factor's diagonal)
    if bad.any():
        names = list(summary.index[bad])
        warnings.warn(
            f"{method}: the chains have not converged for {len(names)} of {len(summary)} parameters "
            f"({', '.join(names[:5])}{', ...' if len(names) > 5 else ''}): largest R-hat {r_hat.max():.3f}, "
            f"smallest bulk ESS {ess_bulk.min():.0f}, tail ESS {ess_tail.min():.0f} (limits: R-hat "
            f"{R_HAT_LIMIT}, ESS {ESS_LIMIT}). Run longer, start the chains elsewhere, or look for several "
            "modes; fit.summary() has the figures.", RobustStanWarning, stacklevel=stacklevel)
