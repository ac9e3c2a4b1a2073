"""The public Model: one generated Stan program, compiled once, and every method on it.

This is where the user's arguments enter: the divergence is converted and the
data are checked here, once per call, and the layers below take the prepared
Stan data.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..building.data import (
    Pointwise,
    PreparedData,
    column_names_of,
    log_density_on_outcome_scale,
    outcome_values,
    prepare_data,
    slice_rows,
    to_original_scale,
    with_switches,
)
from ..building.divergences import Divergence, as_divergence, refuse_original_gamma
from ..building.formulas import formula_data, trials_column
from ..building.group_terms import GroupTermStan
from ..building.spec import FLIP_RATE
from ..common.errors import RobustStanInputError
from ..engines import RawDraws
from ..engines.base import parameter_columns
from ..gradients.per_example import PerExampleGradients
from ..gradients.program import GeneratedProgram
from ..methods.coresets.targets import CoresetTarget
from ..methods.nuts import run_nuts
from ..methods.prediction import (
    PREDICTION_KINDS,
    PREDICTION_NEW_LEVELS,
    group_effects,
    plain_design,
    predict_draws,
)
from ..methods.rob_ula.sampler import LangevinTarget, builtin_target
from ..methods.variational.partitioned import partitioned_variational_target
from ..methods.variational.robust_vi import fit_variational
from ..results.convergence import named_element_labels
from ..results.fits.model_view import Outcome
from ..results.fits.variational import PartitionedVariationalFit
from ..results.predictions import Predictions
from .model_methods import ModelMethods


class Model(ModelMethods, GeneratedProgram):
    """A robust-stan model: its Stan program, and methods that compile it once and reuse it.

    Build one with :func:`robust_stan.location`, :func:`robust_stan.glm` or
    :func:`robust_stan.custom`. ``stan_code`` is the readable program. The divergence, learning
    rate, weights and mode are data, so every method reuses one compiled program.

    Parameters
    ----------
    spec : ModelSpec
        Everything the generated program is made of (the entry points above build it).
    engine : str, default "auto"
        "cmdstan" or "httpstan"; "auto" takes $ROBUST_STAN_ENGINE, else the one installed.
    kind : str, default "custom"
        "location", "glm" or "custom"; a custom program is checked by stanc when built.
    """

    def __repr__(self) -> str:
        return f"<robust_stan.Model {self.spec.title!r}, parameters {self.spec.parameter_names}>"

    # -- data -------------------------------------------------------------------
    def prepare(self, data: Mapping, divergence: Divergence | None = None, learning_rate: float = 1.0,
                weights=None, mode: str = "posterior", batch=None) -> PreparedData:
        """Check and convert the user's data and settings once.

        Parameters
        ----------
        data : mapping or pandas.DataFrame
            The model's data by name (``X``, ``y``, ...), as NumPy arrays, lists or pandas objects
            (an ``X`` given as a DataFrame names the coefficients after its columns); for a model
            built from a formula, a DataFrame (or dict of columns) holding the columns it reads.
        divergence : Divergence or None, default None
            The divergence of the generalized posterior; None is KL (the ordinary likelihood).
        learning_rate : float, default 1.0
            Weight ``w`` on the data term, ``w > 0``.
        weights : array_like or None, default None
            One non-negative weight per observation multiplying its loss; None gives every row 1.
        mode : {"posterior", "per_example", "prior"}, default "posterior"
            What the program computes: the generalized posterior, each observation's loss
            separately, or the prior alone.
        batch : array_like of int or None, default None
            ``mode="per_example"`` only: the 0-based rows to compute; None is every row.

        Returns
        -------
        PreparedData
            The Stan data dict and the outcome's scaling (continuous outcomes of built-in models are
            standardised; see :func:`robust_stan.glm`).

        Raises
        ------
        RobustStanInputError
            If a data value, the weights or a setting is invalid (the message names it).
        """
        divergence = as_divergence(divergence)
        design, columns = None, None
        if self.spec.formula is not None:
            data, design = formula_data(self.spec.formula, data)
            columns = design.columns
        elif self.kind == "glm":  # b is one coefficient per column of X only in a glm
            columns = column_names_of(data)
        stan_data, scaling = prepare_data(self.spec, data, divergence, learning_rate, weights, mode, batch)
        return PreparedData(data, stan_data, scaling, divergence, design, columns)

    def stan_data(self, data: Mapping, divergence: Divergence | None = None, learning_rate: float = 1.0,
                  weights=None, mode: str = "posterior", batch=None) -> dict:
        """The Stan data dict for this program: checked data plus the robust-stan switches.

        Parameters
        ----------
        data, divergence, learning_rate, weights, mode, batch
            The same arguments as :meth:`prepare` takes.

        Returns
        -------
        dict
            Stan data; continuous outcomes of built-in models come back standardised.
        """
        return self.prepare(data, divergence, learning_rate, weights, mode, batch).stan_data

    # -- densities ----------------------------------------------------------------
    def log_density(self, data: Mapping, theta_unconstrained, divergence: Divergence | None = None,
                    learning_rate: float = 1.0, weights=None, mode: str = "posterior", batch=None,
                    jacobian: bool = True) -> float:
        """Log density of the generalized posterior at an unconstrained point.

        Constants of the prior's ``~`` statements are dropped (as in Stan's own log_prob); the loss
        terms are exact.

        Parameters
        ----------
        data, divergence, learning_rate, weights, mode, batch
            As for :meth:`prepare`.
        theta_unconstrained : array_like
            The point, of length :meth:`unconstrained_dimension`.
        jacobian : bool, default True
            Include the log Jacobian of the constraining transform (as Stan's sampler does).

        Returns
        -------
        float
            log pi at the point, up to the prior's dropped constants.
        """
        stan_data = self.stan_data(data, divergence, learning_rate, weights, mode, batch)
        theta = self.check_theta(stan_data, theta_unconstrained)
        return self.compile().log_density(stan_data, theta, jacobian)

    def log_density_gradient(self, data: Mapping, theta_unconstrained, divergence: Divergence | None = None,
                             learning_rate: float = 1.0, weights=None, mode: str = "posterior", batch=None,
                             jacobian: bool = True) -> tuple[float, np.ndarray]:
        """Log density and its gradient with respect to the unconstrained parameters.

        Parameters
        ----------
        data, divergence, learning_rate, weights, mode, batch, theta_unconstrained, jacobian
            As for :meth:`log_density`.

        Returns
        -------
        log_density : float
            As :meth:`log_density`.
        gradient : numpy.ndarray
            Its gradient, one entry per unconstrained parameter.
        """
        stan_data = self.stan_data(data, divergence, learning_rate, weights, mode, batch)
        theta = self.check_theta(stan_data, theta_unconstrained)
        return self.compile().log_density_gradient(stan_data, theta, jacobian)

    def unconstrained_dimension(self, data: Mapping, mode: str = "posterior", batch=None) -> int:
        """Number of unconstrained parameters of the program for these data and mode.

        Parameters
        ----------
        data, mode, batch
            As for :meth:`prepare`.

        Returns
        -------
        int
            The dimension d.
        """
        return self.dimension(self.stan_data(data, mode=mode, batch=batch))

    def per_example_gradients(self, data: Mapping, theta_unconstrained, divergence: Divergence | None = None,
                              batch=None, oracle: str = "auto", strategy: str = "auto") -> np.ndarray:
        """Gradients of each observation's loss l_i at a shared unconstrained point.

        One gradient call of the program's per-example mode, in which every row has its own copy of
        the parameters, gives all rows' gradients. The prior, weights and learning rate are not
        included. For repeated calls on the same data use :meth:`per_example` (prepares the data once).

        Parameters
        ----------
        data, divergence, batch
            As for :meth:`prepare`.
        theta_unconstrained : array_like
            The shared point, of length d.
        oracle : {"auto", "bridgestan", "httpstan"}, default "auto"
            Engine of the gradients.
        strategy : {"auto", "copies", "linear_predictor"}, default "auto"
            "copies" works for any model; "linear_predictor" (built-in glms of the normal, bernoulli,
            binomial, poisson and exponential families) is cheaper; "auto" takes the cheaper one
            available (``benchmarks/per_example_cost.py`` measures both).

        Returns
        -------
        numpy.ndarray
            Shape (rows in ``batch``, d); row i is grad l_i(theta).
        """
        return self.per_example(data, divergence, oracle, strategy).gradients(theta_unconstrained, batch)

    def per_example(self, data: Mapping, divergence: Divergence | None = None, oracle: str = "auto",
                    strategy: str = "auto") -> PerExampleGradients:
        """A reusable per-example gradient evaluator for these data.

        Parameters
        ----------
        data, divergence
            As for :meth:`prepare`.
        oracle, strategy
            As for :meth:`per_example_gradients`.

        Returns
        -------
        PerExampleGradients
            Gradients of each row's loss at any point, the data prepared once.
        """
        return PerExampleGradients(self, self.stan_data(data, divergence), oracle, strategy)

    def oracle(self, data: Mapping, divergence: Divergence | None = None, learning_rate: float = 1.0,
               weights=None, mode: str = "posterior", oracle: str = "auto"):
        """A gradient oracle for the program with these data fixed.

        Parameters
        ----------
        data, divergence, learning_rate, weights, mode
            As for :meth:`prepare`.
        oracle : {"auto", "bridgestan", "httpstan"}, default "auto"
            Engine of the log density and gradients.

        Returns
        -------
        GradientOracle
            Log density and gradient at unconstrained points.
        """
        return self.oracle_for(self.stan_data(data, divergence, learning_rate, weights, mode), oracle)

    # -- what its fits read (robust_stan.results.fits.model_view.FittedModel) -------------------------
    @property
    def parameter_names(self) -> list[str]:
        """The model's parameters, in the order of its program (list of str)."""
        return list(self.spec.parameter_names)

    @property
    def group_terms(self) -> list[GroupTermStan]:
        """The group-level terms of a model built from a formula, in its order (list of GroupTermStan;
        empty without a formula)."""
        formula = self.spec.formula
        if formula is None:
            return []
        return [GroupTermStan(name, term.correlated) for name, term in zip(formula.group_stan_names, formula.groups)]

    def posterior_draws(self, raw: RawDraws, prepared: PreparedData) -> dict[str, np.ndarray]:
        """Each parameter's draws in the outcome's own units; with group-level terms also each term's
        effects ``u_<s> = diag(sd_<s>) L_<s> z_<s>`` (in the outcome's units, from the rescaled sd)
        and, for correlated coefficients, their correlation matrix ``cor_<s> = L_<s> L_<s>'``.

        Parameters
        ----------
        raw : RawDraws
            An engine's output for this model.
        prepared : PreparedData
            The run's data (its scaling).

        Returns
        -------
        dict
            Variable name -> (chains, draws, ...).
        """
        out = {name: to_original_scale(self.spec.rescale.get(name), raw.variables[name], prepared.scaling)
               for name in self.spec.parameter_names}
        for term in self.group_terms:
            s = term.name
            L = out[f"L_{s}"] if term.correlated else None
            out[f"u_{s}"] = group_effects(out[f"z_{s}"], out[f"sd_{s}"], L)
            if L is not None:
                out[f"cor_{s}"] = L @ np.swapaxes(L, -1, -2)
        return out

    def posterior_dims(self, posterior: Mapping[str, np.ndarray]) -> dict[str, list[str]]:
        """ArviZ's dims of the posterior variables that are not ``<name>_dim_<k>``: a glm's ``b`` and
        the rows of its ``B`` are indexed by ``predictor``; a group-level term ``s``'s ``sd_s`` by ``s_coef``, ``z_s`` and
        ``u_s`` by ``s_coef`` and ``s_level``, ``L_s`` and ``cor_s`` by ``s_coef`` and ``s_coef_2``.

        Parameters
        ----------
        posterior : mapping
            The posterior draws by name.

        Returns
        -------
        dict
            Variable name -> dim names.
        """
        dims = {"b": ["predictor"]} if "b" in posterior and np.ndim(posterior["b"]) == 3 else {}
        if self.kind == "glm" and "B" in posterior and np.ndim(posterior["B"]) == 4:  # categorical, multi_normal
            dims["B"] = ["predictor", "B_dim_1"]
        for term in self.group_terms:
            s = term.name
            dims[f"sd_{s}"] = [f"{s}_coef"]
            dims[f"z_{s}"] = dims[f"u_{s}"] = [f"{s}_coef", f"{s}_level"]
            if term.correlated:
                dims[f"L_{s}"] = dims[f"cor_{s}"] = [f"{s}_coef", f"{s}_coef_2"]
        return dims

    def posterior_coords(self, prepared: PreparedData) -> dict[str, list[str]]:
        """Names along the posterior's named dims: ``predictor`` the columns of X (a formula's, or a
        DataFrame's), a group-level term's coefficients and fitted levels.

        Parameters
        ----------
        prepared : PreparedData
            The run's data.

        Returns
        -------
        dict
            Dim name -> names; a dim without names is left out (counted 0..n-1).
        """
        coords: dict[str, list[str]] = {}
        if prepared.column_names is not None:
            coords["predictor"] = list(prepared.column_names)
        if prepared.design is not None:
            for term in prepared.design.groups:
                s = term.stan_name
                coords[f"{s}_coef"] = coords[f"{s}_coef_2"] = list(term.coefficients)
                coords[f"{s}_level"] = list(term.levels[:term.n_fitted_levels])
        return coords

    def summary_labels(self, posterior: Mapping[str, np.ndarray], prepared: PreparedData) -> dict[str, list]:
        """The variables of a fit's summary, in order, each with a label per element (None leaves an
        element out): the parameters by name (``b[x1]``, ``sd_g[Intercept]``), a group-level term's
        effects ``u_g[Intercept, a]`` and correlations ``cor_g[x1, Intercept]`` (below the diagonal)
        in place of its non-centred ``z_g`` and ``L_g``.

        Parameters
        ----------
        posterior : mapping
            The posterior draws by name (from :meth:`posterior_draws`).
        prepared : PreparedData
            The run's data.

        Returns
        -------
        dict
            Variable name -> list of labels (str or None).
        """
        dims, coords = self.posterior_dims(posterior), self.posterior_coords(prepared)
        hidden = {f"z_{t.name}" for t in self.group_terms} | {f"L_{t.name}" for t in self.group_terms}
        after = {(f"L_{t.name}" if t.correlated else f"sd_{t.name}"): t for t in self.group_terms}
        names: list[str] = []
        for name in self.spec.parameter_names:
            if name not in hidden:
                names.append(name)
            if name in after:
                term = after[name]
                names += ([f"cor_{term.name}"] if term.correlated else []) + [f"u_{term.name}"]
        out: dict[str, list] = {}
        for name in names:
            shape = np.shape(posterior[name])[2:]
            labels: list = named_element_labels(name, shape, [coords.get(d) for d in dims.get(name, [])])
            if name.startswith("cor_"):  # a correlation once: below the diagonal
                labels = [label if i > j else None for label, (i, j) in zip(labels, np.ndindex(*shape))]
            out[name] = labels
        return out

    def predictions(self, posterior: Mapping[str, np.ndarray], prepared: PreparedData, new_data=None,
                    kind: str = "mean", new_levels: str = "error", seed: int | None = None) -> Predictions:
        """A glm's predictions for new rows at the draws ``posterior`` (:meth:`robust_stan.Fit.predict`
        says what they are).

        Parameters
        ----------
        posterior : mapping
            A fit's draws in the outcome's own units (:meth:`posterior_draws`).
        prepared : PreparedData
            The fit's data (its design, or X's column names).
        new_data : pandas.DataFrame, mapping, array_like or None, default None
            The new rows; None: the training rows.
        kind : {"mean", "response"}, default "mean"
            The mean of y at each draw, or a draw of y.
        new_levels : {"error", "sample"}, default "error"
            A group level the model was not fitted to: refuse it, or draw its effects.
        seed : int or None, default None
            Seed of the draws; None draws fresh entropy.

        Returns
        -------
        Predictions
            The draws, (chains, draws, rows).

        Raises
        ------
        RobustStanInputError
            As :meth:`robust_stan.Fit.predict`.
        """
        family = self.spec.family
        if self.kind != "glm":
            raise RobustStanInputError(f"fit.predict: predictions for new rows are offered for rs.glm models, not a "
                                       f"{self.kind} model")
        if new_levels not in PREDICTION_NEW_LEVELS:
            raise RobustStanInputError(f"new_levels: must be one of {list(PREDICTION_NEW_LEVELS)}, got {new_levels!r}")
        if kind not in PREDICTION_KINDS:  # before the new rows are encoded (predict_draws checks it again)
            raise RobustStanInputError(f"kind: must be one of {list(PREDICTION_KINDS)}, got {kind!r}")
        formula, trials = self.spec.formula, None
        if new_data is None:  # the training rows
            design = prepared.design if prepared.design is not None else plain_design(
                prepared.stan_data["X"], prepared.column_names, int(prepared.stan_data["P"]))
            trials = prepared.stan_data.get("trials")
        elif formula is not None:
            assert prepared.design is not None and prepared.design.encoding is not None  # prepared from a formula
            design = prepared.design.encoding.design(new_data, new_levels="flag" if new_levels == "sample" else "error",
                                                     argument="new_data")
            if formula.trials is not None:
                trials = trials_column(formula, new_data, "new_data")
        else:
            design = plain_design(new_data, prepared.column_names, int(prepared.stan_data["P"]))
            if "trials" in family.extra_data:
                if not isinstance(new_data, Mapping) or "trials" not in new_data:
                    raise RobustStanInputError("new_data: a binomial glm's predictions need the new rows' trials: "
                                               "pass {'X': X, 'trials': trials}")
                trials = np.asarray(new_data["trials"])
                if trials.shape != (design.X.shape[0],):
                    raise RobustStanInputError(f"new_data: trials must have one entry per row ({design.X.shape[0]}), "
                                               f"got shape {trials.shape}")
        draws = predict_draws(family, design, posterior, kind, np.random.default_rng(seed), trials,
                              FLIP_RATE if FLIP_RATE in self.spec.parameter_names else None)
        outcome = formula.outcome if formula is not None and formula.outcome else "y"
        return Predictions(draws, kind, outcome, design.rows, design.X, design.columns,
                           "class" if family.class_labels else "outcome_dim")

    def observed_outcomes(self, prepared: PreparedData) -> list[Outcome]:
        """The outcome ``y``: its values, dims ``obs`` (and ``outcome_dim``) and the rows' weights.

        Parameters
        ----------
        prepared : PreparedData
            The run's data.

        Returns
        -------
        list of Outcome
            One outcome, ``y``.
        """
        y = outcome_values(prepared.data)
        return [Outcome("y", y, ["obs"] + (["outcome_dim"] if y.ndim > 1 else []),
                        np.asarray(prepared.stan_data["weights"]))]

    def generated_quantities(self, raw: RawDraws, prepared: PreparedData, seed: int,
                             divergence: Divergence | None = None, y_score: bool = False) -> dict:
        """The program's per-observation generated quantities at every draw of ``raw``.

        Parameters
        ----------
        raw : RawDraws
            The draws.
        prepared : PreparedData
            The run's data.
        seed : int
            Stan's RNG seed for ``y_rep``.
        divergence : Divergence or None, default None
            The divergence of ``robust_loss``; None is the run's own.
        y_score : bool, default False
            Also d/dy and d^2/dy^2 of log p (families that have them).

        Returns
        -------
        dict
            ``log_lik``, ``robust_loss``, ``y_rep`` (and the y-derivatives), each (chains, draws, N),
            on the program's own (standardised) scale of y.
        """
        data = with_switches(prepared.stan_data, pointwise=Pointwise.Y_SCORE if y_score else Pointwise.ON,
                             divergence=divergence)
        parameters = parameter_columns(raw.variables, [f"{p.name}_copies" for p in self.spec.parameters])
        return self.compile().generated_quantities(data, parameters, seed, raw.backend)

    def pointwise_draws(self, raw: RawDraws, prepared: PreparedData, seed: int) -> dict[str, dict[str, np.ndarray]]:
        """``log_lik``, ``robust_loss`` and ``y_rep`` of ``y`` at every draw, in the outcome's own units.

        Parameters
        ----------
        raw, prepared, seed
            As for :meth:`generated_quantities`.

        Returns
        -------
        dict
            Kind -> {"y": (chains, draws, N, ...)}.
        """
        computed = self.generated_quantities(raw, prepared, seed)
        y_rep, scaling = computed["y_rep"], prepared.scaling
        if self.spec.standardize and self.spec.family.continuous:  # back in the outcome's units
            y_rep = scaling.center + scaling.scale * y_rep
        return {"log_lik": {"y": log_density_on_outcome_scale(self.spec, computed["log_lik"], scaling)},
                "robust_loss": {"y": computed["robust_loss"]}, "y_rep": {"y": y_rep}}

    def log_lik_of_rows(self, raw: RawDraws, prepared: PreparedData, rows: np.ndarray, seed: int) -> np.ndarray:
        """log p(y_i | theta) of some rows at every draw, in the outcome's own units, whatever rows the
        draws were fitted to (held-out rows are scored this way).

        Parameters
        ----------
        raw : RawDraws
            The draws.
        prepared : PreparedData
            Data of every row; its scaling is the draws' (from :meth:`with_row_weights` of these data).
        rows : numpy.ndarray
            0-based rows of ``prepared``.
        seed : int
            Stan's RNG seed for the generated quantities.

        Returns
        -------
        numpy.ndarray
            (chains, draws, len(rows)), NaN at draws that are not finite.
        """
        of_rows = self.with_row_weights(prepared, np.asarray(rows), np.ones(len(rows)), prepared.divergence)
        return self.pointwise_draws(raw, of_rows, seed)["log_lik"]["y"]

    # -- what the methods ask of a model ----------------------------------------------------
    def langevin_target(self, stan_data: dict, oracle: str = "auto") -> LangevinTarget:
        """What :func:`robust_stan.rob_ula` needs of this model with these Stan data: the
        per-example mode's gradients, the prior-only mode, and weights chosen by data.

        Parameters
        ----------
        stan_data : dict
            From :meth:`stan_data`.
        oracle : {"auto", "bridgestan", "httpstan"}, default "auto"
            Engine of the log density and gradients.

        Returns
        -------
        LangevinTarget
            The target Rob-ULA's sampler runs on.
        """
        return builtin_target(self, stan_data, oracle)

    @property
    def raw_parameter_names(self) -> list[str]:
        """The parameters' names in an engine's draws and in NUTS's starting values: the program's
        ``<name>_copies`` (list of str)."""
        return [f"{p.name}_copies" for p in self.spec.parameters]

    def switched(self, stan_data: dict, *, learning_rate: float | None = None, weights=None,
                 divergence: Divergence | None = None, pointwise: bool | None = None) -> dict:
        """A copy of prepared Stan data with another learning rate, row weights, divergence or
        per-observation output (``robust_stan.building.data.with_switches``): no new compile.

        Parameters
        ----------
        stan_data : dict
            From :meth:`stan_data`.
        learning_rate : float or None, default None
            The new w; None keeps it.
        weights : array_like or None, default None
            The new row weights (checked); None keeps them.
        divergence : Divergence or None, default None
            The new divergence; None keeps it.
        pointwise : bool or None, default None
            Whether the generated quantities compute the per-observation output; None keeps it.

        Returns
        -------
        dict
            The new Stan data.
        """
        return with_switches(stan_data, learning_rate=learning_rate, weights=weights, divergence=divergence,
                             pointwise=pointwise)

    def hscore_refusal(self) -> str | None:
        """Why the H-score (:func:`robust_stan.select_divergence`) is not available, or None.

        Returns
        -------
        str or None
            A sentence, or None where the family has closed-form y-derivatives on the real line.
        """
        family = self.spec.family
        if family.y_score:
            return None
        reason = ("its outcome is discrete" if not family.continuous else
                  "its outcome is a vector" if family.multivariate else
                  "its density does not vanish at the edge of its support (y = 0), where the H-score's "
                  "integration by parts needs it to")
        return f"this model's family is {family.name} and {reason}"

    def rows_of_outcome(self, stan_data: dict) -> int:
        """How many observations these Stan data hold.

        Parameters
        ----------
        stan_data : dict
            From :meth:`stan_data`.

        Returns
        -------
        int
            N.
        """
        return int(stan_data["N"])

    def coreset_target(self, stan_data: dict, divergence: Divergence, inner: str, sampler: str,
                       unit_rows: list[np.ndarray] | None = None) -> CoresetTarget:
        """What :func:`robust_stan.coreset` needs of this model with these Stan data.

        Parameters
        ----------
        stan_data : dict
            From :meth:`stan_data`.
        divergence : Divergence
            The divergence of the coreset's target posterior.
        inner : {"beta", "classical"}
            The loss inside the coreset objective.
        sampler : {"laplace", "nuts", "exact"}
            How a weighted posterior is drawn from.
        unit_rows : list of numpy.ndarray or None, default None
            Rows of each unit when a unit is a group of rows; None: one unit per row.

        Returns
        -------
        CoresetTarget
            The target the coreset construction runs on.
        """
        return CoresetTarget(self, stan_data, divergence, inner, sampler, unit_rows)

    def with_row_weights(self, prepared: PreparedData, rows: np.ndarray, weights: np.ndarray,
                         divergence: Divergence) -> PreparedData:
        """The posterior of ``rows`` alone, with ``weights``: the data cut to those rows.

        Parameters
        ----------
        prepared : PreparedData
            The data of every row.
        rows : numpy.ndarray
            0-based rows of ``prepared``.
        weights : numpy.ndarray
            Their weights.
        divergence : Divergence
            The loss of the new posterior.

        Returns
        -------
        PreparedData
            Ready for the program, with the original scaling.
        """
        stan_data = with_switches(slice_rows(self.spec, prepared.stan_data, rows), weights=weights,
                                  divergence=divergence)
        design = prepared.design.take(rows) if prepared.design is not None else None  # predict() on these rows
        return PreparedData({"y": outcome_values(prepared.data)[rows]}, stan_data, prepared.scaling, divergence,
                            design, prepared.column_names)

    def nuts_draws(self, stan_data: dict, settings, chain_inits: list[dict] | None) -> RawDraws:
        """NUTS draws of the posterior with these Stan data (``robust_stan.methods.nuts.run_nuts``).

        Parameters
        ----------
        stan_data : dict
            From :meth:`stan_data`.
        settings : NutsSettings
            The run's settings.
        chain_inits : list of dict or None
            Starting values per chain (:meth:`chain_inits`).

        Returns
        -------
        RawDraws
            The engine's draws.
        """
        return run_nuts(self, stan_data, settings, chain_inits)

    def variational_on_partitions(self, data, divergence, learning_rate, weights, family, method, draws, seed,
                                  show_progress, inits, cluster, options) -> PartitionedVariationalFit:
        """:meth:`variational` on rows held in partitions (its arguments, ``options`` as a dict).

        Parameters
        ----------
        data, divergence, learning_rate, weights, family, method, draws, seed, show_progress, inits, cluster
            As for :meth:`variational`.
        options : dict
            :meth:`variational`'s ``**options``.

        Returns
        -------
        PartitionedVariationalFit
            Draws from q, without per-observation quantities.
        """
        if method != "robust-stan":
            raise RobustStanInputError(f"method: rows held in partitions need robust-stan's driver "
                                       f"(method='robust-stan'), got {method!r}")
        if weights is not None:
            raise RobustStanInputError("weights: not with rows held in partitions (give each partition's rows "
                                       "their weights by repeating or leaving out rows)")
        divergence = as_divergence(divergence)
        refuse_original_gamma(divergence, "divergence", "the partitions' terms do not add up to it",
                              "use rs.GammaD(gamma) or rows in memory")
        prepared, placed, make_target = partitioned_variational_target(self, data, divergence, learning_rate, cluster)
        try:
            start = None if inits is None else self.unconstrain_init(inits, prepared.stan_data, prepared.scaling)
            out = fit_variational(self, prepared.stan_data, family=family, draws=draws, seed=seed, start=start,
                                  show_progress=show_progress, target=make_target, **options)
        finally:
            placed.close()
        return PartitionedVariationalFit(self, out.raw, prepared, out.settings, q=out.q, elbo=out.elbo,
                                         elbo_se=out.elbo_se, elbo_trace=out.elbo_trace)


def require_builtin_model(model, method: str, reason: str = "") -> Model:
    """An error naming ``model`` unless it is a built-in :class:`Model`; ``reason`` (a sentence)
    says why ``method`` needs one, where it is more than "not yet"."""
    if isinstance(model, Model):
        return model
    if hasattr(model, "likelihoods"):  # rs.from_stan / rs.robustify
        why = reason or "It does not take a program from rs.from_stan or rs.robustify yet."
        raise RobustStanInputError(
            f"model: {method} works on the built-in models (rs.glm, rs.location, rs.custom). {why} Rebuild the "
            f"model with rs.custom to use {method}.")
    raise RobustStanInputError(f"model: expected a robust_stan Model, got {type(model).__name__}")
