"""Your own Stan program in robust-stan: rs.from_stan wraps it as it is, rs.robustify makes its
likelihood robust. Both give a model with the built-in models' methods and fit objects."""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..building.data import (
    Pointwise,
    PreparedData,
    Scaling,
    check_learning_rate,
    check_weights,
    warn_if_the_data_barely_count,
)
from ..building.divergences import Divergence, DivergenceCode, as_divergence, refuse_original_gamma
from ..building.families import family_of_stan_name
from ..building.robustify import (
    SWITCHES,
    WEIGHT_PARAMETERS,
    Likelihood,
    RobustifyError,
    divergence_switches,
    first_per_outcome,
    likelihood_outcomes,
    robustify_program,
    transformed_outcome_size,
)
from ..building.stanc import canonical_program, program_info
from ..common.digest import digest
from ..common.errors import RobustStanInputError, RobustStanWarning, StanCompileError, require_inits
from ..common.resources import LIBRARY_FILE
from ..engines import ProgramSource, RawDraws
from ..engines.base import parameter_columns
from ..gradients.oracles import GradientOracle, make_oracle
from ..gradients.per_example import RowSubsetGradients
from ..gradients.weight_derivatives import WeightDerivativeGradients, second_order_available
from ..methods.coresets.targets import ProgramCoresetTarget
from ..methods.rob_ula.sampler import LangevinTarget, default_estimator
from ..results.convergence import named_element_labels
from ..results.fits.model_view import Outcome
from .model_methods import ModelMethods

# robustify's per-observation quantities and its weight parameters (size 0 outside per-example work)
_POINTWISE_PREFIXES = ("rs_log_lik_", "rs_robust_loss_", WEIGHT_PARAMETERS)

#: The built-in family of each library family a rewrite uses (Likelihood.family is the library's name).
def _read_source(stan_file_or_code) -> tuple[str, str, tuple[str, ...]]:
    """(program text, the name errors use, folders for its #includes)."""
    if isinstance(stan_file_or_code, os.PathLike) or (
            isinstance(stan_file_or_code, str) and "\n" not in stan_file_or_code
            and stan_file_or_code.strip().endswith(".stan")):
        path = Path(stan_file_or_code)
        if not path.is_file():
            raise RobustStanInputError(f"stan_file_or_code: no such Stan file {str(path)!r}")
        return path.read_text(), str(path), (str(path.resolve().parent),)
    if not isinstance(stan_file_or_code, str) or not stan_file_or_code.strip():
        raise RobustStanInputError("stan_file_or_code: give the path of a .stan file or the program's text")
    return stan_file_or_code, "stan_code", ()


def _as_stan_value(name: str, value):
    if hasattr(value, "to_numpy"):  # pandas
        value = value.to_numpy()
    if isinstance(value, (int, float, np.integer, np.floating)):
        return value
    array = np.asarray(value)
    if array.dtype == object:
        raise RobustStanInputError(f"data[{name!r}]: expected numbers, got {type(value).__name__}")
    return array


@dataclass(frozen=True)
class ProgramData(PreparedData):
    """A program's prepared data: as :class:`~robust_stan.building.data.PreparedData`, its learning
    rate the robustified program's ``rs_learning_rate`` (1 for a program as written)."""

    @property
    def learning_rate(self) -> float:
        """The learning rate w of the call (float)."""
        return float(self.stan_data.get("rs_learning_rate", 1.0))


class StanProgramModel(ModelMethods, ProgramSource):
    """A Stan program you wrote, compiled once on either engine, with robust-stan's methods.

    Made by :func:`from_stan` (the program as written) or :func:`robustify` (its likelihood
    statements rewritten into the robust-stan library's weighted losses, with the divergence,
    learning rate and per-observation weights as data, so none of them needs a new compile).

    Parameters
    ----------
    stan_code : str
        The program that is compiled.
    info : dict
        stanc's description of the program (its ``parameters`` and ``inputs``).
    filename : str
        The file the program came from, for messages.
    engine : str, default "auto"
        "cmdstan" or "httpstan"; "auto" takes $ROBUST_STAN_ENGINE, else the one installed.
    likelihoods : tuple of Likelihood, default ()
        What :func:`robustify` rewrote (empty for a program as written).
    observed : list of str or None, default None
        The data variables a likelihood statement is on (ArviZ's observed_data); None: the
        robustified outcomes.

    Attributes
    ----------
    parameter_names : list of str
        The program's parameters.
    data_names : list of str
        The program's data variables, robust-stan's switches excepted.
    outcomes : list of str
        The robustified outcomes.
    """

    def __init__(self, stan_code: str, info: dict, filename: str, engine: str = "auto",
                 likelihoods: tuple[Likelihood, ...] = (), observed: list[str] | None = None):
        super().__init__(stan_code, engine)
        self.filename = filename
        self.likelihoods = likelihoods
        self._likelihood_of = {lik.outcome: lik for lik in first_per_outcome(likelihoods)}
        self.outcomes = list(self._likelihood_of)  # one per outcome, in order
        # the data variables a likelihood statement is on: the robustified outcomes, or for a
        # program as written those found in its model block (its observed_data in ArviZ)
        self.observed = list(observed) if observed is not None else list(self.outcomes)
        # robustify's weight parameters (size 0 unless robust-stan asks) are not the user's
        self.parameter_names = [name for name in info["parameters"] if not name.startswith(WEIGHT_PARAMETERS)]
        self.data_names = [name for name in info["inputs"]
                           if name not in SWITCHES and not name.startswith("rs_weights_")]
        self._dimensions: dict[str, int] = {}
        self._per_example: dict[str, WeightDerivativeGradients] = {}

    @property
    def robustified(self) -> bool:
        """Whether :func:`robustify` rewrote likelihood statements (bool)."""
        return bool(self.likelihoods)

    def __repr__(self) -> str:
        kind = f"robustified, likelihood of {self.outcomes}" if self.robustified else "as written"
        return f"<robust_stan.StanProgramModel {self.filename!r} ({kind}), parameters {self.parameter_names}>"

    # -- data ---------------------------------------------------------------------------------
    def stan_data(self, data: Mapping, divergence: Divergence | None = None, learning_rate: float = 1.0,
                  weights=None) -> dict:
        """The program's data block from the user's data, plus a robustified program's switches.

        Parameters
        ----------
        data : mapping
            The program's data by name (pandas columns and NumPy arrays are fine).
        divergence : Divergence or None, default None
            The robust loss of a robustified program; None is KL.
        learning_rate : float, default 1.0
            Weight ``w`` on the robustified data terms.
        weights : array_like, dict or None, default None
            Per-observation weights: one vector for a single outcome, or {outcome: vector}; None
            gives every row 1.

        Returns
        -------
        dict
            Stan data.

        Raises
        ------
        RobustStanInputError
            If a data variable is missing or a switch is given to a program as written.
        """
        if not isinstance(data, Mapping):
            raise RobustStanInputError(f"data: expected a dict of the data block's variables, got {type(data).__name__}")
        missing = [name for name in self.data_names if name not in data]
        if missing:
            raise RobustStanInputError(f"data: missing {missing}; {self.filename}'s data block declares "
                                       f"{self.data_names}")
        out = {name: _as_stan_value(name, data[name]) for name in self.data_names}
        divergence = as_divergence(divergence)
        if not self.robustified:
            if divergence.code != DivergenceCode.KL or learning_rate != 1.0 or weights is not None:
                raise RobustStanInputError("divergence, learning_rate, weights: this program is used as written "
                                           "(rs.from_stan); make its likelihood robust with rs.robustify")
            return out
        out.update(divergence_switches(divergence), rs_learning_rate=check_learning_rate(learning_rate),
                   rs_pointwise=int(Pointwise.OFF), rs_weights_are_parameters=0)
        out.update(self._weights(out, weights))
        for y, likelihood in self._likelihood_of.items():  # as the built-in models warn, from the same pilot fit
            values = self._observed_values(y, out)
            if values is not None:  # None: computed in transformed data
                warn_if_the_data_barely_count(family_of_stan_name(likelihood.family), values.astype(float),
                                              out[f"rs_weights_{y}"], out["rs_learning_rate"], divergence, stacklevel=4)
        return out

    def prepare(self, data: Mapping, divergence: Divergence | None = None, learning_rate: float = 1.0,
                weights=None) -> PreparedData:
        """Check and convert the user's data and settings once, as :meth:`robust_stan.Model.prepare` does.

        Parameters
        ----------
        data, divergence, learning_rate, weights
            As for :meth:`stan_data`.

        Returns
        -------
        ProgramData
            The Stan data; the scaling is the identity (a program's outcome is fitted in its own units).
        """
        return ProgramData(data, self.stan_data(data, divergence, learning_rate, weights), Scaling(),
                           as_divergence(divergence))

    def _size_of(self, y: str, data: Mapping) -> int:
        """The number of observations of outcome ``y`` in these data (an outcome declared in transformed
        data: its declared size, computed from the data)."""
        rows = self._likelihood_of[y].rows
        return transformed_outcome_size(rows, data) if rows else len(np.atleast_1d(data[y]))

    def _observed_values(self, y: str, stan_data: dict) -> np.ndarray | None:
        """The values of observed outcome ``y`` with one observation per leading row: a scalar or a
        multivariate family's vector as one row, a two-dimensional outcome's elements flattened row
        after row (as its weights and log_lik); None for an outcome computed in transformed data."""
        if y not in stan_data:
            return None
        values = np.atleast_1d(stan_data[y])
        likelihood = self._likelihood_of.get(y)
        if likelihood is not None and likelihood.elements_are_rows:
            return values.reshape(-1)
        if likelihood is not None and likelihood.one_observation:
            return values.reshape(1, *values.shape)
        return values

    def _weights(self, data: dict, weights) -> dict:
        sizes = {y: self._size_of(y, data) for y in self.outcomes}
        if weights is None:
            given = {}
        elif isinstance(weights, Mapping):
            unknown = sorted(set(weights) - set(self.outcomes))
            if unknown:
                raise RobustStanInputError(f"weights: {unknown} are not outcomes; the likelihood is on {self.outcomes}")
            given = dict(weights)
        elif len(self.outcomes) == 1:
            given = {self.outcomes[0]: weights}
        else:
            raise RobustStanInputError(f"weights: the program has several outcomes {self.outcomes}; give "
                                       "{outcome: weights}")
        return {f"rs_weights_{y}": check_weights(given[y], sizes[y]) if y in given else np.ones(sizes[y])
                for y in self.outcomes}

    # -- densities ------------------------------------------------------------------------------
    def dimension(self, stan_data: dict) -> int:
        """Number of unconstrained parameters with these Stan data.

        Parameters
        ----------
        stan_data : dict
            The program's Stan data (from :meth:`stan_data`).

        Returns
        -------
        int
            The dimension d.
        """
        key = digest({k: v for k, v in stan_data.items() if not k.startswith("rs_")})
        if key not in self._dimensions:
            self._dimensions[key] = self.compile().unconstrained_dimension(stan_data)
        return self._dimensions[key]

    def log_density(self, data: Mapping, theta_unconstrained, divergence: Divergence | None = None,
                    learning_rate: float = 1.0, weights=None, jacobian: bool = True) -> float:
        """Log density at an unconstrained point, as Stan's log_prob (constants of ``~`` dropped).

        Parameters
        ----------
        data, divergence, learning_rate, weights
            As for :meth:`stan_data`.
        theta_unconstrained : array_like
            The point, of length d.
        jacobian : bool, default True
            Add the log absolute Jacobian determinant of the transform to the unconstrained scale.

        Returns
        -------
        float
            The program's target at the point.
        """
        stan_data = self.stan_data(data, divergence, learning_rate, weights)
        return self.compile().log_density(stan_data, self.check_theta(stan_data, theta_unconstrained), jacobian)

    def log_density_gradient(self, data: Mapping, theta_unconstrained, divergence: Divergence | None = None,
                             learning_rate: float = 1.0, weights=None,
                             jacobian: bool = True) -> tuple[float, np.ndarray]:
        """Log density and its gradient with respect to the unconstrained parameters.

        Parameters
        ----------
        data, divergence, learning_rate, weights, theta_unconstrained, jacobian
            As for :meth:`log_density`.

        Returns
        -------
        tuple of (float, numpy.ndarray)
            The log density and its gradient, length d.
        """
        stan_data = self.stan_data(data, divergence, learning_rate, weights)
        return self.compile().log_density_gradient(stan_data, self.check_theta(stan_data, theta_unconstrained), jacobian)

    def oracle_for(self, stan_data: dict, oracle: str = "auto") -> GradientOracle:
        """A gradient oracle for these Stan data.

        Parameters
        ----------
        stan_data : dict
            From :meth:`stan_data`.
        oracle : {"auto", "bridgestan", "httpstan"}, default "auto"
            Which engine computes them.

        Returns
        -------
        GradientOracle
            The program's log density and gradient with these data.
        """
        return make_oracle(self.stan_code, stan_data, self.dimension(stan_data), oracle)

    def per_example_gradients(self, data: Mapping, theta_unconstrained, divergence: Divergence | None = None,
                              batch=None, oracle: str = "auto", strategy: str = "auto") -> np.ndarray:
        """Gradients of each observation's loss l_i at a shared unconstrained point.

        Needs a robustified program with one outcome. Both strategies are exact.

        Parameters
        ----------
        data, divergence
            As for :meth:`stan_data`.
        theta_unconstrained : array_like
            The shared point, of length d.
        batch : array_like of int or None, default None
            The 0-based rows to compute; None is every row.
        oracle : {"auto", "bridgestan", "httpstan"}, default "auto"
            Engine of the gradients for ``strategy="difference"``.
        strategy : {"auto", "mixed", "difference"}, default "auto"
            "mixed" ("auto" where httpstan is installed): the weights become parameters and the
            mixed second derivatives d^2 log pi / (d w_i d theta) = -grad l_i come from d sweeps of
            forward over reverse mode, whatever the number of rows (the first call builds the program
            once more, with second-order autodiff). "difference": by linearity of the target in the
            weights, grad l_i = grad log pi(w = 0) - grad log pi(w = e_i), one gradient call per row.

        Returns
        -------
        numpy.ndarray
            Shape (rows, d); row i is grad l_i(theta).
        """
        self._require_one_outcome("per-example gradients")
        if strategy not in ("auto", "mixed", "difference"):
            raise RobustStanInputError(f"strategy: must be 'auto', 'mixed' or 'difference', got {strategy!r}")
        refuse_original_gamma(as_divergence(divergence), "divergence", "it has no per-example gradients")
        stan_data = self.stan_data(data, divergence)
        theta = self.check_theta(stan_data, theta_unconstrained)
        if strategy == "mixed" or (strategy == "auto" and second_order_available()):
            return self.weight_derivative_gradients(stan_data).gradients(theta, batch)
        return self._gradients_by_differences(stan_data, theta, batch, oracle)

    def weight_derivative_gradients(self, stan_data: dict) -> WeightDerivativeGradients:
        """Per-example gradients of the one robustified outcome's rows, by mixed second derivatives.

        Built once per data and divergence.

        Parameters
        ----------
        stan_data : dict
            Stan data with the divergence set (:meth:`stan_data`).

        Returns
        -------
        WeightDerivativeGradients
            Gradients of each row's loss at any point.
        """
        y = self.outcomes[0]
        key = digest(stan_data)
        if key not in self._per_example:
            self._per_example.clear()  # one data set at a time: each holds a model with its data
            self._per_example[key] = WeightDerivativeGradients(self.stan_code, stan_data, y, self.dimension(stan_data))
        return self._per_example[key]

    def langevin_target(self, stan_data: dict, oracle: str = "auto") -> LangevinTarget:
        """What :func:`robust_stan.rob_ula` needs of this robustified program with these Stan data.

        Per-example gradients by mixed second derivatives (:meth:`weight_derivative_gradients`), the prior alone
        (every weight 0) and the likelihood reweighted, all as data. Rows whose weight is 0 in ``stan_data``
        are not in the posterior (:meth:`with_row_weights`), so Rob-ULA's robust mean leaves them out; the
        others must have weight 1 (Rob-ULA has no row weights).

        Parameters
        ----------
        stan_data, oracle
            The Stan data and engine, as for :meth:`oracle_for`.

        Returns
        -------
        LangevinTarget
            The target Rob-ULA's sampler runs on.
        """
        self._require_one_outcome("the per-example gradients of rs.rob_ula, rs.select_divergence and rs.calibrate")
        y = self.outcomes[0]
        d = self.dimension(stan_data)
        row_weights = np.asarray(stan_data[f"rs_weights_{y}"], float)
        rows = np.flatnonzero(row_weights)
        if not np.all(row_weights[rows] == 1.0):
            raise RobustStanInputError(f"data: rs.rob_ula takes each row of {y!r} in (weight 1) or out (weight 0); "
                                       "it has no other row weights")

        def with_weights(weights) -> GradientOracle:  # weights of the rows in; the others stay 0
            every_row = np.zeros(len(row_weights))
            every_row[rows] = np.asarray(weights, float)
            return make_oracle(self.stan_code, dict(stan_data, **{f"rs_weights_{y}": every_row}), d, oracle)

        per_example = self.weight_derivative_gradients(stan_data)
        family = family_of_stan_name(self.likelihoods[0].family)
        return LangevinTarget(
            per_example=per_example if len(rows) == len(row_weights) else RowSubsetGradients(per_example, rows),
            prior=with_weights(np.zeros(len(rows))),
            posterior=make_oracle(self.stan_code, stan_data, d, oracle),
            weighted=with_weights,
            output=lambda: make_oracle(self.stan_code, stan_data, d, oracle),
            learning_rate=float(stan_data["rs_learning_rate"]),
            default_estimator=default_estimator(family),
        )

    def coreset_target(self, stan_data: dict, divergence: Divergence, inner: str, sampler: str,
                       unit_rows: list[np.ndarray] | None = None) -> ProgramCoresetTarget:
        """What :func:`robust_stan.coreset` needs of this robustified program with these Stan data.

        Weighted posteriors (the outcome's weights as data) and each row's gains (its pointwise
        generated quantities).

        Parameters
        ----------
        stan_data : dict
            From :meth:`stan_data`.
        divergence : Divergence
            The divergence of the coreset's target posterior.
        inner : {"beta", "classical"}
            The loss inside the coreset objective: the beta loss or the classical -log p.
        sampler : {"laplace", "nuts", "exact"}
            How a weighted posterior is drawn from.
        unit_rows : list of numpy.ndarray or None, default None
            Rows of each unit when a unit is a group of rows; None: one unit per row.

        Returns
        -------
        ProgramCoresetTarget
            The target the coreset construction runs on.
        """
        self._require_one_outcome("each observation's own loss (rs.coreset)")
        return ProgramCoresetTarget(self, stan_data, divergence, inner, sampler, unit_rows)

    def rows_of_outcome(self, stan_data: dict) -> int:
        """How many observations the (one) robustified outcome has in these Stan data.

        Parameters
        ----------
        stan_data : dict
            Stan data holding the outcome.

        Returns
        -------
        int
            The number of rows.
        """
        self._require_one_outcome("each observation's own loss (rs.coreset)")
        return len(stan_data[f"rs_weights_{self.outcomes[0]}"])

    @property
    def raw_parameter_names(self) -> list[str]:
        """The parameters' names in an engine's draws and in NUTS's starting values: the program's own
        (list of str)."""
        return list(self.parameter_names)

    def switched(self, stan_data: dict, *, learning_rate: float | None = None, weights=None,
                 divergence: Divergence | None = None, pointwise: bool | None = None) -> dict:
        """A copy of the program's Stan data with another learning rate, weights of the one outcome,
        divergence or per-observation output (robustify's switches): no new compile.

        Parameters
        ----------
        stan_data : dict
            From :meth:`stan_data`.
        learning_rate : float or None, default None
            The new w; None keeps it.
        weights : array_like or None, default None
            The new weights of the one robustified outcome (checked); None keeps them.
        divergence : Divergence or None, default None
            The new divergence; None keeps it. KL is accepted by a program as written too (a no-op).
        pointwise : bool or None, default None
            Whether robustify's per-observation quantities are computed; None keeps it.

        Returns
        -------
        dict
            The new Stan data.

        Raises
        ------
        RobustStanInputError
            If a switch other than KL is given to a program as written, or weights to a program with
            other than one outcome.
        """
        out = dict(stan_data)
        if not self.robustified:
            if learning_rate is not None or weights is not None or (
                    divergence is not None and divergence.code != DivergenceCode.KL):
                raise RobustStanInputError("model: the program is used as written (rs.from_stan); its learning "
                                           "rate, weights and divergence exist once rs.robustify has made it robust")
            return out
        if learning_rate is not None:
            out["rs_learning_rate"] = check_learning_rate(learning_rate)
        if weights is not None:
            self._require_one_outcome("weights on its rows")
            out[f"rs_weights_{self.outcomes[0]}"] = check_weights(weights, self.rows_of_outcome(stan_data))
        if divergence is not None:
            out.update(divergence_switches(divergence))
        if pointwise is not None:
            out["rs_pointwise"] = int(Pointwise.ON if pointwise else Pointwise.OFF)
        return out

    def hscore_refusal(self) -> str | None:
        """Why the H-score (:func:`robust_stan.select_divergence`) is not available: always a reason.

        Returns
        -------
        str
            robust-stan computes the H-score's y-derivatives for the built-in models' families only.
        """
        return ("its y-derivatives of log p are computed for the built-in models' families, not for a Stan "
                "program (rs.robustify)")

    def require_rows(self, argument: str, purpose: str) -> None:
        """Refuse ``purpose``, which needs the data taken apart by rows (cut, held out, replaced or
        held in partitions): the one place a program's lack of rows is refused.

        Parameters
        ----------
        argument : str
            The argument that asked for it, for the message.
        purpose : str
            What needs the rows.

        Raises
        ------
        RobustStanInputError
            Always: robust-stan does not know which of your data variables are indexed by row, or
            whether the transformed data use every row.
        """
        raise RobustStanInputError(f"{argument}: {purpose} needs the data taken apart by rows, which robust-stan does "
                                   "only for the built-in models (rs.glm, rs.location, rs.custom): it cannot tell which "
                                   "of your program's data are indexed by row, or whether its transformed data use "
                                   "every row")

    def with_row_weights(self, prepared: PreparedData, rows: np.ndarray, weights: np.ndarray,
                         divergence: Divergence) -> PreparedData:
        """The posterior in which only ``rows`` count, with ``weights``: the program on all its data,
        the other rows' weights 0 (its data cannot be cut to the rows).

        Parameters
        ----------
        prepared : PreparedData
            The data of every row.
        rows : numpy.ndarray
            0-based rows of the one robustified outcome.
        weights : numpy.ndarray
            Their weights.
        divergence : Divergence
            The loss of the new posterior.

        Returns
        -------
        PreparedData
            Ready for the program.
        """
        all_weights = np.zeros(self.rows_of_outcome(prepared.stan_data))
        all_weights[rows] = weights
        stan_data = self.switched(prepared.stan_data, weights=all_weights, divergence=divergence)
        return ProgramData(prepared.data, stan_data, prepared.scaling, divergence)

    def nuts_draws(self, stan_data: dict, settings, chain_inits: list[dict] | None) -> RawDraws:
        """NUTS draws of the program's posterior with these Stan data (robustify's per-observation
        quantities are off until a fit asks for them).

        Parameters
        ----------
        stan_data : dict
            From :meth:`stan_data`.
        settings : NutsSettings
            The run's settings.
        chain_inits : list of dict or None
            Starting values per chain, by parameter name.

        Returns
        -------
        RawDraws
            The engine's draws.
        """
        return self.compile(settings.show_progress).sample(stan_data, settings, chain_inits)

    def _require_one_outcome(self, need: str) -> None:
        """Refuse, naming ``need``, a program without exactly one robustified outcome."""
        if len(self.outcomes) != 1:
            what = (f"{len(self.outcomes)} outcomes {self.outcomes}" if self.outcomes
                    else "no robustified likelihood (make one with rs.robustify)")
            raise RobustStanInputError(f"model: {need} needs a robustified program with exactly one likelihood "
                                       f"outcome; this one has {what}")

    def _gradients_by_differences(self, stan_data: dict, theta: np.ndarray, batch, oracle: str) -> np.ndarray:
        y = self.outcomes[0]
        n = len(stan_data[f"rs_weights_{y}"])
        rows = np.arange(n) if batch is None else np.asarray(batch, dtype=int).ravel()
        if rows.size and (rows.min() < 0 or rows.max() >= n):
            raise RobustStanInputError(f"batch: rows must lie in 0..{n - 1}")
        zero = dict(stan_data, **{f"rs_weights_{y}": np.zeros(n)})
        base = make_oracle(self.stan_code, zero, theta.size, oracle).gradient(theta, jacobian=True)
        out = np.empty((rows.size, theta.size))
        for k, row in enumerate(rows):  # the dimension is known: no digest of the data per row
            one_hot = np.zeros(n)
            one_hot[row] = 1.0
            with_row = dict(zero, **{f"rs_weights_{y}": one_hot})
            out[k] = base - make_oracle(self.stan_code, with_row, theta.size, oracle).gradient(theta, jacobian=True)
        return out

    # -- what its fits read (robust_stan.results.fits.model_view.FittedModel) -------------------------------
    def posterior_draws(self, raw: RawDraws, prepared: PreparedData) -> dict[str, np.ndarray]:
        """Every parameter, transformed parameter and generated quantity of the program, without
        robustify's per-observation quantities and weight parameters.

        Parameters
        ----------
        raw : RawDraws
            An engine's output for this program.
        prepared : PreparedData
            The run's data.

        Returns
        -------
        dict
            Variable name -> (chains, draws, ...).
        """
        return {name: values for name, values in raw.variables.items() if not name.startswith(_POINTWISE_PREFIXES)}

    def posterior_dims(self, posterior: Mapping[str, np.ndarray]) -> dict[str, list[str]]:
        """ArviZ's default dims (``<name>_dim_<k>``) for every variable: an empty dict.

        Parameters
        ----------
        posterior : mapping
            The posterior draws by name.

        Returns
        -------
        dict
            Empty.
        """
        return {}

    def posterior_coords(self, prepared: PreparedData) -> dict[str, list[str]]:
        """No named coordinates: an empty dict (ArviZ counts every axis 0..n-1).

        Parameters
        ----------
        prepared : PreparedData
            The run's data.

        Returns
        -------
        dict
            Empty.
        """
        return {}

    def summary_labels(self, posterior: Mapping[str, np.ndarray], prepared: PreparedData) -> dict[str, list]:
        """The parameters block's variables, each element labelled ``name[i,j]`` counted from 1.

        Parameters
        ----------
        posterior : mapping
            The posterior draws by name.
        prepared : PreparedData
            The run's data.

        Returns
        -------
        dict
            Variable name -> list of labels.
        """
        return {name: named_element_labels(name, np.shape(posterior[name])[2:]) for name in self.parameter_names}

    def predictions(self, posterior, prepared: PreparedData, new_data, kind: str, new_levels: str,
                    seed: int | None):
        """Refused: a program's predictions are its own generated quantities.

        Parameters
        ----------
        posterior, prepared, new_data, kind, new_levels, seed
            As for :meth:`robust_stan.Model.predictions`.

        Raises
        ------
        RobustStanInputError
            Always.
        """
        raise RobustStanInputError("fit.predict: predictions for new rows are offered for rs.glm models; for your "
                                   "own program, write them as generated quantities and run them on the draws")

    def observed_outcomes(self, prepared: PreparedData) -> list[Outcome]:
        """The data variables of the likelihood statements, dims ``<y>_obs`` (and ``<y>_dim_<k>``),
        with the weights of the robustified ones. A two-dimensional outcome whose elements are its
        observations is flattened row after row, as its weights and log_lik are.

        Parameters
        ----------
        prepared : PreparedData
            The run's data.

        Returns
        -------
        list of Outcome
            One per observed data variable.
        """
        out = []
        for y in self.observed:
            values = self._observed_values(y, prepared.stan_data)
            if values is None:  # computed in transformed data: no values here
                weights = prepared.stan_data.get(f"rs_weights_{y}")
                out.append(Outcome(y, None, [f"{y}_obs"], None if weights is None else np.asarray(weights),
                                   f"weights_{y}"))
                continue
            dims = [f"{y}_obs"] + [f"{y}_dim_{k}" for k in range(1, values.ndim)]
            weights = np.asarray(prepared.stan_data[f"rs_weights_{y}"]) if y in self.outcomes else None
            out.append(Outcome(y, values, dims, weights, f"weights_{y}"))
        return out

    def generated_quantities(self, raw: RawDraws, prepared: PreparedData, seed: int,
                             divergence: Divergence | None = None, y_score: bool = False) -> dict:
        """``log_lik`` and ``robust_loss`` of the one robustified outcome at every draw of ``raw``.

        Parameters
        ----------
        raw : RawDraws
            The draws.
        prepared : PreparedData
            The run's data.
        seed : int
            Stan's RNG seed for the program's generated quantities.
        divergence : Divergence or None, default None
            The divergence of ``robust_loss``; None is the run's own.
        y_score : bool, default False
            Not available for programs (the derivatives in y are the built-in families').

        Returns
        -------
        dict
            ``log_lik`` and ``robust_loss``, each (chains, draws, n).
        """
        self._require_one_outcome("each observation's own loss (generated_quantities_at)")
        if y_score:
            raise RobustStanInputError("y_score: the derivatives of log p in y are computed for the built-in "
                                       "models' families, not for your own program")
        y = self.outcomes[0]
        computed = self._robust_quantities(raw, prepared.stan_data, seed, divergence)
        return {"log_lik": computed[f"rs_log_lik_{y}"], "robust_loss": computed[f"rs_robust_loss_{y}"]}

    def _robust_quantities(self, raw: RawDraws, stan_data: dict, seed: int,
                           divergence: Divergence | None = None) -> dict:
        """robustify's per-observation quantities at every draw (one engine call per chain)."""
        data = self.switched(stan_data, pointwise=True, divergence=divergence)
        parameters = parameter_columns(raw.variables, self.parameter_names)
        return self.compile().generated_quantities(data, parameters, seed, raw.backend)

    def pointwise_draws(self, raw: RawDraws, prepared: PreparedData, seed: int) -> dict[str, dict[str, np.ndarray]]:
        """``log_lik`` and ``robust_loss`` of each robustified outcome (or the program's own
        ``log_lik``), and ``y_rep`` from a generated quantity ``<outcome>_rep`` of the outcome's shape.

        Parameters
        ----------
        raw, prepared, seed
            As for :meth:`generated_quantities`.

        Returns
        -------
        dict
            Kind -> {outcome: (chains, draws, n, ...)}.
        """
        posterior = self.posterior_draws(raw, prepared)
        pointwise: dict[str, dict[str, np.ndarray]] = {"log_lik": {}, "robust_loss": {}}
        if self.outcomes:
            computed = self._robust_quantities(raw, prepared.stan_data, seed)
            pointwise = {kind: {y: computed[f"rs_{kind}_{y}"] for y in self.outcomes}
                         for kind in ("log_lik", "robust_loss")}
            for y, values in pointwise["log_lik"].items():
                never = np.flatnonzero(np.all(np.isnan(values), axis=(0, 1)))
                if never.size:
                    rows = [int(r) for r in never[:5]]
                    warnings.warn(f"the likelihood statement of {y!r} never reached rows {rows}"
                                  f"{' ...' if never.size > 5 else ''} (0-based; e.g. a loop over part of the "
                                  "rows): their log_lik is NaN and their weights do nothing", RobustStanWarning,
                                  stacklevel=5)
        elif "log_lik" in posterior:
            pointwise["log_lik"] = {self._log_lik_name(posterior["log_lik"], prepared.stan_data): posterior["log_lik"]}
        shapes = {y: np.shape(prepared.stan_data[y]) for y in self.observed if y in prepared.stan_data}
        pointwise["y_rep"] = {y: posterior[f"{y}_rep"] for y in shapes
                              if f"{y}_rep" in posterior and posterior[f"{y}_rep"].shape[2:] == shapes[y]}
        return pointwise

    def log_lik_of_rows(self, raw: RawDraws, prepared: PreparedData, rows: np.ndarray, seed: int) -> np.ndarray:
        """log p(y_i | theta) of some rows of the one robustified outcome at every draw, whatever their
        weights in ``prepared`` (held-out rows are scored this way).

        Parameters
        ----------
        raw : RawDraws
            The draws.
        prepared : PreparedData
            Data of every row.
        rows : numpy.ndarray
            0-based rows.
        seed : int
            Stan's RNG seed for the program's generated quantities.

        Returns
        -------
        numpy.ndarray
            (chains, draws, len(rows)), NaN at draws that are not finite.
        """
        self._require_one_outcome("each observation's own log density (held-out rows)")
        y = self.outcomes[0]
        return self._robust_quantities(raw, prepared.stan_data, seed)[f"rs_log_lik_{y}"][..., np.asarray(rows)]

    def _log_lik_name(self, log_lik: np.ndarray, stan_data: dict) -> str:
        """A program's own ``log_lik`` is named after its outcome when there is one outcome with
        as many rows (as the built-in models' log_likelihood is, and ArviZ's LOO-PIT expects)."""
        y = self.observed[0] if len(self.observed) == 1 else None
        if y in stan_data and log_lik.shape[2:] == np.shape(stan_data[y])[:1]:
            return self.observed[0]
        return "log_lik"

    # -- starting points ---------------------------------------------------------------------
    def inits_at(self, thetas, stan_data: dict, scaling: Scaling | None = None,
                 oracle: GradientOracle | None = None) -> list[dict]:
        """Each unconstrained point as the program's parameters by name, as :meth:`sample` takes them.

        Parameters
        ----------
        thetas : array_like
            Unconstrained points, one per row.
        stan_data : dict
            From :meth:`stan_data`.
        scaling : Scaling or None, default None
            Unused: a program's outcome is fitted in its own units (the argument matches
            :meth:`robust_stan.Model.inits_at`).
        oracle : GradientOracle or None, default None
            An oracle of these Stan data already built; None builds one.

        Returns
        -------
        list of dict
            One dict of constrained values per point.
        """
        oracle = self.oracle_for(stan_data) if oracle is None else oracle
        out = []
        for theta in np.atleast_2d(thetas):
            values = oracle.constrain(theta, include_gqs=False)
            out.append({name: values[name] for name in self.parameter_names})
        return out

    def chain_inits(self, inits, chains: int, scaling: Scaling | None = None) -> list[dict] | None:
        """Starting values by parameter name, one dict per chain, checked against the parameters.

        Parameters
        ----------
        inits : dict, list of dict or None
            Constrained values by parameter name, one dict for all chains or one per chain; None
            stays None.
        chains : int
            Number of chains.
        scaling : Scaling or None, default None
            Unused: a program's outcome is fitted in its own units.

        Returns
        -------
        list of dict or None
            One dict per chain.
        """
        return require_inits(inits, chains, self.parameter_names)

    def unconstrain_init(self, init: Mapping, stan_data: dict, scaling: Scaling | None = None) -> np.ndarray:
        """Every parameter's value by name as an unconstrained vector.

        Parameters
        ----------
        init : mapping
            Every parameter's value by name (constrained).
        stan_data : dict
            From :meth:`stan_data`.
        scaling : Scaling or None, default None
            Unused: a program's outcome is fitted in its own units.

        Returns
        -------
        numpy.ndarray
            The unconstrained point.

        Raises
        ------
        RobustStanInputError
            If a parameter is missing.
        """
        checked = require_inits(init, 1, self.parameter_names, every=True)
        assert checked is not None  # init is a mapping here
        return self.compile().unconstrain(stan_data, checked[0])

    def variational_on_partitions(self, data, divergence, learning_rate, weights, family, method, draws, seed,
                                  show_progress, inits, cluster, options):
        """Refused: a program's rows cannot be held in partitions (:meth:`require_rows`).

        Parameters
        ----------
        data, divergence, learning_rate, weights, family, method, draws, seed, show_progress, inits, cluster, options
            As for :meth:`variational`.

        Raises
        ------
        RobustStanInputError
            Always.
        """
        self.require_rows("data", "rows held in partitions")


_INCLUDE = re.compile(r"^\s*#include\s*[<\"]?([^>\"\s]+)", re.MULTILINE)


def _compilable_text(code: str, filename: str, include_dirs: tuple[str, ...]) -> str:
    """The program as written, or its canonical form when it includes files other than the
    robust-stan library (the engines are given only the library's folder)."""
    if all(name == LIBRARY_FILE for name in _INCLUDE.findall(code)):
        return code
    return canonical_program(code, filename, include_dirs)


def from_stan(stan_file_or_code, engine: str = "auto") -> StanProgramModel:
    """Your Stan program as a robust-stan model, as written.

    It gets NUTS, robust-stan's VI, log densities and ArviZ output (a ``log_lik`` generated
    quantity becomes the log_likelihood group). The robust-stan library is on the include path
    (``#include robust_stan.stanfunctions``); stanc checks the program at once, and its errors
    name your file and line.

    Parameters
    ----------
    stan_file_or_code : str or path-like
        A path to a .stan file or the program's text.
    engine : str, default "auto"
        "cmdstan" or "httpstan"; "auto" takes $ROBUST_STAN_ENGINE, else the one installed.

    Returns
    -------
    StanProgramModel
        Your program as written, compiled when first needed.

    Raises
    ------
    StanCompileError
        If stanc rejects the program.
    """
    code, filename, include_dirs = _read_source(stan_file_or_code)
    info = program_info(code, filename, include_dirs)
    observed = likelihood_outcomes(canonical_program(code, filename, include_dirs), info)
    return StanProgramModel(_compilable_text(code, filename, include_dirs), info, filename, engine,
                            observed=observed)


def robustify(stan_file_or_code, likelihood="auto", engine: str = "auto") -> StanProgramModel:
    """An ordinary Stan program with its likelihood made robust.

    Every ``y ~ family(...)`` and ``target += family_lpdf(y | ...)`` (also ``_lupdf``, ``_lpmf``,
    ``_lupmf``) whose outcome ``y`` is a data variable becomes ``target += rs_learning_rate *
    robust_<family>_weighted_lpdf(y | ..., rs_divergence, rs_divergence_param, rs_weights_y)``,
    and the generated quantities gain ``rs_log_lik_y`` and ``rs_robust_loss_y`` (filled on
    demand). Everything else stays as written. Supported: normal, normal_id_glm, student_t,
    cauchy, exponential, bernoulli(_logit)(_glm), binomial(_logit), poisson(_log)(_glm),
    categorical(_logit), multi_normal(_cholesky); the outcome whole (vectorised) or one element
    per loop iteration. With ``divergence=rs.KL()`` the log density is the original's plus a
    constant. Vectorised normal, bernoulli(_logit) and poisson(_log) likelihoods take the native
    C++ beta and gamma losses. The rewritten program (``model.stan_code``) runs under plain
    CmdStan with :func:`robust_stan.stan_include_path` on the include path and, when it includes
    the native losses, ``user_header=robust_stan.native_header_path()``.

    Parameters
    ----------
    stan_file_or_code : str or path-like
        A path to a .stan file or the program's text.
    likelihood : "auto", str or list of str, default "auto"
        The outcomes whose likelihood statements are rewritten; "auto" is every data variable
        with one.
    engine : str, default "auto"
        "cmdstan" or "httpstan"; "auto" takes $ROBUST_STAN_ENGINE, else the one installed.

    Returns
    -------
    StanProgramModel
        The rewritten program (``stan_code`` shows it), built when first needed.

    Raises
    ------
    RobustStanInputError
        If a likelihood statement cannot be rewritten (the message gives the statement, its line
        and the reason) or ``likelihood`` names no such outcome.
    StanCompileError
        If stanc rejects the program.
    """
    code, filename, include_dirs = _read_source(stan_file_or_code)
    info = program_info(code, filename, include_dirs)
    # the library is included once by the rewrite; a program that includes it already keeps its other text
    without_library = re.sub(rf"^\s*#include\s*[<\"]?{re.escape(LIBRARY_FILE)}[>\"]?\s*$", "", code, flags=re.MULTILINE)
    canonical = canonical_program(without_library, filename, include_dirs)
    rewritten = robustify_program(code, canonical, info, likelihood, filename)
    try:
        rewritten_info = program_info(rewritten.stan_code, filename, include_dirs)
    except StanCompileError as exc:
        statements = "; ".join(f"line {lik.line}: `{lik.statement}`" for lik in rewritten.likelihoods)
        raise RobustifyError(f"{filename}: the rewritten likelihood ({statements}) does not compile; an argument "
                             "may have a type the robust-stan library does not take (a real or a vector per "
                             "argument; binomial trials as an int array). stanc's message below refers to lines of "
                             f"the rewritten program:\n{exc}") from None
    if rewritten.without_prior:
        names = ", ".join(rewritten.without_prior)
        warnings.warn(f"{filename}: the parameter(s) {names} get no prior statement and have an unbounded support, so "
                      "their prior is flat and improper. Under KL the likelihood may still make the posterior "
                      "proper, but a beta or gamma loss is bounded and cannot: the posterior is then improper and "
                      "the draws wander off. Give each a prior (e.g. `sigma ~ exponential(1);`) or bounds "
                      "(`real<lower=-20, upper=20> alpha;`).", RobustStanWarning, stacklevel=2)
    return StanProgramModel(rewritten.stan_code, rewritten_info, filename, engine, rewritten.likelihoods)
