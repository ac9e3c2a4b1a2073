"""rs.calibrate: a generalized posterior's learning rate or spread calibrated to the sampling
variability of its minimum-loss estimate (:mod:`robust_stan.methods.calibration`)."""

from __future__ import annotations

import numpy as np

from ..building.data import PreparedData, with_switches
from ..common.errors import RobustStanInputError
from ..engines import RawDraws
from ..gradients.oracles import constrained_draws, unconstrained_draws
from ..methods.calibration import curvature_adjusted, lhw_learning_rate, minimum_loss
from ..methods.nuts import run_nuts
from ..results.fit import Fit
from ..results.method_fits import CalibratedFit

METHODS = ("lhw", "sandwich")


def calibrate(fit: Fit, method: str = "lhw"):
    """A NUTS fit of a built-in model (``model.sample``) calibrated; returns a
    :class:`~robust_stan.results.method_fits.CalibratedFit`.

    Both methods use the sandwich matrices J (mean Hessian of the rows' losses) and I (mean
    outer product of their gradients) at the loss's minimum theta_hat, on the unconstrained
    scale (prior left out), from the program's per-example gradients and central differences
    of its total gradient:

    - ``"lhw"``: Lyddon, Holmes and Walker's (2019) learning rate w = tr(J I^-1 J) / tr(J),
      which matches the posterior's information to the estimate's sampling variability; the
      posterior is sampled again at w (the fit's NUTS settings, no new compile);
    - ``"sandwich"``: the fit's own draws mapped about their mean so that their covariance is
      J^-1 I J^-1 / N (Ribatet et al. 2012's curvature adjustment; Shaby 2014), then
      constrained again: no new sampling.
    """
    if not isinstance(fit, Fit) or fit.method != "nuts":
        raise RobustStanInputError(f"fit: rs.calibrate takes a NUTS fit of a built-in model (model.sample), got "
                                   f"{type(fit).__name__}")
    if method not in METHODS:
        raise RobustStanInputError(f"method: must be one of {list(METHODS)}, got {method!r}")
    model = fit.model
    if np.any(np.asarray(fit.stan_data["weights"]) != 1):
        raise RobustStanInputError("fit: has row weights; the sandwich matrices here are for unweighted rows")
    posterior = model.oracle_for(with_switches(fit.stan_data, pointwise=False))
    names = [f"{p.name}_copies" for p in model.spec.parameters]
    draws = unconstrained_draws(posterior, fit.raw.variables, names)
    found = minimum_loss(model, fit.stan_data, draws.reshape(-1, draws.shape[-1]).mean(axis=0))
    curvature, information, covariance = found.curvature, found.information, found.covariance
    matrices = dict(curvature=curvature, information=information, sandwich_covariance=covariance)
    if method == "lhw":
        w = lhw_learning_rate(curvature, information)
        prepared = PreparedData(fit.data, with_switches(fit.stan_data, learning_rate=w), fit.scaling, fit.divergence)
        raw = run_nuts(model, prepared.stan_data, fit.settings, None)
    else:
        w = fit.learning_rate
        prepared = PreparedData(fit.data, fit.stan_data, fit.scaling, fit.divergence)
        variables = constrained_draws(posterior, curvature_adjusted(draws, covariance))
        # the NUTS run's divergences and tree depths still describe these draws; its lp__ does not
        raw = RawDraws(variables, {k: v for k, v in fit.raw.sampler.items() if k != "lp__"})
    calibrated = CalibratedFit(model, raw, prepared, fit.settings, calibration=method, w=w, **matrices)
    calibrated.warn_if_not_converged()
    return calibrated
