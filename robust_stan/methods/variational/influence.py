"""Influence of one training point on a test log-likelihood, by refitting (Futami et al. 2018).

The public entry, which checks the arguments, is :func:`robust_stan.influence`; the curves are
drawn by :func:`robust_stan.plot_influence`.

The point's value is moved along a path; at each value the variational fit is
redone from the original fit's q (a warm start), and the average test
log-likelihood log mean_s p(y_test_i | theta_s) is computed at draws made from
the same standard-normal numbers every time, so the curve is smooth in the value.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping

import numpy as np
import pandas as pd

from ...building.data import prepare_data
from ...common.digest import digest
from ..held_out import held_out_log_likelihood
from .robust_vi import fit_variational


def _moved(data: Mapping, variable: str, index: int, column: int | None, value) -> dict:
    out = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in data.items()}
    array = np.array(data[variable], dtype=float, copy=True)
    if column is None:
        array[index] = value
    else:
        array[index, column] = value
    out[variable] = array.astype(np.asarray(data[variable]).dtype) if np.asarray(data[variable]).dtype.kind in "iu" \
        else array
    return out


# A fit's baseline refits, by what they depend on: several calls on the same fit, data and
# test data (one per moved point, as in Table 5) refit the unchanged data only once.
_BASELINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def influence_curve(fit, data: Mapping, index: int, values: np.ndarray, test_data: Mapping, *,
                    variable: str = "y", column: int | None = None, draws: int = 200, seed: int,
                    **options) -> pd.DataFrame:
    """The table of :func:`robust_stan.influence` for a variational fit (a
    :class:`~robust_stan.results.fits.variational.VariationalFit`), arguments already checked: one refit
    from the fit's q per value of point ``index`` (``options`` go to every refit)."""
    eps = np.random.default_rng(seed).standard_normal((draws, fit.q.mean.size))
    settings = fit.settings
    program = fit.model
    weights = options.pop("weights", None)
    options.pop("inits", None)  # every refit starts from the fit's q

    def refit_test_loglik(training_data: Mapping) -> float:
        stan_data, scaling = prepare_data(program.spec, training_data, fit.divergence, fit.learning_rate, weights)
        refit = fit_variational(program, stan_data, family=settings.family, warm_start=fit.q, draws=2, seed=seed,
                                show_progress=False,
                                **{"grad_samples": settings.grad_samples, "eta": settings.eta, **options})
        thetas = refit.q.mean + eps @ refit.q.cholesky.T
        return held_out_log_likelihood(program, fit.divergence, scaling, test_data, thetas)

    key = digest(data, test_data, draws, seed, sorted(options.items()), weights)
    baselines = _BASELINES.setdefault(fit, {})
    if key not in baselines:
        baselines[key] = refit_test_loglik(data)
    baseline = baselines[key]
    rows = []
    for value in values:
        loglik = refit_test_loglik(_moved(data, variable, index, column, value))
        rows.append({"value": value, "test_loglik": loglik, "change": loglik - baseline})
    return pd.DataFrame(rows)
