"""Pareto-smoothed importance sampling (PSIS; Vehtari et al. 2024) through ArviZ, on either ArviZ line.

ArviZ 0.x's ``psislw`` takes the log importance ratios; ArviZ 1.x's (arviz_stats) takes
log-likelihood values and smooths the ratios of their negatives, as PSIS-LOO wants. This
module hides the difference: pass log ratios log(target / proposal), get the smoothed,
normalised log weights and k-hat.
"""

from __future__ import annotations

import numpy as np

from ..common.arviz_version import arviz_major

#: Above this Pareto k-hat an importance-sampling estimate is not trusted (Vehtari et al. 2024).
K_HAT_LIMIT = 0.7


def psis(log_ratios) -> tuple[np.ndarray, float]:
    """Smoothed log weights (normalised: their exps sum to 1) of the draws whose log importance
    ratios are ``log_ratios`` (any shape, smoothed as one sample), and the Pareto k-hat of the
    ratios' right tail (above 0.7 the estimate is unreliable)."""
    ratios = np.asarray(log_ratios, dtype=float)
    flat = ratios.ravel()
    if arviz_major() >= 1:
        import xarray as xr

        # arviz_stats smooths exp(-input): hand it minus the log ratios
        log_weights, khat = xr.DataArray(-flat, dims=["sample"]).azstats.psislw(dim="sample")
        log_weights = np.asarray(log_weights, dtype=float)
    else:
        import arviz

        log_weights, khat = arviz.psislw(flat)
    return log_weights.reshape(ratios.shape), float(khat)
