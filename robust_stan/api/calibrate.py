"""rs.calibrate: a generalized posterior's learning rate or spread calibrated to the sampling
variability of its minimum-loss estimate (:mod:`robust_stan.methods.selection.calibration`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..building.divergences import KL
from ..common.errors import RobustStanInputError, require_count
from ..engines import NutsSettings, RawDraws
from ..gradients.oracles import constrained_draws, unconstrained_draws
from ..methods.selection.calibration import (
    BootstrapPosterior,
    bootstrap_learning_rate,
    curvature_adjusted,
    lhw_learning_rate,
    minimum_loss,
)
from ..results.fits.calibrated import CalibratedFit
from ..results.fits.mcmc import Fit

METHODS = ("lhw", "sandwich", "bootstrap")


def calibrate(fit: Fit, method: str = "lhw", level: float = 0.9, bootstraps: int = 100, bootstrap_chains: int = 2,
              bootstrap_iter_warmup: int = 300, bootstrap_iter_sampling: int = 500) -> CalibratedFit:
    """A NUTS fit (``model.sample``) of a built-in model or of a program from
    :func:`robust_stan.robustify` with one outcome, calibrated; returns a
    :class:`~robust_stan.results.fits.calibrated.CalibratedFit`.

    ``"lhw"`` and ``"sandwich"`` use the sandwich matrices J (mean Hessian of the rows' losses) and I (mean
    outer product of their gradients) at the loss's minimum theta_hat, on the unconstrained
    scale (prior left out), from the program's per-example gradients and central differences
    of its total gradient:

    - ``"lhw"``: Lyddon, Holmes and Walker's (2019) learning rate w = tr(J I^-1 J) / tr(J),
      which matches the posterior's information to the estimate's sampling variability; the
      posterior is sampled again at w (the fit's NUTS settings, no new compile), each chain
      continuing from the last draw of the fit's own chain, so that it stays in the fit's mode;
    - ``"sandwich"``: the fit's own draws mapped about theta_hat, theta_hat + C (theta - theta_hat),
      so that their covariance is J^-1 I J^-1 / N (Ribatet et al. 2012's curvature adjustment;
      Shaby 2014), then constrained again: no new sampling;
    - ``"bootstrap"``: Syring and Martin's (2019) calibration: w such that the ``level`` credible
      sets (ellipsoids on the unconstrained scale) of the w-posteriors of ``bootstraps``
      resamples (multinomial counts as row weights: no compile) hold theta_hat in a share
      ``level`` of them. Each resample is one NUTS fit (``bootstrap_chains`` x (``bootstrap_iter_warmup`` +
      ``bootstrap_iter_sampling``), started from the fit's last draws) reweighted
      by PSIS to other w, and fitted again where k-hat exceeds 0.7; w by bisection on log w to
      1%. Then NUTS at w, as for ``"lhw"``. The coverage trace is ``calibrated.bootstrap_trace``.
      Its Monte Carlo error comes from the resamples: the coverage is a share of ``bootstraps``.

    **What it calibrates towards.** All three methods calibrate the posterior's spread about
    theta_hat to the sampling variability of theta_hat itself. So the calibrated intervals cover
    the parameter theta_hat estimates: the minimiser of the chosen loss's expectation over the
    population that produced the data (the population minimiser of the generalized posterior's
    loss), contamination included. They cover the clean-data parameter only where that minimiser
    equals it, that is where the divergence removes the contamination's effect (for gross outliers
    and a suitable beta, approximately). Where no divergence does (random label flips attenuate
    every minimiser), the intervals are calibrated and still miss the clean-data parameter; no
    learning rate fixes a bias.

    Parameters
    ----------
    fit : Fit
        A NUTS fit (``model.sample``) without row weights.
    method : {"lhw", "sandwich", "bootstrap"}
        The calibration (above).
    level : float
        For ``"bootstrap"``: the credibility whose sets should hold theta_hat in that share of
        the resamples, in (0, 1).
    bootstraps : int
        For ``"bootstrap"``: the number of resamples (at least 2).
    bootstrap_chains, bootstrap_iter_warmup, bootstrap_iter_sampling : int
        For ``"bootstrap"``: each resample's NUTS chains, warm-up and kept iterations per chain
        (CmdStanPy's ``chains``, ``iter_warmup`` and ``iter_sampling``).

    Returns
    -------
    CalibratedFit
        The calibrated draws, with ``w``, the sandwich matrices and, for ``"bootstrap"``,
        ``bootstrap_trace``.
    """
    if not isinstance(fit, Fit) or fit.method != "nuts":
        raise RobustStanInputError(f"fit: rs.calibrate takes a NUTS fit (model.sample), got {type(fit).__name__}")
    if method not in METHODS:
        raise RobustStanInputError(f"method: must be one of {list(METHODS)}, got {method!r}")
    if not (isinstance(level, float) and 0 < level < 1):
        raise RobustStanInputError(f"level: must lie in (0, 1), got {level!r}")
    model = fit.model
    weights = [o.weights for o in model.observed_outcomes(fit.prepared) if o.weights is not None]
    if len(weights) != 1:
        raise RobustStanInputError("fit: rs.calibrate needs a model with one outcome whose loss is a sum over its rows "
                                   "(a built-in model, or a program from rs.robustify with one outcome)")
    if np.any(weights[0] != 1):
        raise RobustStanInputError("fit: has row weights; the sandwich matrices here are for unweighted rows")
    names = model.raw_parameter_names
    draws = _unconstrained(model, fit.stan_data, fit.raw.variables, names)
    target = model.langevin_target(model.switched(fit.stan_data, learning_rate=1.0, pointwise=False))
    found = minimum_loss(target.posterior, target.prior, target.per_example,
                         draws.reshape(-1, draws.shape[-1]).mean(axis=0))
    curvature, information, covariance = found.curvature, found.information, found.covariance
    matrices = dict(curvature=curvature, information=information, sandwich_covariance=covariance)
    trace = None
    if method == "sandwich":
        w = fit.learning_rate
        prepared = fit.prepared
        posterior = model.oracle_for(model.switched(fit.stan_data, pointwise=False))
        variables = constrained_draws(posterior, curvature_adjusted(draws, covariance, found.theta_hat))
        # the NUTS run's divergences and tree depths still describe these draws; its lp__ does not
        raw = RawDraws(variables, {k: v for k, v in fit.raw.sampler.items() if k != "lp__"})
    else:
        if method == "lhw":
            w = lhw_learning_rate(curvature, information)
        else:
            settings = NutsSettings(require_count("bootstrap_chains", bootstrap_chains),
                                    require_count("bootstrap_iter_warmup", bootstrap_iter_warmup, 0),
                                    require_count("bootstrap_iter_sampling", bootstrap_iter_sampling, 2),
                                    seed=fit.settings.seed, show_progress=False)
            w, trace = _bootstrap_w(fit, found.theta_hat, names, settings, level,
                                    require_count("bootstraps", bootstraps, 2))
        prepared = replace(fit.prepared, stan_data=model.switched(fit.stan_data, learning_rate=w))
        raw = model.nuts_draws(prepared.stan_data, fit.settings, _continuing(fit, names, fit.settings.chains))
    calibrated = CalibratedFit(model, raw, prepared, fit.settings, calibration=method, w=w, bootstrap_trace=trace,
                               **matrices)
    calibrated.warn_if_not_converged()
    return calibrated


def _unconstrained(model, stan_data: dict, variables: dict, names: list[str]) -> np.ndarray:
    """The draws (chains, draws, d) on the unconstrained scale. Each draw is unconstrained by a new
    instance of the program, which runs its transformed data, so this is done under KL: the
    parameters' constraints do not depend on the divergence, and KL skips the integral tables
    that the transformed data of a beta or gamma poisson model would build for every draw."""
    return unconstrained_draws(model.oracle_for(model.switched(stan_data, pointwise=False, divergence=KL())),
                               variables, names)


def _continuing(fit: Fit, names: list[str], chains: int) -> list[dict]:
    """Starts for a new NUTS run on the same loss: chain c from the last draw of the fit's chain c (of
    chain c mod the fit's chains). A robust posterior can have a second mode that holds almost none of
    the mass (one following high-leverage outliers); NUTS cannot leave the basin it starts in, so from
    dispersed starts a run at another w can settle there, where the fit being calibrated is not."""
    have = fit.raw.variables[names[0]].shape[0]
    return [{name: fit.raw.variables[name][c % have, -1] for name in names} for c in range(chains)]


def _bootstrap_w(fit: Fit, theta_hat: np.ndarray, names: list[str], settings: NutsSettings, level: float,
                 bootstraps: int) -> tuple[float, list[dict]]:
    """Syring and Martin's w for ``fit``'s model and data (see :func:`calibrate`)."""
    model = fit.model
    n = model.rows_of_outcome(fit.stan_data)
    counts = np.random.default_rng(settings.seed).multinomial(n, np.full(n, 1.0 / n), size=bootstraps)

    def refit(b: int, w: float) -> BootstrapPosterior:
        stan_data = model.switched(fit.stan_data, learning_rate=w, weights=counts[b], pointwise=False)
        raw = model.nuts_draws(stan_data, replace(settings, seed=settings.seed + 1 + b),
                               _continuing(fit, names, settings.chains))
        resample = Fit(model, raw, replace(fit.prepared, stan_data=stan_data), settings)
        total_loss = (resample.generated_quantities_at()["robust_loss"] * counts[b]).sum(axis=-1)
        draws = _unconstrained(model, stan_data, raw.variables, names)
        return BootstrapPosterior(draws.reshape(-1, draws.shape[-1]), total_loss.ravel(), w)

    start = fit.learning_rate
    return bootstrap_learning_rate(theta_hat, [refit(b, start) for b in range(bootstraps)], refit, level, start)
