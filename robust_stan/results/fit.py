"""Fit objects: draws on the original scale, summaries, ArviZ output, outlier scores."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from ..building.data import (
    Pointwise,
    PreparedData,
    log_density_on_outcome_scale,
    outcome_values,
    to_original_scale,
    with_switches,
)
from ..building.divergences import Divergence, DivergenceCode
from ..common.errors import RobustStanInputError, RobustStanWarning
from ..common.seeds import fresh_seed
from ..engines import RawDraws
from ..engines.base import parameter_columns
from .arviz_output import draws_dataset, native_inference_data, scalar_diagnostics
from .loo import (
    MODEL_LOG_LIKELIHOOD,
    MODEL_LOG_LIKELIHOOD_NOTE,
    generalized_log_ratios,
    generalized_loo,
    ordinary_loo_applies,
    require_loo_draws,
)

#: Convergence limits of :meth:`Fit.warn_if_not_converged` (Vehtari, Gelman, Simpson, Carpenter
#: and Buerkner 2021): R-hat at most 1.01, bulk and tail ESS at least 100.
R_HAT_LIMIT, ESS_LIMIT = 1.01, 100

# ArviZ's names for Stan's sampler statistics.
_SAMPLE_STATS = {
    "lp__": "lp",
    "accept_stat__": "acceptance_rate",
    "stepsize__": "step_size",
    "treedepth__": "tree_depth",
    "n_leapfrog__": "n_steps",
    "divergent__": "diverging",
    "energy__": "energy",
}


def _element_labels(name: str, shape: tuple[int, ...]) -> list[str]:
    if not shape:
        return [name]
    return [f"{name}[{','.join(str(i + 1) for i in idx)}]" for idx in np.ndindex(*shape)]


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


def summary_table(variables: dict[str, np.ndarray], percentiles: tuple[float, ...] = (5, 50, 95)) -> pd.DataFrame:
    """Per scalar element of ``variables`` (name -> (chains, draws, *shape)): mean, sd, percentiles,
    MCSE of the mean, ESS (bulk, tail) and R-hat."""
    rows = {}
    for name, values in variables.items():
        shape = values.shape[2:]
        flat = values.reshape(values.shape[:2] + (-1,))
        for j, label in enumerate(_element_labels(name, shape)):
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


class Fit:
    """Result of :meth:`Model.sample`: NUTS draws of the generalized posterior.

    Parameters are reported on the original scale of the outcome. The sampler writes the
    parameters only; the per-observation quantities ``log_lik``, ``robust_loss`` and ``y_rep``
    (N numbers per draw each) are computed from the draws the first time :meth:`draws`,
    :meth:`to_arviz`, :meth:`outlier_scores` or the attribute itself asks for them, in one
    engine call per chain (Stan's standalone generated quantities), and kept.

    Parameters
    ----------
    model : Model
        The model that was sampled.
    raw : RawDraws
        The engine-neutral output; ``raw.backend`` is the engine's own object.
    prepared : PreparedData
        The data and settings the run used.
    settings : NutsSettings or another method's settings
        The run's settings, recorded in :meth:`to_arviz`'s attributes.
    """

    method = "nuts"

    def __init__(self, model, raw: RawDraws, prepared: PreparedData, settings):
        self.model = model
        self.raw = raw
        self.stan_data = prepared.stan_data
        self.scaling = scaling = prepared.scaling
        self.divergence = prepared.divergence
        self.learning_rate = prepared.learning_rate
        self.settings = settings
        spec = model.spec
        self.parameter_names = spec.parameter_names
        self.posterior = {
            name: to_original_scale(spec.rescale.get(name), raw.variables[name], scaling)
            for name in self.parameter_names
        }
        self.data = prepared.data
        self.y = outcome_values(prepared.data)
        self._pointwise: dict[str, np.ndarray] | None = None

    # False for a fit whose rows were held in partitions elsewhere (its data here: the first row)
    rows_here = True

    def _require_rows_here(self) -> None:
        if not self.rows_here:
            raise RobustStanInputError("fit: the rows of this fit were held in partitions on a cluster, so "
                                       "log_lik, robust_loss, y_rep and outlier scores are not computed here; take "
                                       "the draws (fit.posterior) to the rows instead")

    # -- per-observation quantities, on demand ----------------------------------------
    def _pointwise_quantities(self) -> dict[str, np.ndarray]:
        """log_lik, robust_loss and y_rep of every draw, computed the first time one is asked for
        (one engine call per chain, Stan's standalone generated quantities) and then kept."""
        self._require_rows_here()
        if self._pointwise is None:
            spec = self.model.spec
            computed = self.generated_quantities_at()
            y_rep = computed["y_rep"]
            if spec.standardize and spec.family.continuous:  # back in the outcome's units
                y_rep = self.scaling.center + self.scaling.scale * y_rep
            self._pointwise = {
                "log_lik": log_density_on_outcome_scale(spec, computed["log_lik"], self.scaling),
                "robust_loss": computed["robust_loss"],
                "y_rep": y_rep,
            }
        return self._pointwise

    def generated_quantities_at(self, divergence: Divergence | None = None, y_score: bool = False) -> dict:
        """The program's per-observation generated quantities at every draw, computed afresh.

        They are on the program's own scale of y (standardised where the model standardises); one
        engine call per chain, nothing is kept.

        Parameters
        ----------
        divergence : Divergence or None, default None
            The divergence of ``robust_loss``; None is the fit's own.
        y_score : bool, default False
            Also d/dy and d^2/dy^2 of log p (families that have them).

        Returns
        -------
        dict
            ``log_lik``, ``robust_loss``, ``y_rep`` (and the y-derivatives), each (chains, draws, N).
        """
        self._require_rows_here()
        data = with_switches(self.stan_data, pointwise=Pointwise.Y_SCORE if y_score else Pointwise.ON, divergence=divergence)
        parameters = parameter_columns(self.raw.variables, [f"{p.name}_copies" for p in self.model.spec.parameters])
        return self.model.compile().generated_quantities(data, parameters, quantities_seed(self), self.raw.backend)

    @property
    def log_lik(self) -> np.ndarray:
        """log p(y_i | theta) of every draw (chains, draws, N), computed on first use."""
        return self._pointwise_quantities()["log_lik"]

    @property
    def robust_loss(self) -> np.ndarray:
        """The loss l_i(theta) of every draw under the fit's divergence (chains, draws, N)."""
        return self._pointwise_quantities()["robust_loss"]

    @property
    def y_rep(self) -> np.ndarray:
        """Posterior predictive draws (chains, draws, N, ...): chain c's noise comes from Stan's RNG
        for (seed, c + 1), as in CmdStan's standalone generate_quantities."""
        return self._pointwise_quantities()["y_rep"]

    # -- access -----------------------------------------------------------------
    def draws(self, name: str) -> np.ndarray:
        """Draws of one variable.

        Parameters
        ----------
        name : str
            A parameter, or "log_lik", "robust_loss" or "y_rep".

        Returns
        -------
        numpy.ndarray
            Shape (chains, draws, ...).
        """
        if name in self.posterior:
            return self.posterior[name]
        if name in ("log_lik", "robust_loss", "y_rep"):
            return self._pointwise_quantities()[name]
        if name in self.raw.sampler:
            return self.raw.sampler[name]
        raise RobustStanInputError(f"name: no variable {name!r}; parameters are {self.parameter_names}")

    def summary(self, percentiles: tuple[float, ...] = (5, 50, 95)) -> pd.DataFrame:
        """Summary table of the scalar parameters.

        Parameters
        ----------
        percentiles : tuple of float, default (5, 50, 95)
            The percentiles reported.

        Returns
        -------
        pandas.DataFrame
            Per scalar parameter: mean, sd, the percentiles, MCSE of the mean, bulk and tail ESS, and
            R-hat.
        """
        return summary_table(self.posterior, percentiles)

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

    def outlier_scores(self, beta: float | None = None) -> pd.Series:
        """Per observation: posterior mean of p(y_i | theta)^beta relative to its median over observations.

        Low scores mark observations the robust loss down-weights.

        Parameters
        ----------
        beta : float or None, default None
            The power; None is the fit's beta or gamma (a KL fit needs it given).

        Returns
        -------
        pandas.Series
            One score per observation.
        """
        return outlier_scores(self.draws("log_lik"), self.divergence, beta)

    def loo(self):
        """Leave-one-out cross-validation of this posterior by PSIS.

        Leaving row i out of pi(theta) propto prior * exp(-w sum_i v_i l_i(theta)) multiplies the
        posterior by exp(w v_i l_i(theta)): these are the importance ratios, smoothed by ArviZ's PSIS,
        and the density predicted is the model's p(y_i | theta). For KL with w = 1 and weights 1 this
        is ``arviz.loo(fit.to_arviz())``. A RobustStanWarning names the rows whose Pareto k-hat is
        above ArviZ's limit. The elpd scores every row, the contaminated ones too, so comparing
        divergences by elpd favours the fit that predicts the outliers: to choose beta or gamma, use
        :func:`robust_stan.select_divergence`.

        Returns
        -------
        arviz.ELPDData or arviz_stats.ELPDDataLOO
            The installed ArviZ's own ELPD result, with the pointwise elpd and Pareto k;
            ``arviz.compare`` takes it.

        Raises
        ------
        RobustStanInputError
            For draws that are not NUTS draws of the posterior (variational, Rob-ULA, Stan's
            approximations, the sandwich calibration) and for the original gamma form, whose loss is
            not a sum over rows.
        """
        require_loo_draws(self.method, self.divergence)
        ratios = generalized_log_ratios(self.robust_loss, self.stan_data["weights"], self.learning_rate)
        return generalized_loo(self.log_lik, ratios, self.posterior, "y", ["obs"])

    def to_arviz(self):
        """The fit as the installed ArviZ's object.

        Groups: posterior, sample_stats, log_likelihood, posterior_predictive, observed_data,
        constant_data (weights) and robust_loss, with named dims. ``log_likelihood`` is there only
        when ``arviz.loo`` on it is this posterior's LOO (KL with learning rate times every weight
        equal to 1); otherwise log p(y_i | theta) is in the group ``model_log_likelihood``, so that
        ArviZ's loo, waic, compare and loo_pit refuse rather than give a wrong number (:meth:`loo`
        gives this posterior's LOO).

        Returns
        -------
        arviz.InferenceData or xarray.DataTree
            InferenceData on ArviZ 0.x, DataTree on 1.x.
        """
        return native_inference_data(self._arviz_groups())

    def _draw_groups(self) -> tuple[dict, dict]:
        """The posterior and sample_stats groups, and the attributes every group carries."""
        dims = {name: [f"{name}_dim_{i}" for i in range(v.ndim - 2)] for name, v in self.posterior.items()}
        if "b" in dims and len(dims["b"]) == 1:
            dims["b"] = ["predictor"]
        attrs = {"divergence": repr(self.divergence), "learning_rate": self.learning_rate,
                 "engine": self.model.engine, "inference_library": "robust-stan", "method": self.method}
        return {"posterior": draws_dataset(self.posterior, dims, attrs),
                "sample_stats": sample_stats_dataset(self.raw.sampler, attrs)}, attrs

    def _arviz_groups(self) -> dict:
        """The groups of :meth:`to_arviz` as xarray Datasets, by name (subclasses add theirs)."""
        groups, attrs = self._draw_groups()
        if not self.rows_here:
            return groups
        obs_dims = {"y": ["obs"] + (["outcome_dim"] if self.y.ndim > 1 else [])}
        row_dims = {"y": ["obs"]}  # log p(y_i | theta): one value per row, whatever y_i's shape
        if ordinary_loo_applies(self.divergence, self.learning_rate, [self.stan_data["weights"]]):
            groups["log_likelihood"] = draws_dataset({"y": self.log_lik}, row_dims, attrs)
        else:
            groups[MODEL_LOG_LIKELIHOOD] = draws_dataset({"y": self.log_lik}, row_dims,
                                                         {**attrs, "note": MODEL_LOG_LIKELIHOOD_NOTE})
        groups["posterior_predictive"] = draws_dataset({"y": self.y_rep}, obs_dims, attrs)
        groups["observed_data"] = draws_dataset({"y": self.y}, obs_dims, attrs, sample_dims=())
        groups["constant_data"] = draws_dataset({"weights": self.stan_data["weights"]}, {"weights": ["obs"]},
                                                attrs, sample_dims=())
        groups["robust_loss"] = draws_dataset({"robust_loss": self.robust_loss}, {"robust_loss": ["obs"]}, attrs)
        return groups

    def __repr__(self) -> str:
        c, d = next(iter(self.posterior.values())).shape[:2]
        return f"<robust_stan.Fit {self.divergence!r}, {c} chains x {d} draws, parameters {self.parameter_names}>"
