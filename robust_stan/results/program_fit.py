"""Fits of your own Stan programs (rs.from_stan, rs.robustify): the same draws(), summary(),
diagnostics() and to_arviz() as the built-in models' fits."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from ..building.data import Pointwise
from ..building.robustify import WEIGHT_PARAMETERS
from ..common.errors import RobustStanInputError, RobustStanWarning
from ..engines import RawDraws
from ..engines.base import parameter_columns
from .arviz_output import draws_dataset, native_inference_data
from .fit import (
    nuts_diagnostics,
    outlier_scores,
    quantities_seed,
    sample_stats_dataset,
    summary_table,
    warn_if_poor_convergence,
)
from .loo import (
    MODEL_LOG_LIKELIHOOD,
    MODEL_LOG_LIKELIHOOD_NOTE,
    generalized_log_ratios,
    generalized_loo,
    ordinary_loo_applies,
    require_loo_draws,
)

# robustify's per-observation quantities and its weight parameters (size 0 outside per-example work)
_POINTWISE_PREFIXES = ("rs_log_lik_", "rs_robust_loss_", WEIGHT_PARAMETERS)


class ProgramFit:
    """Draws of a user program's (generalized) posterior, from NUTS, robust-stan's VI or Rob-ULA.

    ``posterior`` holds every parameter, transformed parameter and generated quantity of the
    program. The log likelihood comes from the program's own ``log_lik`` generated quantity
    (:func:`robust_stan.from_stan`) or, for a robustified program, per outcome from the
    quantities robustify added, computed the first time they are asked for (one engine call per
    chain) and kept; ``robust_loss`` likewise.

    Parameters
    ----------
    model : StanProgramModel
        The program that was run.
    raw : RawDraws
        The engine-neutral output.
    stan_data : dict
        The Stan data of the run.
    settings : NutsSettings or another method's settings
        The run's settings.
    divergence : Divergence
        The divergence of a robustified program (KL as written).
    learning_rate : float
        Weight ``w`` on the data term.
    method : {"nuts", "variational", "rob_ula"}, default "nuts"
        What produced the draws.
    **extras
        Method-specific results kept as attributes (``q``, ``elbo``, ``inverse_metric``, ...).
    """

    def __init__(self, model, raw: RawDraws, stan_data: dict, settings, divergence, learning_rate: float,
                 method: str = "nuts", **extras):
        self.model, self.raw, self.stan_data, self.settings = model, raw, stan_data, settings
        self.divergence, self.learning_rate, self.method = divergence, learning_rate, method
        for name, value in extras.items():
            setattr(self, name, value)
        self.posterior = {name: values for name, values in raw.variables.items()
                          if not name.startswith(_POINTWISE_PREFIXES)}
        self.parameter_names = list(model.parameter_names)
        self._pointwise: dict[str, dict[str, np.ndarray]] | None = None

    # -- per-observation quantities ------------------------------------------------------------
    def _pointwise_quantities(self) -> dict[str, dict[str, np.ndarray]]:
        """{"log_lik": {outcome: (chains, draws, n)}, "robust_loss": {...}}."""
        if self._pointwise is None:
            outcomes = self.model.outcomes
            if outcomes:
                parameters = parameter_columns(self.raw.variables, self.parameter_names)
                data = dict(self.stan_data, rs_pointwise=int(Pointwise.ON))
                computed = self.model.compile().generated_quantities(data, parameters, quantities_seed(self),
                                                                     self.raw.backend)
                self._pointwise = {kind: {y: computed[f"rs_{kind}_{y}"] for y in outcomes}
                                   for kind in ("log_lik", "robust_loss")}
                for y, values in self._pointwise["log_lik"].items():
                    never = np.flatnonzero(np.all(np.isnan(values), axis=(0, 1)))
                    if never.size:
                        rows = [int(r) for r in never[:5]]
                        warnings.warn(f"the likelihood statement of {y!r} never reached rows {rows}"
                                      f"{' ...' if never.size > 5 else ''} (0-based; e.g. a loop over part of the "
                                      "rows): their log_lik is NaN and their weights do nothing", RobustStanWarning,
                                      stacklevel=4)
            elif "log_lik" in self.posterior:
                self._pointwise = {"log_lik": {self._log_lik_name(): self.posterior["log_lik"]}, "robust_loss": {}}
            else:
                self._pointwise = {"log_lik": {}, "robust_loss": {}}
        return self._pointwise

    def _log_lik_name(self) -> str:
        """A program's own ``log_lik`` is named after its outcome when there is one outcome with
        as many rows (as the built-in models' log_likelihood is, and ArviZ's LOO-PIT expects)."""
        observed = self.model.observed
        if len(observed) == 1 and self.posterior["log_lik"].shape[2:] == np.shape(self.stan_data[observed[0]])[:1]:
            return observed[0]
        return "log_lik"

    @property
    def log_lik(self) -> dict[str, np.ndarray]:
        """log p(y_i | theta) of every draw, per outcome: {outcome: (chains, draws, n)}."""
        return self._pointwise_quantities()["log_lik"]

    @property
    def robust_loss(self) -> dict[str, np.ndarray]:
        """The loss l_i(theta) of every draw under the fit's divergence, per outcome (robustified programs)."""
        return self._pointwise_quantities()["robust_loss"]

    # -- access ---------------------------------------------------------------------------------
    def draws(self, name: str) -> np.ndarray:
        """Draws of a program variable, or of ``log_lik_<outcome>`` / ``robust_loss_<outcome>``.

        Parameters
        ----------
        name : str
            The variable.

        Returns
        -------
        numpy.ndarray
            Shape (chains, draws, ...).
        """
        if name in self.posterior:
            return self.posterior[name]
        for kind in ("log_lik", "robust_loss"):
            if name.startswith(kind + "_") and name[len(kind) + 1:] in self._pointwise_quantities()[kind]:
                return self._pointwise_quantities()[kind][name[len(kind) + 1:]]
        if name in self.raw.sampler:
            return self.raw.sampler[name]
        raise RobustStanInputError(f"name: no variable {name!r}; the program has {sorted(self.posterior)}")

    def summary(self, percentiles: tuple[float, ...] = (5, 50, 95)) -> pd.DataFrame:
        """Per scalar variable: mean, sd, percentiles, MCSE of the mean, ESS (bulk, tail) and R-hat.

        Parameters
        ----------
        percentiles : tuple of float, default (5, 50, 95)
            Which percentiles.

        Returns
        -------
        pandas.DataFrame
            One row per scalar variable.
        """
        return summary_table({name: self.posterior[name] for name in self.parameter_names}, percentiles)

    def diagnostics(self) -> dict:
        """Divergent transitions and tree-depth hits (NUTS), and the largest R-hat.

        Returns
        -------
        dict
            The diagnostics by name.
        """
        return {**nuts_diagnostics(self.raw.sampler, self.settings), "max_r_hat": float(self.summary()["r_hat"].max())}

    def warn_if_not_converged(self) -> None:
        """A RobustStanWarning when a parameter has R-hat above 1.01 or a bulk or tail ESS below 100."""
        warn_if_poor_convergence(self.summary(), self.method, stacklevel=4)

    def outlier_scores(self, beta: float | None = None, outcome: str | None = None) -> pd.Series:
        """Per observation of ``outcome``: the posterior mean of p(y_i | theta)^beta over its median.

        Low scores mark observations the robust loss down-weights, as for the built-in fits.

        Parameters
        ----------
        beta : float or None, default None
            The power; None is the fit's beta or gamma (a KL fit needs it given).
        outcome : str or None, default None
            The outcome; None is the only one.

        Returns
        -------
        pandas.Series
            One score per observation.
        """
        outcome = self._outcome(outcome, "outlier_scores", "to score")
        return outlier_scores(self.log_lik[outcome], self.divergence, beta)

    def _outcome(self, outcome: str | None, caller: str, purpose: str) -> str:
        """``outcome`` checked against the fit's log_lik variables (default: the only one)."""
        log_lik = self.log_lik
        if not log_lik:
            raise RobustStanInputError(f"{caller}: the program has no log_lik generated quantity and no "
                                       f"robustified likelihood, so there is no p(y_i | theta) {purpose}")
        if outcome is None:
            if len(log_lik) != 1:
                raise RobustStanInputError(f"outcome: the fit has several outcomes {sorted(log_lik)}; name one")
            outcome = next(iter(log_lik))
        if outcome not in log_lik:
            raise RobustStanInputError(f"outcome: {outcome!r} is not one of {sorted(log_lik)}")
        return outcome

    def _ordinary_loo_applies(self) -> bool:
        """Whether ArviZ's loo on log_lik is this posterior's LOO (see :func:`.loo.ordinary_loo_applies`)."""
        outcomes = self.model.outcomes
        return ordinary_loo_applies(self.divergence if outcomes else None, self.learning_rate,
                                    [self.stan_data[f"rs_weights_{y}"] for y in outcomes])

    def _log_lik_dims(self) -> dict[str, list[str]]:
        """Names of the observation axes of each log_lik variable that belongs to an observed outcome."""
        return {y: [f"{y}_obs"] for y in self.log_lik if y in self.model.observed}

    def loo(self, outcome: str | None = None):
        """Leave-one-out cross-validation of this posterior by PSIS, one row of ``outcome`` at a time.

        For a robustified program the importance ratios are exp(w v_i l_i(theta)) and the density
        predicted is p(y_i | theta), as :meth:`robust_stan.Fit.loo` explains. For a program fitted as
        written it is ordinary PSIS-LOO on its ``log_lik``, as ``arviz.loo(fit.to_arviz())`` is,
        assuming (as ArviZ does) that the posterior is the prior times the product of exp(log_lik).

        Parameters
        ----------
        outcome : str, optional
            The outcome whose rows are left out (needed when there are several).

        Returns
        -------
        arviz.ELPDData or arviz_stats.ELPDDataLOO
            The installed ArviZ's own ELPD result; ``arviz.compare`` takes it.

        Raises
        ------
        RobustStanInputError
            For draws other than NUTS's, for the original gamma form and for a program without a log
            likelihood.
        """
        require_loo_draws(self.method, self.divergence)
        outcome = self._outcome(outcome, "loo", "to predict")
        log_lik = self.log_lik[outcome]
        if self.model.outcomes:
            ratios = generalized_log_ratios(self.robust_loss[outcome], self.stan_data[f"rs_weights_{outcome}"],
                                            self.learning_rate)
        else:
            ratios = -log_lik
        return generalized_loo(log_lik, ratios, self.posterior, outcome, self._log_lik_dims().get(outcome))

    def to_arviz(self):
        """The fit as the installed ArviZ's object.

        Groups: posterior, sample_stats and, where the program has them, log_likelihood,
        observed_data (the data variables of its likelihood statements), posterior_predictive (from
        a generated quantity ``<outcome>_rep`` of the outcome's shape) and, for a robustified program,
        constant_data (weights) and robust_loss. As for the built-in models, log p(y_i | theta) is in
        ``model_log_likelihood`` instead of ``log_likelihood`` when ArviZ's loo on it would not be
        this posterior's LOO; :meth:`loo` gives it.

        Returns
        -------
        arviz.InferenceData or xarray.DataTree
            InferenceData on ArviZ 0.x, DataTree on 1.x.
        """
        attrs = {"divergence": repr(self.divergence), "learning_rate": self.learning_rate,
                 "engine": self.model.engine, "inference_library": "robust-stan", "method": self.method}
        groups = {
            "posterior": draws_dataset(self.posterior, None, attrs),
            "sample_stats": sample_stats_dataset(self.raw.sampler, attrs),
        }
        outcomes, observed_names = self.model.outcomes, self.model.observed
        dims = {y: [f"{y}_obs"] for y in observed_names}
        if self.log_lik:
            if self._ordinary_loo_applies():
                groups["log_likelihood"] = draws_dataset(self.log_lik, self._log_lik_dims(), attrs)
            else:
                groups[MODEL_LOG_LIKELIHOOD] = draws_dataset(self.log_lik, self._log_lik_dims(),
                                                             {**attrs, "note": MODEL_LOG_LIKELIHOOD_NOTE})
        if observed_names:
            observed = {y: np.asarray(self.stan_data[y]) for y in observed_names}
            observed_dims = {y: [f"{y}_obs"] + [f"{y}_dim_{i}" for i in range(1, observed[y].ndim)]
                             for y in observed_names}
            groups["observed_data"] = draws_dataset(observed, observed_dims, attrs, sample_dims=())
            replicated = {y: self.posterior[f"{y}_rep"] for y in observed_names
                          if f"{y}_rep" in self.posterior and self.posterior[f"{y}_rep"].shape[2:] == observed[y].shape}
            if replicated:  # the program's own <outcome>_rep draws, named as ArviZ expects
                groups["posterior_predictive"] = draws_dataset(replicated, observed_dims, attrs)
        if outcomes:  # robustified: the weights and the robust loss
            groups["constant_data"] = draws_dataset(
                {f"weights_{y}": np.asarray(self.stan_data[f"rs_weights_{y}"]) for y in outcomes},
                {f"weights_{y}": [f"{y}_obs"] for y in outcomes}, attrs, sample_dims=())
            groups["robust_loss"] = draws_dataset(self.robust_loss, dims, attrs)
        return native_inference_data(groups)

    def __repr__(self) -> str:
        c, d = next(iter(self.raw.sampler.values())).shape[:2] if self.raw.sampler else (0, 0)
        return (f"<robust_stan.ProgramFit ({self.method}) {self.divergence!r}, {c} chains x {d} draws, "
                f"parameters {self.parameter_names}>")
