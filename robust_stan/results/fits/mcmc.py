"""The NUTS fit, the base of every method's fit: draws in the user's units, summaries, ArviZ
output, outlier scores and LOO, for built-in models and your own programs alike."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ...building.data import PreparedData
from ...building.divergences import Divergence, DivergenceCode
from ...common.errors import RobustStanInputError
from ...common.seeds import fresh_seed
from ...engines import RawDraws
from ..arviz_output import draws_dataset, native_inference_data
from ..convergence import summary_table, warn_if_poor_convergence
from ..loo import (
    MODEL_LOG_LIKELIHOOD,
    MODEL_LOG_LIKELIHOOD_NOTE,
    generalized_log_ratios,
    generalized_loo,
    ordinary_loo_applies,
    require_loo_draws,
)
from ..predictions import Predictions
from .model_view import FittedModel, Outcome

_SAMPLE_STATS = {
    "lp__": "lp",
    "accept_stat__": "acceptance_rate",
    "stepsize__": "step_size",
    "treedepth__": "tree_depth",
    "n_leapfrog__": "n_steps",
    "divergent__": "diverging",
    "energy__": "energy",
}


def outlier_scores(log_lik: np.ndarray, divergence, beta: float | None = None) -> pd.Series:
    """Per observation: the posterior mean of p(y_i | theta)^beta (from ``log_lik``, (chains,
    draws, n)) over its median across observations; beta defaults to the divergence's own."""
    if beta is None:
        if divergence is None or divergence.code == DivergenceCode.KL:  # None: a program fitted as written
            raise RobustStanInputError("beta: a KL fit has no beta of its own; pass outlier_scores(beta=...)")
        beta = divergence.param
    if not beta > 0:
        raise RobustStanInputError(f"beta: must be positive, got {beta}")
    log_lik = np.asarray(log_lik)
    mean_power = np.exp(beta * log_lik.reshape(-1, log_lik.shape[-1])).mean(axis=0)
    return pd.Series(mean_power / np.median(mean_power), name="outlier_score").rename_axis("observation")


def sample_stats_dataset(sampler: dict[str, np.ndarray], attrs: dict):
    """The sampler statistics as ArviZ's sample_stats group, with ArviZ's names."""
    return draws_dataset({_SAMPLE_STATS.get(k, k): (v.astype(bool) if k == "divergent__" else v)
                          for k, v in sampler.items()}, attrs=attrs)


def quantities_seed(fit) -> int:
    """Stan's RNG seed for a fit's generated quantities (y_rep): the run's own seed, or for a run
    given none (``settings.seed`` None) one drawn the first time it is needed and kept with the fit."""
    if fit.settings.seed is not None:
        return fit.settings.seed
    if getattr(fit, "_drawn_seed", None) is None:
        fit._drawn_seed = fresh_seed()
    return fit._drawn_seed


def nuts_diagnostics(sampler: dict[str, np.ndarray], settings) -> dict:
    """Divergent transitions and tree-depth hits of a NUTS run (empty for other samplers)."""
    if "divergent__" not in sampler:
        return {}
    return {"divergent": int(sampler["divergent__"].sum()),
            "max_treedepth_hits": int((sampler["treedepth__"] >= settings.max_treedepth).sum())}


_POINTWISE_KINDS = ("log_lik", "robust_loss", "y_rep")


class Fit:
    """Result of NUTS on a model's posterior: :meth:`robust_stan.Model.sample` and
    :meth:`robust_stan.StanProgramModel.sample` (the other methods' fits share its methods).

    Parameters are reported in the outcome's own units. The sampler writes the parameters only;
    the per-observation quantities ``log_lik``, ``robust_loss`` and ``y_rep`` are computed from
    the draws the first time :meth:`draws`, :meth:`to_arviz`, :meth:`outlier_scores` or the
    attribute itself asks for them, in one engine call per chain (Stan's standalone generated
    quantities), and kept. A built-in model's outcome is ``y``; a program's outcomes are its
    robustified outcomes, or for a program as written its own ``log_lik`` generated quantity.

    Parameters
    ----------
    model : Model or StanProgramModel
        The model that was run (any ``FittedModel``).
    raw : RawDraws
        The engine-neutral output; ``raw.backend`` is the engine's own object.
    prepared : PreparedData
        The data and settings the run used.
    settings : NutsSettings or another method's settings
        The run's settings, recorded in :meth:`to_arviz`'s attributes.
    """

    method = "nuts"

    def __init__(self, model: FittedModel, raw: RawDraws, prepared: PreparedData, settings):
        self.model: Any = model  # the model's own methods beyond FittedModel serve the methods that read fits
        self.raw = raw
        self.prepared = prepared
        self.data = prepared.data
        self.stan_data = prepared.stan_data
        self.scaling = prepared.scaling
        self.divergence = prepared.divergence
        self.learning_rate = prepared.learning_rate
        self.settings = settings
        self.parameter_names = list(model.parameter_names)
        self.posterior = model.posterior_draws(raw, prepared)
        self._pointwise: dict[str, dict[str, np.ndarray]] | None = None

    # False for a fit whose rows were held in partitions elsewhere (its data here: the first row)
    rows_here = True

    def _require_rows_here(self) -> None:
        if not self.rows_here:
            raise RobustStanInputError("fit: the rows of this fit were held in partitions on a cluster, so "
                                       "log_lik, robust_loss, y_rep and outlier scores are not computed here; take "
                                       "the draws (fit.posterior) to the rows instead")

    # -- per-observation quantities, on demand ----------------------------------------
    def _pointwise_quantities(self) -> dict[str, dict[str, np.ndarray]]:
        """log_lik, robust_loss and y_rep of every draw by outcome, computed the first time one is
        asked for (one engine call per chain) and then kept."""
        self._require_rows_here()
        if self._pointwise is None:
            self._pointwise = self.model.pointwise_draws(self.raw, self.prepared, quantities_seed(self))
        return self._pointwise

    def _outcome_name(self, kind: str, outcome: str | None) -> str:
        """``outcome`` checked against the outcomes that have ``kind`` (default: the only one)."""
        by_outcome = self._pointwise_quantities()[kind]
        if not by_outcome:
            raise RobustStanInputError(f"fit: there is no {kind}: the program has no log_lik generated quantity "
                                       "and no robustified likelihood" if kind != "y_rep" else
                                       "fit: there is no y_rep: the program has no generated quantity "
                                       "<outcome>_rep of its outcome's shape")
        if outcome is None:
            if len(by_outcome) != 1:
                raise RobustStanInputError(f"outcome: the fit has several outcomes {sorted(by_outcome)}; name one "
                                           f"(fit.draws('{kind}_<outcome>'))")
            return next(iter(by_outcome))
        if outcome not in by_outcome:
            raise RobustStanInputError(f"outcome: {outcome!r} is not one of {sorted(by_outcome)}")
        return outcome

    def _one(self, kind: str, outcome: str | None = None) -> np.ndarray:
        return self._pointwise_quantities()[kind][self._outcome_name(kind, outcome)]

    def generated_quantities_at(self, divergence: Divergence | None = None, y_score: bool = False) -> dict:
        """The per-observation generated quantities at every draw, computed afresh.

        They are on the program's own scale of y (standardised where a built-in model
        standardises); one engine call per chain, nothing is kept.

        Parameters
        ----------
        divergence : Divergence or None, default None
            The divergence of ``robust_loss``; None is the fit's own.
        y_score : bool, default False
            Also d/dy and d^2/dy^2 of log p (built-in families that have them).

        Returns
        -------
        dict
            ``log_lik``, ``robust_loss`` (a built-in model's also ``y_rep`` and the y-derivatives),
            each (chains, draws, N).
        """
        self._require_rows_here()
        return self.model.generated_quantities(self.raw, self.prepared, quantities_seed(self), divergence, y_score)

    @property
    def log_lik(self) -> np.ndarray:
        """log p(y_i | theta) of every draw (chains, draws, N) of the one outcome, computed on first
        use (several outcomes: ``fit.draws("log_lik_<outcome>")``)."""
        return self._one("log_lik")

    @property
    def robust_loss(self) -> np.ndarray:
        """The loss l_i(theta) of every draw under the fit's divergence (chains, draws, N), of the one
        robust outcome (several: ``fit.draws("robust_loss_<outcome>")``)."""
        return self._one("robust_loss")

    @property
    def y_rep(self) -> np.ndarray:
        """Posterior predictive draws (chains, draws, N, ...) of the one outcome: a built-in model's
        chain c takes its noise from Stan's RNG for (seed, c + 1), as in CmdStan's standalone
        generate_quantities; a program's are its own ``<outcome>_rep`` generated quantity."""
        return self._one("y_rep")

    # -- access -----------------------------------------------------------------
    def draws(self, name: str) -> np.ndarray:
        """Draws of one variable.

        Parameters
        ----------
        name : str
            A variable of the posterior group (a program's parameters, transformed parameters and
            generated quantities), ``"log_lik"``, ``"robust_loss"`` or ``"y_rep"`` of the one outcome,
            the same followed by ``_<outcome>``, or a sampler statistic.

        Returns
        -------
        numpy.ndarray
            Shape (chains, draws, ...).
        """
        if name in self.posterior:
            return self.posterior[name]
        for kind in _POINTWISE_KINDS:
            if name == kind:
                return self._one(kind)
            if name.startswith(kind + "_") and self.rows_here and name[len(kind) + 1:] in self._pointwise_quantities()[kind]:
                return self._one(kind, name[len(kind) + 1:])
        if name in self.raw.sampler:
            return self.raw.sampler[name]
        raise RobustStanInputError(f"name: no variable {name!r}; the posterior has {sorted(self.posterior)}")

    def summary(self, percentiles: tuple[float, ...] = (5, 50, 95)) -> pd.DataFrame:
        """Summary table of the scalar parameters.

        Parameters
        ----------
        percentiles : tuple of float, default (5, 50, 95)
            The percentiles reported.

        Returns
        -------
        pandas.DataFrame
            Per scalar parameter (a program's parameters block; not its transformed parameters or
            generated quantities; a formula model's group-level effects and correlations in place of
            their non-centred parameters), labelled by the formula's or X's column names and the
            group levels where the model has them (``b[x1]``, ``u_g[Intercept, a]``): mean, sd, the
            percentiles, MCSE of the mean, bulk and tail ESS, and R-hat.
        """
        labels = self.model.summary_labels(self.posterior, self.prepared)
        return summary_table({name: self.posterior[name] for name in labels}, percentiles, labels)

    def diagnostics(self) -> dict:
        """Divergent transitions, tree-depth hits and the largest R-hat.

        Returns
        -------
        dict
            The diagnostics by name.
        """
        return {**nuts_diagnostics(self.raw.sampler, self.settings), "max_r_hat": float(self.summary()["r_hat"].max())}

    def warn_if_not_converged(self) -> None:
        """A RobustStanWarning when any parameter has R-hat above 1.01 or a bulk or tail ESS
        below 100 (Vehtari et al. 2021's limits), or its draws are not all finite."""
        warn_if_poor_convergence(self.summary(), self.method, stacklevel=4)

    def outlier_scores(self, beta: float | None = None, outcome: str | None = None) -> pd.Series:
        """Per observation: posterior mean of p(y_i | theta)^beta relative to its median over observations.

        Low scores mark observations the robust loss down-weights.

        Parameters
        ----------
        beta : float or None, default None
            The power; None is the fit's beta or gamma (a KL fit needs it given).
        outcome : str or None, default None
            The outcome to score; None is the only one.

        Returns
        -------
        pandas.Series
            One score per observation.
        """
        return outlier_scores(self._one("log_lik", outcome), self.divergence, beta)

    def loo(self, outcome: str | None = None):
        """Leave-one-out cross-validation of this posterior by PSIS, one row of ``outcome`` at a time.

        Leaving row i out of pi(theta) propto prior * exp(-w sum_i v_i l_i(theta)) multiplies the
        posterior by exp(w v_i l_i(theta)): these are the importance ratios, smoothed by ArviZ's PSIS,
        and the density predicted is the model's p(y_i | theta). For KL with w = 1 and weights 1 this
        is ``arviz.loo(fit.to_arviz())``; for a program fitted as written it is ordinary PSIS-LOO on its
        ``log_lik``, assuming (as ArviZ does) that the posterior is the prior times the product of
        exp(log_lik). A RobustStanWarning names the rows whose Pareto k-hat is above ArviZ's limit.
        The elpd scores every row, the contaminated ones too, so comparing divergences by elpd
        favours the fit that predicts the outliers: to choose beta or gamma, use
        :func:`robust_stan.select_divergence`.

        Parameters
        ----------
        outcome : str or None, default None
            The outcome whose rows are left out; None is the only one.

        Returns
        -------
        arviz.ELPDData or arviz_stats.ELPDDataLOO
            The installed ArviZ's own ELPD result, with the pointwise elpd and Pareto k;
            ``arviz.compare`` takes it.

        Raises
        ------
        RobustStanInputError
            For draws that are not NUTS draws of the posterior (variational, Rob-ULA, Stan's
            approximations, the sandwich calibration), for the original gamma form, whose loss is
            not a sum over rows, and for a program without a log likelihood.
        """
        require_loo_draws(self.method, self.divergence)
        name = self._outcome_name("log_lik", outcome)
        log_lik = self._one("log_lik", name)
        observed = self._outcomes().get(name)
        if observed is not None and observed.weights is not None:
            ratios = generalized_log_ratios(self._one("robust_loss", name), observed.weights, self.learning_rate)
        else:
            ratios = -log_lik
        return generalized_loo(log_lik, ratios, self.posterior, name,
                               None if observed is None else observed.dims[:1])

    def predict(self, new_data=None, kind: str = "mean", new_levels: str = "error",
                seed: int | None = None) -> Predictions:
        """Predictions of a glm (:func:`robust_stan.glm`) for new rows at every posterior draw: brms'
        ``posterior_epred`` (``kind="mean"``) and ``posterior_predict`` (``kind="response"``).

        With a formula, the new rows' design is built with the training data's encoding (the same
        columns, categories and transformations' state); without one, ``new_data`` is the new X.
        The linear predictor is computed at each draw in the outcome's own units, then the family's
        mean (inverse link; for student_t the location mu; for categorical the K class
        probabilities; under the mislabelling likelihood the observed label's probability), from
        which a response is drawn.

        Parameters
        ----------
        new_data : pandas.DataFrame, mapping, array_like or None, default None
            With a formula, the rows as a data frame holding the columns the formula's right-hand
            side reads (and a binomial's trials); without one, the new X (an array, a DataFrame
            whose columns are matched by name when X had names, or a mapping holding ``"X"`` and
            a binomial's ``"trials"``). None: the training rows.
        kind : {"mean", "response"}, default "mean"
            The mean of y at each draw, or a draw of y.
        new_levels : {"error", "sample"}, default "error"
            A level of a grouping factor the model was not fitted to: refuse it, or draw its effects
            from the group distribution at each posterior draw (a level's rows share its draw).
        seed : int or None, default None
            Seed of the draws of new levels' effects and responses; None draws fresh entropy.

        Returns
        -------
        Predictions
            ``.draws`` (chains, draws, rows; categorical means and multi_normal also classes or
            dimensions) and ``.to_arviz()`` (a ``predictions`` group).

        Raises
        ------
        RobustStanInputError
            If the model is not a glm, ``kind`` or ``new_levels`` is unknown, or the new rows cannot
            be encoded as the training rows (a column missing, a value missing or a category unseen,
            a new group level with ``new_levels="error"``).
        """
        return self.model.predictions(self.posterior, self.prepared, new_data, kind, new_levels, seed)

    def _outcomes(self) -> dict[str, Outcome]:
        return {outcome.name: outcome for outcome in self.model.observed_outcomes(self.prepared)}

    def to_arviz(self):
        """The fit as the installed ArviZ's object.

        Groups: posterior, sample_stats and, with the rows here, log_likelihood, posterior_predictive,
        observed_data and, for a robust loss, constant_data (weights) and robust_loss, with named
        dims. ``log_likelihood`` is there only when ``arviz.loo`` on it is this posterior's LOO (KL
        with learning rate times every weight equal to 1); otherwise log p(y_i | theta) is in the
        group ``model_log_likelihood``, so that ArviZ's loo, waic, compare and loo_pit refuse rather
        than give a wrong number (:meth:`loo` gives this posterior's LOO).

        Returns
        -------
        arviz.InferenceData or xarray.DataTree
            InferenceData on ArviZ 0.x, DataTree on 1.x.
        """
        return native_inference_data(self._arviz_groups())

    def _arviz_groups(self) -> dict:
        """The groups of :meth:`to_arviz` as xarray Datasets, by name (subclasses add theirs)."""
        attrs = {"divergence": repr(self.divergence), "learning_rate": self.learning_rate,
                 "engine": self.model.engine, "inference_library": "robust-stan", "method": self.method}
        groups = {"posterior": draws_dataset(self.posterior, self.model.posterior_dims(self.posterior), attrs,
                                             coords=self.model.posterior_coords(self.prepared)),
                  "sample_stats": sample_stats_dataset(self.raw.sampler, attrs)}
        if not self.rows_here:
            return groups
        outcomes = self._outcomes()
        pointwise = self._pointwise_quantities()
        row_dims = {name: o.dims[:1] for name, o in outcomes.items()}  # one log p(y_i | theta) per row
        value_dims = {name: o.dims for name, o in outcomes.items()}
        weights = {name: o.weights for name, o in outcomes.items() if o.weights is not None}
        if pointwise["log_lik"]:
            if ordinary_loo_applies(self.divergence if weights else None, self.learning_rate, list(weights.values())):
                groups["log_likelihood"] = draws_dataset(pointwise["log_lik"], row_dims, attrs)
            else:
                groups[MODEL_LOG_LIKELIHOOD] = draws_dataset(pointwise["log_lik"], row_dims,
                                                             {**attrs, "note": MODEL_LOG_LIKELIHOOD_NOTE})
        if pointwise["y_rep"]:
            groups["posterior_predictive"] = draws_dataset(pointwise["y_rep"], value_dims, attrs)
        observed = {name: o.values for name, o in outcomes.items() if o.values is not None}
        if observed:
            groups["observed_data"] = draws_dataset(observed, value_dims, attrs, sample_dims=())
        if weights:
            groups["constant_data"] = draws_dataset({outcomes[name].weights_name: v for name, v in weights.items()},
                                                    {outcomes[name].weights_name: row_dims[name] for name in weights},
                                                    attrs, sample_dims=())
            groups["robust_loss"] = draws_dataset({name: pointwise["robust_loss"][name] for name in weights},
                                                  row_dims, attrs)
        return groups

    def __repr__(self) -> str:
        c, d = next(iter(self.posterior.values())).shape[:2]
        return (f"<robust_stan.{type(self).__name__} ({self.method}) {self.divergence!r}, {c} chains x {d} draws, "
                f"parameters {self.parameter_names}>")
