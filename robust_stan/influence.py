"""Influence of one training point on a test log-likelihood, by refitting (Futami et al. 2018).

The point's value is moved along a path; at each value the variational fit is
redone from the original fit's q (a warm start), and the average test
log-likelihood log mean_s p(y_test_i | theta_s) is computed at draws made from
the same standard-normal numbers every time, so the curve is smooth in the value.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.special import logsumexp

from .data import prepare_data
from .divergences import Divergence
from .errors import RobustStanInputError


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


def _fingerprint(*parts) -> str:
    """A digest of data dicts and settings: equal digests, equal refits."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, Mapping):
            for key in sorted(part):
                value = np.asarray(part[key])
                digest.update(f"{key}:{value.dtype}:{value.shape};".encode())
                digest.update(np.ascontiguousarray(value).tobytes() if value.dtype != object else repr(value).encode())
        else:
            digest.update(repr(part).encode())
    return digest.hexdigest()


def held_out_pointwise_log_likelihood(fit, test_data: Mapping, thetas: np.ndarray) -> np.ndarray:
    """Per test row, log mean_s p(y_i | theta_s), thetas unconstrained (S, d); densities on the
    outcome's own scale."""
    model = fit.model
    stan_data, _ = prepare_data(model.spec, test_data, fit.divergence, scaling=fit.scaling)
    oracle = model.oracle_for(stan_data)
    log_lik = np.array([oracle.constrain(theta, include_gqs=True)["log_lik"] for theta in thetas])
    if model.spec.standardize and model.spec.family.continuous:
        log_lik = log_lik - np.log(fit.scaling.scale)  # densities on the outcome's own scale
    return logsumexp(log_lik, axis=0) - np.log(len(thetas))


def held_out_log_likelihood(fit, test_data: Mapping, thetas: np.ndarray) -> float:
    """Average over the test rows of log mean_s p(y_i | theta_s), thetas unconstrained (S, d)."""
    return float(np.mean(held_out_pointwise_log_likelihood(fit, test_data, thetas)))


def influence(fit_or_model, data: Mapping, index: int, values: Sequence, test_data: Mapping, *,
              variable: str = "y", column: int | None = None, draws: int = 200, seed: int = 0,
              divergence: Divergence | None = None, **options) -> pd.DataFrame:
    """How the test log-likelihood moves when training point ``index`` takes each of ``values``.

    ``fit_or_model`` is a variational fit of the model to ``data`` (see
    :meth:`robust_stan.Model.variational`), whose divergence, learning rate and
    family are reused; or a Model, which is first fitted to ``data`` by
    ``model.variational(data, divergence, seed=seed, **options)`` (``divergence``
    only goes with a Model). Every refit starts from the fit's q with the same seed,
    and so does a baseline refit on the unchanged data: ``change`` is the refit's
    test log-likelihood minus the baseline's, so the optimiser's own noise (large
    with minibatches) cancels. The baseline is kept with the fit, so further calls
    with the same data, test data and settings (other points) do not refit it.
    ``variable`` and ``column`` say what is moved (``"y"``, or ``"X"`` with a column). Returns a table with one row per value:
    ``value``, ``test_loglik`` and ``change``. ``options`` go to the refits (and to
    the first fit of a Model).
    """
    from .model import Model
    from .variational import VariationalFit

    fit = fit_or_model
    for name in ("warm_start", "show_progress"):
        if name in options:
            raise RobustStanInputError(f"{name}: influence sets it for every refit (each starts from the fit's q, "
                                       "quietly)")
    if isinstance(fit, Model):
        first_fit = {"learning_rate": options.pop("learning_rate", 1.0), "family": options.pop("family", "meanfield")}
        fit = fit.variational(data, divergence, seed=seed, show_progress=False, **first_fit, **options)
    else:
        for name, value in (("divergence", divergence), *((k, options.get(k)) for k in ("learning_rate", "family"))):
            if value is not None:
                raise RobustStanInputError(f"{name}: give it with a Model; a variational fit keeps its own {name}")
    if not isinstance(fit, VariationalFit):
        raise RobustStanInputError("fit_or_model: give a variational fit (model.variational(...)) or a Model; "
                                   "influence refits it from its q at each value")
    n = len(np.asarray(data["y"]))
    if not isinstance(index, (int, np.integer)) or not 0 <= index < n:
        raise RobustStanInputError(f"index: must be a row number in 0..{n - 1}, got {index!r}")
    if variable not in data:
        raise RobustStanInputError(f"variable: {variable!r} is not in the data")
    values = np.asarray(values, dtype=float).ravel()
    if values.size == 0 or not np.all(np.isfinite(values)):
        raise RobustStanInputError("values: give at least one finite value")
    eps = np.random.default_rng(seed).standard_normal((draws, fit.q.mean.size))
    settings = fit.settings

    def refit_test_loglik(training_data: Mapping) -> float:
        refit = fit.model.variational(
            training_data, fit.divergence, learning_rate=fit.learning_rate, family=settings.family,
            warm_start=fit.q, draws=2, seed=seed, show_progress=False,
            **{"grad_samples": settings.grad_samples, "eta": settings.eta, **options})
        return held_out_log_likelihood(refit, test_data, refit.q.mean + eps @ refit.q.cholesky.T)

    key = _fingerprint(data, test_data, draws, seed, sorted(options.items()))
    baselines = _BASELINES.setdefault(fit, {})
    if key not in baselines:
        baselines[key] = refit_test_loglik(data)
    baseline = baselines[key]
    rows = []
    for value in values:
        loglik = refit_test_loglik(_moved(data, variable, index, column, value))
        rows.append({"value": value, "test_loglik": loglik, "change": loglik - baseline})
    return pd.DataFrame(rows)


def plot_influence(tables: Mapping[str, pd.DataFrame], ax=None, xlabel: str = "value of the moved point"):
    """Plot ``change`` against ``value`` for each labelled table (e.g. {"KL": ..., "beta": ...})."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.5))
    for label, table in tables.items():
        ax.plot(table["value"], table["change"], marker="o", label=label)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("change in test log-likelihood")
    ax.legend()
    return ax
