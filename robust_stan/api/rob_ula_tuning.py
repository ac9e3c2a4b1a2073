"""Choosing Rob-ULA's contamination and estimator on held-out rows (Bhatia et al. 2019, section 6.2).

The paper tunes its hyperparameters on 20% of the (corrupted) training set held
out, then retrains on the whole training set with the values chosen. The score
of a setting is the mean over the held-out rows of the log posterior predictive
density, log mean_s p(y_i | theta_s): corrupted rows are in the held-out part
too, so a setting that fits the clean rows well and gives the corrupted ones
low but finite density wins; that is the paper's protocol, not a clean-data
oracle.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
from scipy.special import logsumexp

from ..building.divergences import Divergence
from ..common.errors import RobustStanInputError, RobustStanWarning, require_seed
from ..results.fits.mcmc import quantities_seed
from ..results.fits.rob_ula import RobULAFit
from .any_model import AnyModel, require_model
from .rob_ula import rob_ula_prepared

DEFAULT_CONTAMINATIONS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2)  # 0: plain ULA (see tune_rob_ula)


@dataclass
class RobULATuning:
    """What :func:`tune_rob_ula` found.

    Parameters
    ----------
    contamination : float
        The chosen contamination fraction.
    estimator : str
        The chosen estimator.
    curve : pandas.DataFrame
        The validation curve, one row per (estimator, contamination) setting.
    fit : RobULAFit or None
        The fit on all the rows with the choice (None when ``refit=False``).
    """

    contamination: float
    estimator: str
    curve: pd.DataFrame
    fit: RobULAFit | None

    def plot(self, ax=None):
        """Plot the validation curve per estimator, with +-1 standard error and the choice marked.

        Parameters
        ----------
        ax : matplotlib.axes.Axes, optional
            Where to draw; a new figure when omitted.

        Returns
        -------
        matplotlib.axes.Axes
            ``ax``, or the new figure's axes.
        """
        import matplotlib.pyplot as plt

        ax = ax or plt.gca()
        for estimator, rows in self.curve.groupby("estimator", sort=False):
            ax.errorbar(rows["contamination"], rows["validation_loglik"], yerr=rows["validation_loglik_se"],
                        marker="o", capsize=3, label=estimator)
        chosen = self.curve[(self.curve["contamination"] == self.contamination)
                            & (self.curve["estimator"] == self.estimator)]
        ax.plot(chosen["contamination"], chosen["validation_loglik"], "k*", markersize=14, label="chosen")
        ax.set_xlabel("contamination")
        ax.set_ylabel("mean held-out log predictive density")
        ax.legend()
        return ax


def split_rows(n: int, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held): sorted 0-based rows, a random ``fraction`` of the ``n`` rows held out."""
    order = rng.permutation(n)
    n_validation = int(round(fraction * n))
    if not 1 <= n_validation < n - 1:
        raise RobustStanInputError(f"validation_fraction: {fraction} of {n} rows leaves no rows on one side")
    return np.sort(order[n_validation:]), np.sort(order[:n_validation])


def tune_rob_ula(model: AnyModel, data: Mapping, contaminations: Sequence[float] = DEFAULT_CONTAMINATIONS,
                 estimators: Sequence[str] = ("auto",), validation_fraction: float = 0.2,
                 refit: bool = True, seed: int | None = None, divergence: Divergence | None = None,
                 learning_rate: float = 1.0, step_size: float | None = None, iter_sampling: int = 5000,
                 iter_warmup: int = 500, thin: int = 1, chains: int = 4, inits: str = "mode", init_scale: float = 1.0,
                 metric: str = "dense", gradient_total: str = "n", oracle: str = "auto", log_density: bool = True,
                 show_progress: bool = False) -> RobULATuning:
    """Choose ``contamination`` (and the estimator) by held-out log predictive density, then refit.

    A random ``validation_fraction`` of the rows is held out; :func:`rob_ula` runs on the
    rest for every pair in ``estimators`` x ``contaminations`` (same seed each time), and each
    setting is scored by the mean over the held-out rows of log mean_s p(y_i | theta_s).
    The default grid starts at contamination 0, where ``trimmed_mean``, ``lrv``, ``lrv_once`` and
    ``median_of_means`` are the plain mean (the run is plain ULA), so that the tuning can
    answer that no robustness is needed (``coordinate_median`` and ``geometric_median`` do
    not depend on it).
    The best setting is then run on all the rows (``refit=True``), as the paper's
    section 6.2 does. :func:`rob_ula`'s options (``divergence`` to ``show_progress`` below) go to
    every run.

    The curve has, per setting: ``validation_loglik``, its standard error over the held-out
    rows (``validation_loglik_se``: the sd of the pointwise values over sqrt(rows); settings
    closer than about two of these are not told apart), the largest R-hat (the grid's runs do not
    warn about convergence; the refit does) and the seconds taken.

    Parameters
    ----------
    model : Model or StanProgramModel
        A built-in model (its data are cut to the training rows) or a program from
        :func:`robust_stan.robustify` with one likelihood outcome (it keeps all its data and the
        held-out rows get weight 0, so its transformed data still see them).
    data : mapping
        The data, as for :func:`rob_ula`; rows are split at random. A built-in model standardises
        the outcome with every row, as the refit does, so the grid's runs and the refit share one
        scale.
    contaminations : sequence of float
        The grid of contamination fractions, each in [0, 0.5).
    estimators : sequence of str or callable
        The estimators to try (``"auto"``: the family's default).
    validation_fraction : float
        The share of rows held out, in (0, 1).
    refit : bool
        Run the best setting on all the rows.
    seed : int or None, default None
        Seed of the split and of every run; None draws fresh entropy (the refit then records
        seed None: not reproducible).
    divergence, learning_rate, step_size, iter_sampling, iter_warmup, thin
        As for :func:`rob_ula`, for every run.
    chains, inits, init_scale, metric, gradient_total, oracle
        As for :func:`rob_ula`, for every run.
    log_density : bool, default True
        The refit's: compute each kept draw's log density (the grid's runs do not).
    show_progress : bool, default False
        Show every run's progress bar.

    Returns
    -------
    RobULATuning
    """
    model = require_model(model, "rs.tune_rob_ula")
    contaminations = [float(c) for c in np.atleast_1d(contaminations)]
    if not contaminations or any(not 0 <= c < 0.5 for c in contaminations):
        raise RobustStanInputError(f"contaminations: need values in [0, 0.5), got {contaminations}")
    if isinstance(estimators, str):
        estimators = [estimators]
    if not estimators:
        raise RobustStanInputError("estimators: need at least one estimator")
    if not (isinstance(validation_fraction, float) and 0 < validation_fraction < 1):
        raise RobustStanInputError(f"validation_fraction: must be a number in (0, 1), got {validation_fraction!r}")
    prepared = model.prepare(data, divergence, learning_rate)
    rng = np.random.default_rng(require_seed(seed))
    kept, held = split_rows(model.rows_of_outcome(prepared.stan_data), validation_fraction, rng)
    training = model.with_row_weights(prepared, kept, np.ones(len(kept)), prepared.divergence)
    run_seed = int(rng.integers(2**31))
    options: dict[str, Any] = dict(step_size=step_size, iter_sampling=iter_sampling, iter_warmup=iter_warmup,
                                   thin=thin, chains=chains, inits=inits, init_scale=init_scale, metric=metric,
                                   gradient_total=gradient_total, show_progress=show_progress)
    rows, chosen = [], {}
    for estimator in estimators:
        for contamination in contaminations:
            started = time.perf_counter()
            with warnings.catch_warnings():  # the curve reports each run's R-hat instead
                warnings.simplefilter("ignore", RobustStanWarning)
                fit = rob_ula_prepared(model, training, contamination, oracle, estimator=estimator, seed=run_seed,
                                       log_density=False, **options)
            chosen[fit.settings.estimator] = estimator
            log_lik = model.log_lik_of_rows(fit.raw, prepared, held, quantities_seed(fit))
            log_lik = log_lik.reshape(-1, len(held))
            log_lik = log_lik[np.all(np.isfinite(log_lik), axis=1)]  # a stopped chain's draws are NaN
            pointwise = logsumexp(log_lik, axis=0) - np.log(len(log_lik))
            rows.append({"estimator": fit.settings.estimator, "contamination": contamination,
                         "validation_loglik": float(pointwise.mean()),
                         "validation_loglik_se": float(pointwise.std(ddof=1) / np.sqrt(pointwise.size)),
                         "max_r_hat": float(fit.summary()["r_hat"].max()),
                         "seconds": time.perf_counter() - started})
    curve = pd.DataFrame(rows)
    best = curve.loc[curve["validation_loglik"].idxmax()]
    refitted = None
    if refit:
        refitted = rob_ula_prepared(model, prepared, float(best["contamination"]), oracle,
                                    estimator=chosen[best["estimator"]], seed=run_seed, log_density=log_density,
                                    **options)
        if seed is None:  # run_seed came from fresh entropy: the refit cannot be repeated
            refitted.settings = replace(refitted.settings, seed=None)
    return RobULATuning(float(best["contamination"]), str(best["estimator"]), curve, refitted)
